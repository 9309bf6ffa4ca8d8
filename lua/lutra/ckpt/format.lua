-- lutra.ckpt.format — saving a sharded checkpoint: one lz4-framed file per rank, a manifest,
-- atomic (temp dir, fsync, rename, `latest` replaced) and optionally in the background.
--
--   local ckpt = require "lutra.ckpt"
--   ckpt.save("runs/x/ckpt/step_000200", {
--     step = 200, layout = {dp = 2, tp = 2, pp = 1, zero = 1}, config = cfg,
--     tensors = {{name = "wte.weight", tensor = w}, {name = "optim.wte.weight.exp_avg", tensor = m}, ...},
--     extra = {rng = ..., loader = ..., schedule = ...},   -- this rank's plain Lua state (JSON)
--     files = {["tokenizer.json"] = "runs/x/tokenizer.json"}, -- copied in by rank 0
--   }, {world = group, async = true, keep = 3})
--   ckpt.wait()   -- the previous async save is committed (or its error raised)
--
-- A checkpoint is the directory DIR:
--   manifest.json        {format = "lutra-checkpoint", version = 1, step, layout, world, config,
--                         files = {"rank_00000.lz4", ...}, extra = {"extra_rank_00000.json", ...},
--                         tensors = {{name, dtype, shape (global), pieces = {{file (0-based index
--                         into files), index (piece in that file), offset, shape, bytes}}}},
--                         bytes (raw total), copied = {names of files copied in}, kind (state.kind:
--                         what wrote it; "train" for the trainer, whose checkpoints verify checks
--                         against its schema, lutra.ckpt.checks)}
--   rank_%05d.lz4        the pieces this rank owns: lz4 frames + a footer with each piece's
--                        frame offset, compressed and raw size and checksum (lutra.h)
--   extra_rank_%05d.json each rank's `extra`
-- Which rank writes which box, and the errors every rank agrees on: lutra.ckpt.plan.
-- Rank 0's writer thread commits: when every rank's file has appeared (each is fsync'ed and
-- renamed into place by its writer), it writes the manifest, fsyncs, renames DIR.tmp to DIR
-- and replaces RUN/latest. A crash at any point leaves the previous checkpoint as it was.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local json = require "lutra.json"
local create = require "lutra.create"
local ckpt_files = require "lutra.ckpt.files"
local planner = require "lutra.ckpt.plan"
require "lutra.tensor" -- the tensor metatype (methods, properties) for what this module makes
local ffi, C = lt.ffi, lt.C

local M = {}
local fail, raise = errors.fail, errors.raise

M.FORMAT, M.VERSION = "lutra-checkpoint", 1
local DTYPE_SIZE = {f32 = 4, f64 = 8, bf16 = 2, f16 = 2, i32 = 4, i64 = 8, u8 = 1, bool = 1}
M.DTYPE_SIZE = DTYPE_SIZE

local function rank_file(r) return string.format("rank_%05d.lz4", r) end
local function extra_file(r) return string.format("extra_rank_%05d.json", r) end
M.rank_file, M.extra_file = rank_file, extra_file

-- ---- the async writer ----------------------------------------------------------------------

local pending -- {job =, rank0 =, parent =, keep =, dir =}

local function finish(p, ok)
  local rc = C.lt_ckpt_job_wait(p.job)
  local raw, comp, secs = ffi.new("int64_t[1]"), ffi.new("int64_t[1]"), ffi.new("double[1]")
  C.lt_ckpt_job_stats(p.job, raw, comp, secs)
  local msg = rc ~= 0 and ffi.string(C.lt_last_error()) or nil
  ffi.gc(p.job, nil)
  C.lt_ckpt_job_free(p.job)
  M.last = {dir = p.dir, raw = tonumber(raw[0]), compressed = tonumber(comp[0]), seconds = secs[0],
            stall = p.stall, copied = p.copied}
  if rc ~= 0 then raise("ckpt.save: " .. p.dir .. ": " .. msg) end
  if p.rank0 and p.keep and ok ~= false then M.prune(p.parent, p.keep) end
  return p.dir
