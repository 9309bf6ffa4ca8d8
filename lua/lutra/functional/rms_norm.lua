-- lutra.functional.rms_norm — F.rms_norm over the last dim, its backward, and its autograd
-- declaration (RMSNormBackward). The C side: lt_rms_norm_forward / lt_rms_norm_backward
-- (host/ops/rms_norm.c); the residual-fused form is F.add_rms_norm (functional/add_norm.lua).
--
--   F.rms_norm(x, weight, eps, out)        -> y, rstd
--   F.rms_norm(x, {C}, weight, eps, out)   -- torch's normalized_shape, checked
--   F.rms_norm_backward(dout, x, weight, rstd, dres, need_weight) -> dx (+ dres when given), dweight
--   F.rms_norm_backward_graph(dout, x, weight, eps, need_x, need_weight)
--                                          -> the same with recorded ops (gradients of gradients)
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local op = require "lutra.autograd.op"
local ops = require "lutra.ops"
local U = require "lutra.functional.util"
local C = lt.C

local M = {}

local new, fail = memory.new, errors.fail
local need, tensor_or_nil, tracked, writing = U.need, U.tensor_or_nil, U.tracked, U.writing
local row_stats, skip_normalized_shape, edge_or_false = U.row_stats, U.skip_normalized_shape, U.edge_or_false
local edge, attach, save = op.edge, op.attach, op.save

local record_rms_norm -- the declaration's, below

function M.rms_norm(x, ...)
  need("rms_norm", "x", x)
  local weight, eps, out = skip_normalized_shape("rms_norm", x, ...)
  tensor_or_nil("rms_norm", "weight", weight)
  writing("rms_norm", out, x, weight)
  out = out or new()
  local rstd = row_stats(x)
  if C.lt_rms_norm_forward(out, rstd, x, weight, eps or 1e-6) ~= 0 then fail() end
  if tracked(x, weight) then record_rms_norm(out, x, weight, rstd, eps or 1e-6) end
  return out, rstd
end

-- need_weight: whether to make dweight (default: when weight is given).
function M.rms_norm_backward(dout, x, weight, rstd, dres, need_weight)
  if need_weight == nil then need_weight = weight ~= nil end
  local dx, dweight = new(), need_weight and new() or nil
  local rc
  if dres == nil then
    rc = C.lt_rms_norm_backward(dx, dweight, dout, x, weight, rstd)
  else
    rc = C.lt_rms_norm_backward_add(dx, dweight, dout, dres, x, weight, rstd)
  end
  if rc ~= 0 then fail() end
  return dx, dweight
end
local rms_norm_backward = M.rms_norm_backward

-- dx, dweight of rms_norm(x, weight, eps) for dout, with recorded ops, so that they are
-- differentiable again (create_graph); rstd is recomputed from x: xhat = x rstd, gy = dout weight;
-- dx = rstd (gy - xhat mean(gy xhat)). need_x, need_weight: which to make (nil for the others).
function M.rms_norm_backward_graph(dout, x, weight, eps, need_x, need_weight)
  local rstd = ops.rsqrt(ops.add(ops.mean(ops.mul(x, x), -1, true), eps))
  local xhat = ops.mul(x, rstd)
  local gy = weight ~= nil and ops.mul(dout, weight) or dout
  local dx, dw
  if need_x then dx = ops.mul(rstd, ops.sub(gy, ops.mul(xhat, ops.mean(ops.mul(gy, xhat), -1, true)))) end
  if need_weight then dw = ops.sum(ops.mul(dout, xhat):reshape(-1, x:size(-1)), 0) end
  return dx, dw
end
local rms_norm_backward_graph = M.rms_norm_backward_graph

record_rms_norm = op.declare {
  name = "RMSNormBackward", op = "rms_norm", save = {"x", "w", "rstd"},
  record = function(cls, out, x, w, rstd, eps)
    local node = {edge(x), edge_or_false(w), cls = cls, eps = eps}
    save(node, "x", x)
    if w ~= nil then save(node, "w", w) end
    save(node, "rstd", rstd)
    attach(out, node)
  end,
  backward = function(n, g)
    local dx, dw = rms_norm_backward(g, n.x, n.w, n.rstd, nil, n[2])
    return n[1] and dx or nil, dw
  end,
  double_backward = function(n, g) return rms_norm_backward_graph(g, n.x, n.w, n.eps, n[1], n[2]) end,
}

return M
