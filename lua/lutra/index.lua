-- lutra.index — t[key] and t[key] = value.
--
-- Indices are 0-based; negative ones count from the end (-1 is the last).
--   t[i]                      selects i along dim 0 (a view with one dim less)
--   t[{i, {a, b}, {}, {a, b, s}, {a}}]
--                             one entry per dim, from dim 0: a number selects (the
--                             dim goes away), {a, b} is the half-open range [a, b),
--                             {a} runs from a to the end, {} keeps the whole dim,
--                             {a, b, s} takes every s-th element (s > 0). Dims left
--                             over are kept whole. Ranges clamp to the size, as
--                             Python slices do; selected indices must be in range.
-- Every result is a view sharing t's storage. Assignment writes through the same
-- view: t[key] = number fills it, t[key] = tensor copies (broadcasting, converting
-- the dtype), t[key] = nested list copies the list's values.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local fields = require "lutra.tensor.fields"
local S = require "lutra.autograd.state"
local records = require("lutra.autograd.op").records
local ffi, C = lt.ffi, lt.C

local M = {}

local type, floor, istype = type, math.floor, ffi.istype
local Tensor = ffi.typeof("lt_tensor")
local raise = errors.raise
local END = 2 ^ 62

local function check_int(v, what)
  if type(v) ~= "number" or v ~= floor(v) then
    raise(string.format("index: %s must be an integer, got %s", what, tostring(v)))
  end
  return v
end

-- Makes `out` the view of t selected by key. Returns false with the C error set on
-- a failure of the C library; raises itself on a malformed key.
local function apply(out, t, key)
  if type(key) == "number" then
    check_int(key, "an index")
    return C.lt_select(out, t, 0, key) == 0
  end
  if C.lt_set(out, t) ~= 0 then return false end
  local d = 0
  for i = 1, #key do
    local e = key[i]
    if d >= out.ndim then
      raise(string.format("index: too many indices (%d) for a tensor of %d dims", #key, t.ndim))
    end
    if type(e) == "number" then
      check_int(e, "an index")
      if C.lt_select(out, out, d, e) ~= 0 then return false end
    elseif type(e) == "table" and not istype(Tensor, e) then
      local a, b, s = e[1], e[2], e[3]
      a = a == nil and 0 or check_int(a, "a range start")
      b = b == nil and END or check_int(b, "a range end")
      s = s == nil and 1 or check_int(s, "a range step")
      if C.lt_slice(out, out, d, a, b, s) ~= 0 then return false end
      d = d + 1
    else
      raise(string.format("index: entry %d must be a number or a range {a, b, step}, got %s", i, type(e)))
    end
  end
  return true
end

-- t[key]: a view.
function M.get(t, key)
  local out = memory.new()
  if not apply(out, t, key) then errors.fail() end
  fields.set_view_kind(out, fields.VIEW)
  if fields.is_tracked(t) and S.enabled then records.index(out, t, M.copy_key(key)) end
  return out
end

-- A copy of a key (the caller may change its tables later).
function M.copy_key(key)
  if type(key) ~= "table" then return key end
  local k = {}
  for i = 1, #key do
    local e = key[i]
    if type(e) == "table" then e = {e[1], e[2], e[3]} end
    k[i] = e
  end
  return k
end


local at = ffi.new("int64_t[1]")

local function assign(view, value)
  local tv = type(value)
  if tv == "number" then return C.lt_fill(view, value) == 0 end
  if tv == "boolean" then return C.lt_fill(view, value and 1 or 0) == 0 end
  if tv == "cdata" and istype(Tensor, value) then return C.lt_copy(view, value) == 0 end
  if tv == "table" then
    local src = require("lutra.create").tensor(value, {dtype = view.dtype, device = "cpu"})
    return C.lt_copy(view, src) == 0
  end
  return nil, "index: cannot assign a " .. tv .. " to a tensor (expected a number, a tensor or a list)"
end

local function select_and_assign(view, t, key, value)
  if not apply(view, t, key) then return false end
  return assign(view, value)
end

-- Autograd around t[key] = value: checks before, record and version bump after.
local function tracked(t, value)
  return S.enabled
    and (fields.is_tracked(t) or (type(value) == "cdata" and istype(Tensor, value) and fields.is_tracked(value)))
end

local function written(t, key, value, track)
  S.bump(t)
  if track then records.index_put(t, M.copy_key(key), value) end
end

-- t[key] = value.
function M.set(t, key, value)
  local track = tracked(t, value)
  if track then S.check_inplace("index assignment", t, type(value) == "cdata" and value or nil) end
  -- one element of a CPU vector: no view needed
  if type(key) == "number" and type(value) == "number" and t.ndim == 1 and fields.is_cpu(t) then
    local i = check_int(key, "an index")
    at[0] = i < 0 and i + fields.size(t, 0) or i
    if C.lt_set_at(t, at, value) ~= 0 then errors.fail() end
    return written(t, key, value, track)
  end
  local view = C.lt_tensor_new()
  if view == nil then errors.fail() end
  local ok, done, err = pcall(select_and_assign, view, t, key, value) -- raise() inside positions its message
  C.lt_release(view) -- leaves the C error message as it was
  if not ok then error(done, 0) end
  if err then raise(err) end
  if not done then errors.fail() end
  return written(t, key, value, track)
end

return M