end

-- Blocks until the previous async save is committed; its directory (nil when none). Raises
-- its error.
-- Returns once the background save has taken its copy of the state: from then on the
-- tensors it saves may change (the trainer calls it before each optimizer step). Cheap when
-- no save is pending. The time spent here is added to the save's stall.
function M.fence()
  local p = pending
  if not p or not p.sources then return end
  local t0 = C.lt_wall_time()
  C.lt_ckpt_job_wait_copied(p.job)
  p.sources = nil
  p.stall = (p.stall or 0) + (C.lt_wall_time() - t0)
end

function M.wait()
  local p = pending
  if not p then return nil end
  pending = nil
  return finish(p)
end

-- Whether a background save is still running.
function M.busy()
  if not pending then return false end
  local done = ffi.new("int[1]")
  C.lt_ckpt_job_poll(pending.job, done)
  return done[0] == 0
end

-- Whether dir holds a checkpoint this lutra reads: its manifest.json parses and names this format
-- and version. Pruning removes only those: a checkpoint it cannot read (damaged, or written by a
-- newer lutra) may be someone's only copy, and is left for a person to look at.
local function readable(dir)
  local text = ckpt_files.read(dir .. "/manifest.json")
  if not text then return false end
  local ok, m = pcall(json.decode, text)
  return ok and type(m) == "table" and m.format == M.FORMAT and m.version == M.VERSION
end

