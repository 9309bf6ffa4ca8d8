-- lutra.ops.reduce — reductions over dims (sum, mean, max, min, prod, norm, argmax,
-- argmin, var, std) and softmax/log_softmax, each one C call (see lutra/ops/init.lua).
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local shape = require "lutra.shape"
local S = require "lutra.autograd.state"
local W = require "lutra.ops.write"
local E = require "lutra.ops.elementwise"
local C = lt.C

local M = {}

local records = require("lutra.autograd.op").records
local fields = require "lutra.tensor.fields"
local is_tracked = fields.is_tracked
local before_write, recording, is_tensor, check_out = W.before_write, W.recording, W.is_tensor, W.check_out
local new, fail, raise = memory.new, errors.fail, errors.raise
local int_arg = errors.int_arg
local bump = S.bump -- argmax/argmin: a given out is versioned, not recorded
local binary, BINARY, UNARY, C_unary = E.binary, E.BINARY, E.UNARY, lt.fn("lt_unary")

local REDUCE = {sum = C.LT_SUM, mean = C.LT_MEAN, max = C.LT_MAX, min = C.LT_MIN, prod = C.LT_PROD, norm = C.LT_NORM}

-- dims: nil (all), a dim, or a list of dims.
local function reduce(a, op, name, dims, keepdim, out)
  check_out(name, out)
  local n, arr = shape.dims(name, dims)
  local given = out
  if given ~= nil then before_write(name, given, a) end
  if out == nil then out = new() end
  if C.lt_reduce(out, a, op, n, arr, keepdim and 1 or 0) ~= 0 then fail() end
  if recording(given, out, is_tracked(a)) then
    records[name](out, a, dims, keepdim)
    S.dest = nil
  end
  return out
end
M.REDUCE = REDUCE

-- t:sum(dims, keepdim, out), mean, prod, norm (L2): over dims (nil: all, a dim, or a list of dims),
-- the reduced dims kept as size 1 when keepdim.
for _, name in ipairs {"sum", "mean", "prod", "norm"} do
  local op = REDUCE[name]
  M[name] = function(a, dims, keepdim, out) return reduce(a, op, name, dims, keepdim, out) end
end

local function arg_reduce(fn, name, a, dim, keepdim, out)
  check_out(name, out)
  if out ~= nil then
    before_write(name, out)
    bump(out)
  end
  if out == nil then out = new() end
  local all = dim == nil
  if not all and type(dim) ~= "number" then raise(name .. ": dim must be a number or nil, got " .. type(dim)) end
  if fn(out, a, dim or 0, keepdim and 1 or 0, all and 1 or 0) ~= 0 then fail() end
  return out
end
-- t:argmax(dim, keepdim, out), t:argmin(...): the index (i64) of the largest / smallest element along
-- dim, or in the flattened tensor when dim is nil.
function M.argmax(a, dim, keepdim, out) return arg_reduce(C.lt_argmax, "argmax", a, dim, keepdim, out) end
function M.argmin(a, dim, keepdim, out) return arg_reduce(C.lt_argmin, "argmin", a, dim, keepdim, out) end

-- max()/min(): over all or some dims; with a single dim also the indices (as torch);
-- with a tensor, the elementwise maximum/minimum.
local function max_min(a, dims, keepdim, out, op, name, pair, arg)
  if is_tensor(dims) then return binary(a, dims, pair, keepdim) end -- t:max(other, out)
  local values = reduce(a, op, name, dims, keepdim, out)
  if type(dims) == "number" then return values, arg(a, dims, keepdim) end
  return values
end
-- t:max(dims, keepdim, out), t:min(...): over all dims (nil), a dim or a list; with a single dim also
-- the indices (values, indices, as torch); t:max(other, out): the elementwise maximum.
function M.max(a, dims, keepdim, out) return max_min(a, dims, keepdim, out, REDUCE.max, "max", BINARY.maximum, M.argmax) end
function M.min(a, dims, keepdim, out) return max_min(a, dims, keepdim, out, REDUCE.min, "min", BINARY.minimum, M.argmin) end

-- correction: 1 (unbiased, default) or 0; true/false as torch's `unbiased`.
local function var_std(name, a, dims, keepdim, correction, out)
  check_out(name, out)
  if correction == nil or correction == true then correction = 1 elseif correction == false then correction = 0 end
  int_arg(name, correction, "correction")
  local n, arr = shape.dims(name, dims)
  local given = out
  if given ~= nil then before_write(name, given, a) end
  if out == nil then out = new() end
  if C.lt_var(out, a, n, arr, correction, keepdim and 1 or 0) ~= 0 then fail() end
  if name == "std" and C_unary(out, out, UNARY.sqrt) ~= 0 then fail() end
  if recording(given, out, is_tracked(a)) then
    records[name](out, a, dims, keepdim, correction)
    S.dest = nil
  end
  return out
end

-- t:var(dims, keepdim, correction, out), t:std(...): variance / standard deviation over dims;
-- correction 1 (default, or true) divides by n - 1, 0 (or false) by n.
function M.var(a, dims, keepdim, correction, out) return var_std("var", a, dims, keepdim, correction, out) end
function M.std(a, dims, keepdim, correction, out) return var_std("std", a, dims, keepdim, correction, out) end

local function softmax(name, fn, a, dim, out)
  int_arg(name, dim, "dim", true)
  check_out(name, out)
  local given = out
  if given ~= nil then before_write(name, given, a) end
  if out == nil then out = new() end
  if fn(out, a, dim or -1) ~= 0 then fail() end
  if recording(given, out, is_tracked(a)) then
    records[name](out, a, dim or -1)
    S.dest = nil
  end
  return out
end

-- t:softmax(dim, out), t:log_softmax(dim, out): along dim (F.softmax and F.log_softmax too).
function M.softmax(a, dim, out) return softmax("softmax", C.lt_softmax, a, dim, out) end
function M.log_softmax(a, dim, out) return softmax("log_softmax", C.lt_log_softmax, a, dim, out) end

return M
