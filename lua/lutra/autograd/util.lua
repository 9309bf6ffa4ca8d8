-- lutra.autograd.util — shape helpers shared by the backward formulas.
local lt = require "lutra.ffi"
local ops = require "lutra.ops"
local create = require "lutra.create"
local dtype = require "lutra.dtype"
local fields = require "lutra.tensor.fields"

local M = {}

local tonumber = tonumber

function M.shape_of(t)
  local s = {}
  for d = 0, t.ndim - 1 do s[d + 1] = fields.size(t, d) end
  return s
end
local shape_of = M.shape_of

pcall(lt.ffi.cdef, "int memcmp(const void *, const void *, size_t);")
local memcmp = lt.ffi.C.memcmp

-- a's shape as a list when it differs from out's (a was broadcast), else nil. No Lua
-- loop: this runs on every recorded binary op, inside the caller's compiled trace.
function M.shape_if_broadcast(a, out)
  local n = a.ndim
  if n == out.ndim and (n == 0 or memcmp(fields.dims(a), fields.dims(out), 8 * n) == 0) then return nil end
  return shape_of(a)
end

-- g summed over the dims that broadcasting added or stretched, to `shape` (a list;
-- nil: g already has the right shape).
function M.reduce_to(g, shape)
  if shape == nil then return g end
  local gn, n = g.ndim, #shape
  local dims, lead = {}, gn - n
  for d = 0, lead - 1 do dims[#dims + 1] = d end
  for d = 1, n do
    if shape[d] == 1 and fields.size(g, lead + d - 1) ~= 1 then dims[#dims + 1] = lead + d - 1 end
  end
  if #dims == 0 then return g end
  local r = ops.sum(g, dims, true)
  if lead > 0 or r.ndim ~= n then r = r:reshape(shape) end
  return r
end

-- Dims of a reduction as a sorted list of non-negative dims (nil: all of them).
function M.reduced_dims(dims, ndim)
  local list = {}
  if dims == nil then
    for d = 0, ndim - 1 do list[d + 1] = d end
    return list
  end
  if type(dims) == "number" then dims = {dims} end
  for i = 1, #dims do
    local d = dims[i]
    list[i] = d < 0 and d + ndim or d
  end
  table.sort(list)
  return list
end

-- g of a reduction's output, broadcast back to the input's shape (`shape`).
function M.expand_back(g, dims, keepdim, shape)
  if not keepdim and #shape > 0 then
    for i = 1, #dims do g = g:unsqueeze(dims[i]) end
  end
  return g:expand(shape)
end

-- The number of elements a reduction over dims of `shape` folds into one.
function M.count(dims, shape)
  local n = 1
  for i = 1, #dims do n = n * shape[dims[i] + 1] end
  return n
end

function M.zeros(shape, like)
  return create.zeros(shape, {dtype = dtype.name(fields.dtype_id(like)),
    device = dtype.device_name(fields.device_id(like))})
end

return M
