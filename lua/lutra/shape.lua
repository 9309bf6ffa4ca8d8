-- lutra.shape — shapes and dim lists from Lua arguments into int64 arrays, and back.
--
-- A shape is given as numbers (t:view(2, -1)) or as one list (t:view{2, -1}).
-- Parsed shapes land in scratch arrays that are valid until the next parse, which
-- is enough since each is handed straight to one C call.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local fields = require "lutra.tensor.fields"
local ffi = lt.ffi
local raise = errors.raise

local M = {}

local MAX = lt.MAX_DIMS
local scratch = {ffi.new("int64_t[?]", MAX), ffi.new("int64_t[?]", MAX)}
M.scratch = scratch

local function check_int(op, v, what)
  if type(v) ~= "number" or v ~= math.floor(v) then
    raise(string.format("%s: %s must be integers, got %s", op, what, tostring(v)))
  end
  return v
end

-- Fills scratch[slot] from a list; returns ndim.
function M.from_list(op, list, slot, what)
  local n = #list
  if n > MAX then raise(string.format("%s: %d dims given, at most %d supported", op, n, MAX)) end
  local a = scratch[slot or 1]
  for i = 1, n do a[i - 1] = check_int(op, list[i], what or "sizes") end
  return n, a
end

-- Parses a shape given as (n1, n2, ...) or ({n1, n2, ...}) followed by other
-- arguments; returns ndim, the int64 array, and the two arguments after the shape.
function M.parse(op, ...)
  local first = ...
  if type(first) == "table" then
    if first[1] == nil and (first.dtype ~= nil or first.device ~= nil) then -- options only: a 0-d shape
      return 0, scratch[1], first
    end
    local n, a = M.from_list(op, first, 1)
    return n, a, select(2, ...)
  end
  local a = scratch[1]
  local nargs = select("#", ...)
  local n = 0
  while n < nargs do
    local v = select(n + 1, ...)
    if type(v) ~= "number" then break end
    if n >= MAX then raise(string.format("%s: more than %d dims given", op, MAX)) end
    a[n] = check_int(op, v, "sizes")
    n = n + 1
  end
  if n < nargs then return n, a, select(n + 1, ...) end
  return n, a
end

-- t's shape as a Lua list (1-based: list[1] is the size of dim 0).
function M.shape_table(t)
  local s = {}
  for d = 0, t.ndim - 1 do s[d + 1] = fields.size(t, d) end
  return s
end

function M.shape_string(t)
  return "[" .. table.concat(M.shape_table(t), ", ") .. "]"
end

-- A dim or a list of dims (nil: none) into scratch[2]; returns the count.
function M.dims(op, dims)
  if dims == nil then return 0, scratch[2] end
  if type(dims) == "number" then
    scratch[2][0] = check_int(op, dims, "dims")
    return 1, scratch[2]
  end
  if type(dims) ~= "table" then raise(op .. ": dim must be a number or a list of numbers, got " .. type(dims)) end
  return M.from_list(op, dims, 2, "dims")
end

return M
