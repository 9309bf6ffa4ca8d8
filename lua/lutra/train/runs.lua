-- lutra.train.runs — the runs of a run directory: each run (a start from step 1, or a start
-- that no checkpoint continues) gets a directory of its own, and `latest` points at the newest.
--
--   RUN_DIR/runs/20261204-163005/   metrics.jsonl, events.out.tfevents.*, samples.txt, trace.json
--   RUN_DIR/latest -> runs/20261204-163005
--
-- A resumed run keeps its id (saved in each checkpoint) and appends to its own directory, so
-- that a run's history reads as one, and an earlier run's records are never overwritten.
-- TensorBoard pointed at RUN_DIR lists each run under its id.
--
--   local runs = require "lutra.train.runs"
--   local id, path = runs.open(run_dir, id_or_nil)   -- a new id when nil; latest -> it
--   runs.latest(run_dir)                             -- the newest run's directory, or nil
--   runs.valid_id(id)                                -- an id a file may carry (no "/", no "..")
local lt = require "lutra.ffi"
local files = require "lutra.ckpt.files"
local errors = require "lutra.errors"
local checks = require "lutra.ckpt.checks"
local ffi = lt.ffi

local M = {}

pcall(ffi.cdef, "int symlink(const char *target, const char *linkpath);")
pcall(ffi.cdef, "int unlink(const char *path);")
pcall(ffi.cdef, "int getpid(void);")
pcall(ffi.cdef, "char *strerror(int errnum);")

M.valid_id = checks.valid_run_id -- a name for a directory under runs/ (no "/", no "..")

local function taken(path) return files.is_link(path) or files.exists(path) or files.is_dir(path) end

-- A fresh id: the UTC time of the start, "-2", "-3"... when that directory is taken.
local function new_id(root)
  local base = os.date("!%Y%m%d-%H%M%S")
  local id, n = base, 1
  while taken(root .. "/" .. id) do
    n = n + 1
    id = base .. "-" .. n
  end
  return id
end

-- Points RUN_DIR/latest at runs/ID: a link made beside it and renamed over it, so that a reader
-- sees the old link or the new one. A directory or file of that name (not a link) is left alone
-- and said on stderr: it is not ours to remove.
local function point_latest(run_dir, id)
  local latest = run_dir .. "/latest"
  if not files.is_link(latest) and (files.is_dir(latest) or files.exists(latest)) then
    io.stderr:write("lutra: ", latest, " is not a link; it is left alone and not pointed at run ", id, "\n")
    return
  end
  local tmp = string.format("%s/.latest.%d.tmp", run_dir, ffi.C.getpid())
  ffi.C.unlink(tmp)
  local ok = ffi.C.symlink("runs/" .. id, tmp) == 0
  local err = not ok and ffi.string(ffi.C.strerror(ffi.errno())):lower()
  if ok then
    local renamed, rename_err = os.rename(tmp, latest)
    if not renamed then
      ffi.C.unlink(tmp)
      ok, err = false, tostring(rename_err)
    end
  end
  if not ok then io.stderr:write("lutra: cannot point ", latest, " at runs/", id, ": ", err, "\n") end
end

-- Opens the run `id` (nil: a new one) under run_dir: makes runs/ID, points latest at it, and
-- returns id and the run's directory. A runs/ID that is a link (planted there) is not written
-- through: the run gets a new id, and says so.
function M.open(run_dir, id)
  local root = run_dir .. "/runs"
  if files.is_link(root) then
    errors.raise(root .. " is a symbolic link: refused (a run writes its records only inside run_dir)")
  end
  files.mkdir_p(root)
  if id ~= nil and files.is_link(root .. "/" .. id) then
    io.stderr:write("lutra: ", root, "/", id, " is a symbolic link: this run's records go to a new run directory\n")
    id = nil
  end
  id = id or new_id(root)
  local path = root .. "/" .. id
  files.mkdir_p(path)
  point_latest(run_dir, id)
  return id, path
end

-- The directory of the newest run of run_dir (where latest points, else the last id in
-- order), or nil when it has none.
function M.latest(run_dir)
  local latest = run_dir .. "/latest"
  if files.is_dir(latest) then return latest end
  local ids = M.list(run_dir)
  return ids[#ids] and run_dir .. "/runs/" .. ids[#ids] or nil
end

-- The ids under run_dir/runs, oldest first (ids sort by their start time).
function M.list(run_dir)
  local ids = {}
  local d = ffi.C.opendir(run_dir .. "/runs")
  if d == nil then return ids end
  while true do
    local e = ffi.C.readdir(d)
    if e == nil then break end
    local name = ffi.string(ffi.cast("struct lt_ckpt_dirent *", e).d_name)
    if M.valid_id(name) and files.is_dir(run_dir .. "/runs/" .. name) then ids[#ids + 1] = name end
  end
  ffi.C.closedir(d)
  table.sort(ids)
  return ids
end

return M