-- The step dirs of root to remove so that the `keep` newest readable ones stay, by step: the one
-- `latest` names stays, as does `first` (a save about to commit, which latest will name; readable
-- by construction), and an unreadable one is never removed nor counted.
local function prunable(root, keep, first)
  local steps = ckpt_files.steps(root) -- newest first
  local named = first or (ckpt_files.read(root .. "/latest") or ""):match("^%s*(.-)%s*$")
  if first then
    local present = false
    for _, s in ipairs(steps) do present = present or s.name == first end
    if not present then
      steps[#steps + 1] = {step = tonumber(first:match("^step_(%d+)$")) or math.huge, name = first}
      table.sort(steps, function(a, b) return a.step > b.step end)
    end
  end
  local kept, out = 0, {}
  for _, s in ipairs(steps) do
    if s.name == first or readable(root .. "/" .. s.name) then
      kept = kept + 1
      if kept > keep and s.name ~= named then out[#out + 1] = root .. "/" .. s.name end
    end
  end
  return out
end

-- Keeps the `keep` newest readable step_* checkpoints under root (and the one `latest` names, and
-- every one it cannot read); also removes leftovers of interrupted saves (*.tmp, *.old-*, the
-- temporaries of `latest`), except a save still in flight.
function M.prune(root, keep)
  if type(root) ~= "string" then raise("ckpt.prune: root must be a path string") end
  root = root:gsub("/+$", "")
  if keep and keep > 0 then
    for _, dir in ipairs(prunable(root, keep)) do ckpt_files.remove_checkpoint(dir) end
  end
  if not M.busy() then
    for _, name in ipairs(ckpt_files.list(root)) do
      if name:match("^step_%d+%.tmp$") or name:match("^step_%d+%.old%-%d+$") or name:match("^latest%.tmp%.%x+$") then
        ckpt_files.remove_tree(root .. "/" .. name)
      end
    end
  end
end

-- ---- save: the steps ------------------------------------------------------------------------

local function step_dir_check(dir)
  if type(dir) ~= "string" or dir == "" then raise("ckpt.save: dir must be a path string") end
  return (dir:gsub("/+$", ""))
end

-- the crash tests' fault points (LUTRA_FAULT): a hook of host/io/ckpt.h, not of the C API
ffi.cdef "int lt_ckpt_fault(const char *point);"
local function fault(point) C.lt_ckpt_fault(point) end

local box_key = planner.box_key

-- Everything that can fail on this rank's input, before any collective or file: this rank's
-- plan, its extra state as JSON and (rank 0) the files to copy in, sorted by name.
local function prepare(state, rank)
  local pre = {plan = planner.local_plan(state.tensors or {}), files = {}}
  if state.extra ~= nil and type(state.extra) ~= "table" then raise("ckpt.save: state.extra must be a table") end
  if state.kind ~= nil and type(state.kind) ~= "string" then raise("ckpt.save: state.kind must be a string") end
  pre.extra_text = json.encode(state.extra or {})
  if rank == 0 then
    json.encode({config = state.config, layout = state.layout}) -- encodable: the manifest's parts
    for name, src in pairs(state.files or {}) do
      if type(name) ~= "string" or name:find("/") or name:match("^rank_") or name:match("^extra_rank_")
        or name == "manifest.json" then
        raise("ckpt.save: state.files keys must be plain file names, got " .. tostring(name))
      end
      local text, err = ckpt_files.read(src)
      if not text then raise("ckpt.save: cannot read " .. tostring(src) .. " (state.files." .. name .. "): " .. tostring(err)) end
      pre.files[#pre.files + 1] = {name = name, text = text}
    end
    table.sort(pre.files, function(a, b) return a.name < b.name end)
  end
  return pre
end

-- This rank's prepared input and every rank's plan (index rank + 1). In a group a rank's bad
-- input becomes every rank's error, so that none waits in a collective.
local function prepare_and_gather(state, group, rank, world)
  if not group then
    local pre = prepare(state, rank)
    return pre, {pre.plan}
  end
  local ok, res = pcall(prepare, state, rank)
  local texts = planner.gather_texts(group, ok and planner.plan_text(res.plan) or ("ERR:" .. tostring(res)))
  local plans = {}
  for r = 1, world do
    if texts[r]:sub(1, 4) == "ERR:" then
      raise(string.format("ckpt.save: rank %d: %s", r - 1, (texts[r]:sub(5):gsub("^[^:]*:%d+: ", ""))))
    end
    plans[r] = json.decode(texts[r])
  end
  plans[rank + 1] = res.plan
  return res, plans
end

-- Rank 0 makes the empty temporary directory tmp; in a group every rank raises when it could not.
local function make_tmp_dir(group, rank, dir, parent, tmp)
  local made, why = true, nil
  if rank == 0 then
    made, why = pcall(function()
      ckpt_files.mkdir_p(parent)
      ckpt_files.remove_tree(tmp)
      ckpt_files.mkdir_p(tmp)
    end)
  end
  if group then
    local flag = create.tensor({made and 0 or 1}, {dtype = "i32"})
    group:all_reduce(flag, "max")
    if flag:item() ~= 0 and made then raise("ckpt.save: " .. dir .. ": rank 0 could not create " .. tmp) end
  end
  if not made then raise("ckpt.save: " .. dir .. ": " .. (tostring(why):gsub("^[^\n]-:%d+: ", ""))) end
end

-- The job that writes this rank's file into tmp, with its extra state and (rank 0) the copied
-- files; returns the job and the names copied in.
local function new_job(tmp, rank, pre, opts)
  local jp = ffi.new("lt_ckpt_job*[1]")
  if C.lt_ckpt_job_new(jp, tmp .. "/" .. rank_file(rank), (opts.chunk_mb or 4) * 1048576, opts.level or 0) ~= 0 then
    fail()
  end
  local job = ffi.gc(jp[0], C.lt_ckpt_job_free)
  -- compression threads: all for a save the training waits for; one in the background by
  -- default (the training loop keeps its cores; opts.threads to give it more)
  if C.lt_ckpt_job_threads(job, opts.threads or (opts.async and 1 or 0)) ~= 0 then fail() end
  local function add_file(name, text)
    if C.lt_ckpt_job_add_file(job, tmp .. "/" .. name, text, #text) ~= 0 then fail() end
  end
  add_file(extra_file(rank), pre.extra_text)
  local copied = {}
  for _, f in ipairs(pre.files) do
    add_file(f.name, f.text)
    copied[#copied + 1] = f.name
  end
  return job, copied
end

-- This rank's pieces into its job, in plan order; returns the views the job reads (they stay
-- alive until it copied them) and their bytes.
local function add_pieces(job, plan, boxes, rank, opts)
  local keep_alive, n_own, copied_bytes = {}, 0, 0
  for _, p in ipairs(plan) do
    local b = boxes[box_key(p)]
    if b.owner == rank and b.index == nil then
      local v = ckpt_files.box_view(p.tensor, p.local_offset, p.shape)
      if v.device ~= "cpu" then v = v:cpu() end
      if C.lt_is_contiguous(v) == 0 then v = v:contiguous() end
      local nbytes = v:numel() * v:element_size()
      local shuffle = opts.shuffle ~= false and v:element_size() or 0
      -- async: the writer thread copies first, while training goes on (M.fence before the
      -- sources change); opts.defer = false copies here, before save returns
      local copy = opts.async and (opts.defer == false and 1 or 2) or 0
      if C.lt_ckpt_job_add(job, C.lt_data_ptr(v), nbytes, shuffle, copy) ~= 0 then fail() end
      if copy == 2 and C.lt_ckpt_job_hold(job, v) ~= 0 then fail() end -- alive until copied
      keep_alive[#keep_alive + 1] = v
      b.index, n_own = n_own, n_own + 1
      copied_bytes = copied_bytes + nbytes
    end
  end
  return keep_alive, copied_bytes
end

-- Every rank numbers the other ranks' pieces the same way (plan order on their owner).
local function number_pieces(plans, boxes, rank, world)
  local next_index = {}
  for r = 1, world do
    for _, p in ipairs(plans[r]) do
      local b = boxes[box_key(p)]
      if b.owner == r - 1 and b.file == nil then
        b.file = r - 1
        if b.owner ~= rank then
          b.index = next_index[r] or 0
          next_index[r] = b.index + 1
        end
      end
    end
  end
end

-- The manifest's text (rank 0). The tensors' part by hand: json.encode's generality costs a
-- millisecond per 100 tensors, and this runs on the training thread.
local function manifest_text(state, tensors, world, copied)
  local files, extras, mt, bytes = {}, {}, {}, 0
  for r = 0, world - 1 do files[r + 1], extras[r + 1] = rank_file(r), extra_file(r) end
  local enc, concat, fmt = json.encode_string, table.concat, string.format
  for i, t in ipairs(tensors) do
    local pieces = {}
    for k, b in ipairs(t.pieces) do
      local nb = ckpt_files.numel(b.shape) * DTYPE_SIZE[t.dtype]
      pieces[k] = fmt('{"bytes":%d,"file":%d,"index":%d,"offset":[%s],"shape":[%s]}', nb, b.file, b.index,
        concat(b.offset, ","), concat(b.shape, ","))
      bytes = bytes + nb
    end
    mt[i] = fmt('{"dtype":"%s","name":%s,"pieces":[%s],"shape":[%s]}', t.dtype, enc(t.name), concat(pieces, ","),
      concat(t.shape, ","))
  end
  local manifest = {format = M.FORMAT, version = M.VERSION, step = state.step or 0, layout = state.layout or {},
                    world = world, config = state.config, files = json.array(files), extra = json.array(extras),
                    copied = json.array(copied), tensors = "@TENSORS@", bytes = bytes, kind = state.kind,
                    saved_at = os.date("!%Y-%m-%dT%H:%M:%SZ")}
  local text = json.encode(manifest)
  local at, stop = text:find('"tensors":"@TENSORS@"', 1, true)
  return text:sub(1, at - 1) .. '"tensors":[' .. concat(mt, ",") .. "]" .. text:sub(stop + 1)
end

-- Keeping the newest `keep` readable step dirs of parent, dir (this save) first: the job removes
-- the older ones after its commit (see prunable).
local function schedule_prune(job, dir, parent, keep)
  for _, old in ipairs(prunable(parent, keep, ckpt_files.basename(dir))) do
    if C.lt_ckpt_job_remove_after(job, old) ~= 0 then fail() end
  end
end

-- Rank 0's commit: the arguments of lt_ckpt_commit. Async (or alone) the writer thread commits
-- once every file is there, and prunes; a synchronous group save commits after the ranks agree
-- that every file was written (run_sync).
local function plan_commit(job, dir, parent, text, world, group, opts)
  local tmp = dir .. ".tmp"
  local latest = opts.latest ~= false and (parent .. "/latest") or nil
  local commit_args = {tmp, dir, text, world, latest, latest and (ckpt_files.basename(dir) .. "\n") or nil, opts.timeout or 600}
  local in_writer = opts.async or not group
  if in_writer and C.lt_ckpt_job_commit(job, unpack(commit_args)) ~= 0 then fail() end
  if opts.keep and opts.keep > 0 and in_writer then schedule_prune(job, dir, parent, opts.keep) end
  return commit_args
end

-- Runs the job here; in a group every rank learns whether every file was written, then
-- whether rank 0 committed.
local function run_sync(job, p, group, rank, commit_args, t0)
  local ok = C.lt_ckpt_job_run(job) == 0
  local msg = not ok and ffi.string(C.lt_last_error()) or nil
  if group then
    local function agree(what)
      local failed = create.tensor({ok and 0 or 1 + rank}, {dtype = "i32"})
      group:all_reduce(failed, "max")
      local who = failed:item()
      if ok and who ~= 0 then raise(string.format("ckpt.save: %s: rank %d failed to %s", p.dir, who - 1, what)) end
    end
    agree("write its file")
    if ok and rank == 0 then
      ok = C.lt_ckpt_commit(unpack(commit_args)) == 0
      msg = not ok and ffi.string(C.lt_last_error()) or nil
    end
    agree("commit")
  end
  if not ok then raise("ckpt.save: " .. p.dir .. ": " .. msg) end
  p.stall = C.lt_wall_time() - t0
  finish(p)
end

-- Starts the job in the background; its sources stay alive (and, by the caller, unchanged)
-- until the job copied them: M.fence.
local function start_async(job, p, keep_alive, opts, t0)
  if C.lt_ckpt_job_start(job) ~= 0 then fail() end
  p.sources = opts.defer ~= false and keep_alive or nil
  p.stall = C.lt_wall_time() - t0
  pending = p
end

-- ---- save ---------------------------------------------------------------------------------

-- Saves a checkpoint to dir (see the header); returns dir. opts: world (a lutra.dist.comm
-- Group; nil: one process), async, keep (prune to the newest `keep` step_* dirs of dir's
-- parent after the commit), latest (default true: replace PARENT/latest), level (lz4 level,
-- 0 fast .. 12 HC), chunk_mb (raw MB a frame, 4), timeout (s rank 0 waits for the others' files),
-- shuffle (default true: byte-transposed frames, see lutra.h), threads (compression threads:
-- default all for a synchronous save, 1 for an async one; 0 = all).
function M.save(dir, state, opts)
  dir = step_dir_check(dir)
  opts = opts or {}
  if type(state) ~= "table" then raise("ckpt.save: state must be a table") end
  local group = opts.world
  local rank, world = group and group.rank or 0, group and group.size or 1
  local t0 = C.lt_wall_time()
  M.wait() -- the next save waits for the previous one
  local pre, plans = prepare_and_gather(state, group, rank, world)
  local tensors, boxes = planner.assign(plans)
  local parent, tmp = ckpt_files.dirname(dir), dir .. ".tmp"
  make_tmp_dir(group, rank, dir, parent, tmp)
  fault("save:start")
  local job, copied = new_job(tmp, rank, pre, opts)
  local keep_alive, copied_bytes = add_pieces(job, pre.plan, boxes, rank, opts)
  number_pieces(plans, boxes, rank, world)
  local commit_args
  if rank == 0 then
    commit_args = plan_commit(job, dir, parent, manifest_text(state, tensors, world, copied), world, group, opts)
  end
  local p = {job = job, rank0 = rank == 0, parent = parent, keep = opts.keep, dir = dir, copied = copied_bytes}
  if opts.async then
    start_async(job, p, keep_alive, opts, t0)
  else
    run_sync(job, p, group, rank, commit_args, t0)
  end
  return dir
end

return M
