-- lutra.train.state — the single-process training checkpoint: a directory holding a
-- manifest (Lua text) and one raw file per tensor.
--
--   local ckpt = require "lutra.train.state"
--   ckpt.save("runs/x/ckpt/step_000200", {step = 200, model = model:state_dict(), optimizer = opt:state_dict(),
--             rng = lt.get_rng_state(), loader = data:state(), config = cfg})
--   local st = ckpt.load("runs/x/ckpt/step_000200")   -- the same tree, tensors loaded (CPU)
--   ckpt.latest("runs/x/ckpt")                         -- the newest complete checkpoint, or nil
--
-- The tree is any nesting of plain tables, numbers, strings, booleans and tensors. In the
-- manifest each tensor becomes {__tensor = "t00012.bin", dtype =, shape =}; its file holds
-- the contiguous bytes in the machine's order. Numbers are written with 17 significant
-- digits (exact doubles), so that a resumed run continues bitwise.
-- A save writes into DIR.tmp-<pid>, then renames it to DIR (replacing an older DIR), and
-- writes the file `latest` in the parent (a name, replaced by rename): a crash leaves the
-- previous checkpoint intact. The trainer only calls save/load/latest/prune, so the
-- distributed checkpoint can replace this module behind the same four calls.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local ops = require "lutra.ops"
local create = require "lutra.create"
local ffi, C = lt.ffi, lt.C

local M = {}

local raise, is_tensor = errors.raise, ops.is_tensor

M.FORMAT = "lutra-train-checkpoint"
M.VERSION = 1

local CHUNK = 16 * 1024 * 1024

local serial = 0
local function unique_suffix() -- not math.random: the user's Lua generator stays untouched
  serial = serial + 1
  return string.format("%d-%d", os.time(), serial)
end

-- ---- files --------------------------------------------------------------------------------

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function exists(path)
  local f = io.open(path, "rb")
  if f then
    f:close()
    return true
  end
  return false
end
M.exists = exists

local function mkdir_p(path)
  local ok = os.execute("mkdir -p " .. sh_quote(path))
  if ok ~= 0 and ok ~= true then raise("checkpoint: cannot create the directory " .. path) end
end
M.mkdir_p = mkdir_p

local function remove_tree(path) os.execute("rm -rf " .. sh_quote(path)) end

local function write_file(path, s)
  local f, err = io.open(path, "wb")
  if not f then raise("checkpoint: cannot write " .. tostring(err)) end
  local ok, werr = f:write(s)
  f:close()
  if not ok then raise("checkpoint: cannot write " .. path .. ": " .. tostring(werr)) end
end

-- ---- tensors --------------------------------------------------------------------------------

local function write_tensor(path, t)
  local c = t
  if t.device ~= "cpu" then c = t:cpu() end
  if not c:is_contiguous() then c = c:contiguous() end
  local nbytes = c:numel() * c:element_size()
  local f, err = io.open(path, "wb")
  if not f then raise("checkpoint: cannot write " .. tostring(err)) end
  local ptr = ffi.cast("const char *", C.lt_data_ptr(c))
  local off = 0
  while off < nbytes do
    local n = math.min(CHUNK, nbytes - off)
    local ok, werr = f:write(ffi.string(ptr + off, n))
    if not ok then
      f:close()
      raise("checkpoint: cannot write " .. path .. ": " .. tostring(werr))
    end
    off = off + n
  end
  f:close()
  return nbytes
end

local function read_tensor(path, dt, shape)
  local t = create.empty(shape, {dtype = dt})
  local nbytes = t:numel() * t:element_size()
  local f, err = io.open(path, "rb")
  if not f then raise("checkpoint: cannot read a tensor: " .. tostring(err)) end
  local size = f:seek("end")
  f:seek("set", 0)
  if size ~= nbytes then
    f:close()
    raise(string.format("checkpoint: %s has %d bytes; a %s tensor of shape {%s} needs %d", path, size, dt,
      table.concat(shape, ", "), nbytes))
  end
  local ptr = ffi.cast("char *", C.lt_data_ptr(t))
  local off = 0
  while off < nbytes do
    local n = math.min(CHUNK, nbytes - off)
    local s = f:read(n)
    if not s or #s ~= n then
      f:close()
      raise("checkpoint: short read in " .. path)
    end
    ffi.copy(ptr + off, s, n)
    off = off + n
  end
  f:close()
  return t
end

-- ---- the manifest: Lua text ----------------------------------------------------------------

local function format_number(v)
  if v ~= v then return "0/0" end
  if v == math.huge then return "1/0" end
  if v == -math.huge then return "-1/0" end
  if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return string.format("%d", v) end
  return string.format("%.17g", v)
end

local function format_key(k)
  if type(k) == "string" and k:match("^[%a_][%w_]*$") then return k end
  if type(k) == "string" then return "[" .. string.format("%q", k) .. "]" end
  if type(k) == "number" then return "[" .. format_number(k) .. "]" end
  raise("checkpoint: cannot save a key of type " .. type(k))
end

