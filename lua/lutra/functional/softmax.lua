-- lutra.functional.softmax — the backward kernels of softmax and log_softmax over one dim
-- (lt_softmax_backward, lt_log_softmax_backward: host/ops/softmax.c); the forwards are the tensor
-- ops (F.softmax == lutra.ops.softmax), whose declarations (lutra/autograd/reduce.lua) use these.
--
--   F.softmax_backward(grad_out, y, dim, out)       y = softmax(x, dim); dim -1 by default
--   F.log_softmax_backward(grad_out, y, dim, out)   y = log_softmax(x, dim)
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local C = lt.C

local M = {}

local new, fail = memory.new, errors.fail

function M.softmax_backward(grad_out, y, dim, out)
  out = out or new()
  if C.lt_softmax_backward(out, grad_out, y, dim or -1) ~= 0 then fail() end
  return out
end

function M.log_softmax_backward(grad_out, y, dim, out)
  out = out or new()
  if C.lt_log_softmax_backward(out, grad_out, y, dim or -1) ~= 0 then fail() end
  return out
end

return M
