-- lutra.functional.util — what the F.* bindings share: argument checks, "does autograd record
-- this", the write into a caller's `out`, the per-row statistics the norm and loss kernels save,
-- and the record helpers of their declarations. The bindings hold these in locals.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local ops = require "lutra.ops"
local dtype = require "lutra.dtype"
local S = require "lutra.autograd.state"
local op = require "lutra.autograd.op"
local fields = require "lutra.tensor.fields"
local is_tracked = fields.is_tracked
local ffi, C = lt.ffi, lt.C

local M = {}

local new, fail, raise = memory.new, errors.fail, errors.raise
local is_tensor = ops.is_tensor
local edge = op.edge

function M.tensor_or_nil(op_name, what, t)
  if t ~= nil and not is_tensor(t) then
    raise(string.format("%s: %s must be a tensor or nil, got %s", op_name, what, type(t)))
  end
  return t
end

function M.need(op_name, what, t)
  if not is_tensor(t) then raise(string.format("%s: %s must be a tensor, got %s", op_name, what, type(t))) end
  return t
end

local function grad_of(a) return a ~= nil and is_tracked(a) end

-- True when autograd records this op (grad mode on, an input requires grad).
function M.tracked(a, b, c)
  return S.enabled and (grad_of(a) or grad_of(b) or grad_of(c))
end

function M.tracked4(a, b, c, d)
  return S.enabled and (grad_of(a) or grad_of(b) or grad_of(c) or grad_of(d))
end

-- A caller's `out` is written in place: checked, versioned, and cleared when untracked.
function M.writing(op_name, out, a, b, c)
  if out == nil then return end
  ops.before_write(op_name, out, a, b)
  if c ~= nil then ops.before_write(op_name, out, c) end
  S.bump(out)
  if S.enabled then S.clear(out) end
end

-- Per-row statistics (N) of x (..., C): f64 when x is, else left to the C op (f32).
function M.row_stats(x)
  local t = new()
  if fields.dtype_id(x) == dtype.F64 and x.ndim > 0 then
    local n = 1
    for d = 0, x.ndim - 2 do n = n * fields.size(x, d) end
    if C.lt_empty(t, 1, ffi.new("int64_t[1]", n), dtype.F64, fields.device_id(x)) ~= 0 then fail() end
  end
  return t
end

-- torch passes normalized_shape second; accept and check it.
function M.skip_normalized_shape(op_name, x, a, ...)
  if type(a) == "table" and not is_tensor(a) then
    if #a ~= 1 or a[1] ~= x:size(-1) then
      raise(op_name .. ": only the last dim can be normalized (normalized_shape {" .. x:size(-1) .. "})")
    end
    return ...
  end
  return a, ...
end

-- An input's edge in a node, or false when there is no such input.
function M.edge_or_false(t) return t ~= nil and edge(t) or false end

return M