-- Serialises v; tensors go to files through put(t) -> the reference table text.
local function serialize(v, put, indent, seen, path)
  local tv = type(v)
  if tv == "number" then return format_number(v) end
  if tv == "string" then return (string.format("%q", v):gsub("\n", "n")) end
  if tv == "boolean" then return tostring(v) end
  if is_tensor(v) then return put(v) end
  if tv == "cdata" then
    local ok, s = pcall(tostring, v)
    if ok and s:match("^%-?%d+U?LL$") then return s end
  end
  if tv ~= "table" then raise(string.format("checkpoint: cannot save %s (a %s)", path, tv)) end
  if seen[v] then raise("checkpoint: " .. path .. " is a cycle") end
  seen[v] = true
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b)
    local ta, tb = type(a), type(b)
    if ta ~= tb then return ta < tb end
    return a < b
  end)
  local inner = indent .. "  "
  local parts = {}
  for _, k in ipairs(keys) do
    parts[#parts + 1] = inner .. format_key(k) .. " = " .. serialize(v[k], put, inner, seen, path .. "." .. tostring(k))
  end
  seen[v] = nil
  if #parts == 0 then return "{}" end
  return "{\n" .. table.concat(parts, ",\n") .. ",\n" .. indent .. "}"
end

-- ---- save, load ------------------------------------------------------------------------

local function basename(p) return p:match("([^/]+)/*$") end
local function dirname(p) return p:match("^(.*)/[^/]+/*$") or "." end

-- Saves `tree` to directory `dir` (atomically: temp dir, then rename). Returns dir.
function M.save(dir, tree)
  if type(dir) ~= "string" or dir == "" then raise("checkpoint.save: dir must be a path string") end
  if type(tree) ~= "table" then raise("checkpoint.save: expected a table, got " .. type(tree)) end
  dir = dir:gsub("/+$", "")
  local parent = dirname(dir)
  mkdir_p(parent)
  local tmp = dir .. ".tmp-" .. unique_suffix()
  remove_tree(tmp)
  mkdir_p(tmp)
  local n, bytes = 0, 0
  local written = {} -- a tensor saved twice (tied weights) is one file
  local function put(t)
    local name = written[t]
    if not name then
      n = n + 1
      name = string.format("t%05d.bin", n)
      bytes = bytes + write_tensor(tmp .. "/" .. name, t)
      written[t] = name
    end
    return string.format("{__tensor = %q, dtype = %q, shape = {%s}}", name, t.dtype, table.concat(t.shape, ", "))
  end
  local ok, body = pcall(serialize, tree, put, "  ", {}, "state")
  if not ok then
    remove_tree(tmp)
    error(body, 0)
  end
  write_file(tmp .. "/manifest.lua", string.format("-- %s version %d: %d tensors, %d bytes\nreturn {\n  format = %q,\n"
    .. "  version = %d,\n  state = %s,\n}\n", M.FORMAT, M.VERSION, n, bytes, M.FORMAT, M.VERSION, body))
  local old = dir .. ".old-" .. unique_suffix()
  os.rename(dir, old) -- fails harmlessly when there is no older dir
  local rok, rerr = os.rename(tmp, dir)
  if not rok then raise("checkpoint.save: cannot rename " .. tmp .. " to " .. dir .. ": " .. tostring(rerr)) end
  remove_tree(old)
  -- the `latest` pointer, replaced atomically
  local lp = parent .. "/latest"
  write_file(lp .. ".tmp", basename(dir) .. "\n")
  os.rename(lp .. ".tmp", lp)
  return dir
end

local function resolve_tensors(v, dir)
  if type(v) ~= "table" then return v end
  if v.__tensor then return read_tensor(dir .. "/" .. v.__tensor, v.dtype, v.shape) end
  local out = {}
  for k, x in pairs(v) do out[k] = resolve_tensors(x, dir) end
  return out
end

-- Loads a checkpoint directory: the saved tree with tensors read back (CPU).
function M.load(dir)
  if type(dir) ~= "string" then raise("checkpoint.load: dir must be a path string") end
  dir = dir:gsub("/+$", "")
  local path = dir .. "/manifest.lua"
  local f = io.open(path, "rb")
  if not f then raise("checkpoint.load: no checkpoint at " .. dir .. " (no manifest.lua)") end
  local text = f:read("*a")
  f:close()
  local chunk, err = loadstring(text, "=" .. path)
  if not chunk then raise("checkpoint.load: corrupt manifest " .. path .. ": " .. tostring(err)) end
  setfenv(chunk, {})
  local ok, m = pcall(chunk)
  if not ok or type(m) ~= "table" or m.format ~= M.FORMAT then
    raise("checkpoint.load: " .. path .. " is not a " .. M.FORMAT .. " manifest")
  end
  if m.version ~= M.VERSION then
    raise(string.format("checkpoint.load: %s has version %s; this lutra reads version %d", path, tostring(m.version),
      M.VERSION))
  end
  return resolve_tensors(m.state, dir)
end

-- The newest checkpoint under root (from `latest`), or nil.
function M.latest(root)
  local f = io.open(root .. "/latest", "rb")
  if not f then return nil end
  local name = (f:read("*l") or ""):match("^%s*(.-)%s*$")
  f:close()
  if name == "" or not exists(root .. "/" .. name .. "/manifest.lua") then return nil end
  return root .. "/" .. name
end

-- Keeps the `keep` newest step_* checkpoints under root (by step number).
function M.prune(root, keep)
  if not keep or keep <= 0 then return end
  local p = io.popen("ls -1 " .. sh_quote(root) .. " 2>/dev/null")
  if not p then return end
  local steps = {}
  for name in p:lines() do
    local s = name:match("^step_(%d+)$")
    if s then steps[#steps + 1] = {tonumber(s), name} end
  end
  p:close()
  table.sort(steps, function(a, b) return a[1] > b[1] end)
  for i = keep + 1, #steps do remove_tree(root .. "/" .. steps[i][2]) end
end

return M
