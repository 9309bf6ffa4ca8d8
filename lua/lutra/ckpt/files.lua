-- lutra.ckpt.files — the small file and box helpers the checkpoint modules share.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local ffi, C = lt.ffi, lt.C

local M = {}
local fail, raise = errors.fail, errors.raise

function M.sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

function M.exists(path)
  local f = io.open(path, "rb")
  if f then
    f:close()
    return true
  end
  return false
end

-- Directory calls without a shell (a fork costs milliseconds: the stall of an async save).
pcall(ffi.cdef, [[
int mkdir(const char *path, unsigned int mode);
void *opendir(const char *name);
void *readdir(void *dir);
int closedir(void *dir);
struct lt_ckpt_dirent { uint64_t d_ino; int64_t d_off; unsigned short d_reclen; unsigned char d_type; char d_name[256]; };
]])
pcall(ffi.cdef, "char *strerror(int errnum);")

pcall(ffi.cdef, "char *realpath(const char *path, char *resolved);")
pcall(ffi.cdef, "void free(void *p);")

-- The absolute path of an existing path with every symlink resolved; nil when it does not exist.
function M.resolved(path)
  local p = ffi.C.realpath(path, nil)
  if p == nil then return nil end
  local s = ffi.string(p)
  ffi.C.free(p)
  return s
end

pcall(ffi.cdef, "long readlink(const char *path, char *buf, size_t size);")
local link_buf = ffi.new("char[1]")
-- True when path is a symbolic link (dangling or not).
function M.is_link(path) return ffi.C.readlink(path, link_buf, 1) >= 0 end

function M.is_dir(path)
  local d = ffi.C.opendir(path)
  if d == nil then return false end
  ffi.C.closedir(d)
  return true
end

function M.mkdir_p(path)
  local at = path:sub(1, 1) == "/" and "/" or ""
  for part in path:gmatch("[^/]+") do
    at = at .. part
    local err = not M.is_dir(at) and ffi.C.mkdir(at, 493) ~= 0 and ffi.errno() -- 0755
    if err and not M.is_dir(at) then
      raise("cannot create the directory " .. at .. ": "
        .. (err == 17 and "a file of that name is in the way" or ffi.string(ffi.C.strerror(err)):lower()))
    end
    at = at .. "/"
  end
end

function M.remove_tree(path) if C.lt_ckpt_remove_tree(path) ~= 0 then fail() end end
-- A whole checkpoint: moved aside (DIR.old-<pid>) first, so that a crash midway leaves no half
-- of one under its name.
function M.remove_checkpoint(dir) if C.lt_ckpt_remove_checkpoint(dir) ~= 0 then fail() end end

function M.read(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local s = f:read("*a")
  f:close()
  return s
end

-- Written to a temp file, fsync'ed, renamed into place, the directory fsync'ed.
function M.write_atomic(path, s)
  if C.lt_ckpt_write_file(path, s, #s) ~= 0 then fail() end
end

-- Names in dir (without . and ..), sorted; {} when dir cannot be read.
function M.list(dir)
  local out = {}
  local d = ffi.C.opendir(dir)
  if d == nil then return out end
  while true do
    local e = ffi.C.readdir(d)
    if e == nil then break end
    local name = ffi.string(ffi.cast("struct lt_ckpt_dirent *", e).d_name)
    if name ~= "." and name ~= ".." then out[#out + 1] = name end
  end
  ffi.C.closedir(d)
  table.sort(out)
  return out
end

function M.basename(p) return p:match("([^/]+)/*$") end
function M.dirname(p) return p:match("^(.*)/[^/]+/*$") or "." end

function M.file_size(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local n = f:seek("end")
  f:close()
  return n
end

-- ---- boxes ------------------------------------------------------------------------------

function M.numel(shape)
  local n = 1
  for i = 1, #shape do n = n * shape[i] end
  return n
end

-- The view of t at [offset, offset + shape) (a tensor; no autograd, no copy).
function M.box_view(t, offset, shape)
  local v = t
  for d = 1, #shape do
    if offset[d] ~= 0 or shape[d] ~= v:size(d - 1) then
      local out = memory.new()
      if C.lt_narrow(out, v, d - 1, offset[d], shape[d]) ~= 0 then fail() end
      v = out
    end
  end
  return v
end

-- The intersection of boxes a and b (offset, shape lists), or nil when empty.
function M.intersect(ao, as, bo, bs)
  local o, s = {}, {}
  for d = 1, #ao do
    local lo, hi = math.max(ao[d], bo[d]), math.min(ao[d] + as[d], bo[d] + bs[d])
    if hi <= lo then return nil end
    o[d], s[d] = lo, hi - lo
  end
  return o, s
end

function M.sub(a, b)
  local out = {}
  for d = 1, #a do out[d] = a[d] - b[d] end
  return out
end

function M.copy(dst, src) if C.lt_copy(dst, src) ~= 0 then fail() end end

function M.ptr(t) return ffi.cast("char *", C.lt_data_ptr(t)) end

-- step_* directories under root, newest (largest step) first: {{step =, name =}, ...}
function M.steps(root)
  local out = {}
  for _, name in ipairs(M.list(root)) do
    local s = name:match("^step_(%d+)$")
    if s then out[#out + 1] = {step = tonumber(s), name = name} end
  end
  table.sort(out, function(a, b) return a.step > b.step end)
  return out
end

return M
