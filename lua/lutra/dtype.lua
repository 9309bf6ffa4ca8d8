-- lutra.dtype — dtype and device names <-> the C API's ints.
--
-- dtypes are strings in Lua: "f32", "f64", "bf16", "f16", "i32", "i64", "u8", "bool",
-- with torch-style aliases ("float32", "float", "double", "bfloat16", "half",
-- "int", "long", ...). Devices are "cpu", "cuda" (= "cuda:0"), "cuda:k", or a
-- CUDA ordinal k.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local ffi, C = lt.ffi, lt.C
local raise = errors.raise

local M = {}

M.F32, M.F64, M.BF16, M.F16 = C.LT_F32, C.LT_F64, C.LT_BF16, C.LT_F16
M.I32, M.I64, M.U8, M.BOOL = C.LT_I32, C.LT_I64, C.LT_U8, C.LT_BOOL
M.CPU = C.LT_DEVICE_CPU

local names, ids, sizes = {}, {}, {}
for d = 0, C.LT_NUM_DTYPES - 1 do
  names[d] = ffi.string(C.lt_dtype_name(d))
  ids[names[d]] = d
  sizes[d] = C.lt_dtype_size(d)
end
M.names, M.sizes = names, sizes

local is_float = {[M.F32] = true, [M.F64] = true, [M.BF16] = true, [M.F16] = true}
function M.is_float(d) return is_float[d] == true end

local out_id = ffi.new("int[1]")

-- The dtype id of a name or id; `default` when d is nil.
function M.id(d, default)
  if d == nil then return default end
  if type(d) == "number" then
    if names[d] then return d end
    raise("dtype: unknown dtype " .. tostring(d))
  end
  if type(d) ~= "string" then raise("dtype: expected a dtype name such as \"f32\", got " .. type(d)) end
  local id = ids[d]
  if id then return id end
  if C.lt_dtype_from_name(d, out_id) ~= 0 then errors.fail() end
  ids[d] = out_id[0]
  return out_id[0]
end

function M.name(id) return names[id] or "?" end

-- The device ordinal of "cpu", "cuda", "cuda:k" or k; `default` when dev is nil.
function M.device_id(dev, default)
  if dev == nil then return default end
  if type(dev) == "number" then
    if dev >= -1 and dev == math.floor(dev) then return dev end
  elseif dev == "cpu" then
    return M.CPU
  elseif dev == "cuda" or dev == "gpu" then
    return 0
  elseif type(dev) == "string" then
    local k = dev:match("^cuda:(%d+)$")
    if k then return tonumber(k) end
  end
  raise("device: expected \"cpu\", \"cuda\" or \"cuda:k\", got " .. tostring(dev))
end

function M.device_name(id)
  if id == M.CPU then return "cpu" end
  return "cuda:" .. id
end

-- True when the string names a device rather than a dtype.
function M.is_device_name(s)
  return type(s) == "number" or s == "cpu" or s == "cuda" or s == "gpu" or (type(s) == "string" and s:match("^cuda:%d+$") ~= nil)
end

-- For to(x), where x may be either: "device", id or "dtype", id; a string that is neither is
-- an error that says so (not "unknown dtype" for a misspelt device).
function M.device_or_dtype(x, who)
  if M.is_device_name(x) then return "device", M.device_id(x) end
  if type(x) == "string" and not ids[x] and C.lt_dtype_from_name(x, out_id) ~= 0 then
    local known = {}
    for d = 0, #names do known[#known + 1] = names[d] end
    raise(string.format("%s: '%s' is neither a device (cpu, cuda, cuda:K) nor a dtype (%s)", who, x,
                        table.concat(known, ", ")))
  end
  return "dtype", M.id(x)
end

return M
