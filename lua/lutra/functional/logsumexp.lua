-- lutra.functional.logsumexp — log(sum(exp(x))) over dims, stable, made of the reduction and
-- elementwise ops (so it runs wherever they do, CUDA included, and autograd differentiates it):
--
--   F.logsumexp(x, dims, keepdim) -> out     dims: a dim or a list of dims
--
-- The max over dims, held constant (no gradient), is subtracted before exp and added back; an
-- infinite max is replaced by 0 so that a row of -inf gives -inf and a row with +inf gives +inf,
-- as torch. The gradient is then exactly softmax(x) * grad. A NaN gives NaN.
local ops = require "lutra.ops"
local errors = require "lutra.errors"
local U = require "lutra.functional.util"

local M = {}

local need, raise = U.need, errors.raise
local where = ops.where

function M.logsumexp(x, dims, keepdim)
  need("logsumexp", "x", x)
  if type(dims) ~= "number" and type(dims) ~= "table" then
    raise("logsumexp: dims must be a dim or a list of dims, got " .. type(dims))
  end
  if not x:is_floating_point() then raise("logsumexp: x must be a float tensor, got " .. x.dtype) end
  local m = ops.max(x:detach(), type(dims) == "number" and {dims} or dims, true)
  local shift = where(m:abs():eq(math.huge), 0, m)
  local s = ops.sum(ops.exp(ops.sub(x, shift)), dims, keepdim)
  return ops.add(ops.log(s), keepdim and shift or ops.sum(shift, dims, false))
end

return M
