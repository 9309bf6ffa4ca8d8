-- lutra.functional.layer_norm — F.layer_norm over the last dim, its backward, and its autograd
-- declaration (LayerNormBackward). The C side: lt_layer_norm_forward / lt_layer_norm_backward
-- (host/ops/layer_norm.c); the residual-fused form is F.add_layer_norm (functional/add_norm.lua).
--
--   F.layer_norm(x, weight, bias, eps, out)       -> y, mean, rstd
--   F.layer_norm(x, {C}, weight, bias, eps, out)  -- torch's normalized_shape, checked
--   F.layer_norm_backward(dout, x, weight, mean, rstd, dres, need_weight, need_bias)
--                                                 -> dx (+ dres when given), dweight, dbias
--   F.layer_norm_backward_graph(dout, x, weight, eps, need_x, need_weight, need_bias)
--                                                 -> the same with recorded ops (gradients of gradients)
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

local record_layer_norm -- the declaration's, below

function M.layer_norm(x, ...)
  need("layer_norm", "x", x)
  local weight, bias, eps, out = skip_normalized_shape("layer_norm", x, ...)
  tensor_or_nil("layer_norm", "weight", weight)
  tensor_or_nil("layer_norm", "bias", bias)
  writing("layer_norm", out, x, weight, bias)
  out = out or new()
  local mean, rstd = row_stats(x), row_stats(x)
  if C.lt_layer_norm_forward(out, mean, rstd, x, weight, bias, eps or 1e-5) ~= 0 then fail() end
  if tracked(x, weight, bias) then record_layer_norm(out, x, weight, bias, mean, rstd, eps or 1e-5) end
  return out, mean, rstd
end

-- need_weight, need_bias: whether to make dweight, dbias (default: when weight is given).
function M.layer_norm_backward(dout, x, weight, mean, rstd, dres, need_weight, need_bias)
  if need_weight == nil then need_weight = weight ~= nil end
  if need_bias == nil then need_bias = weight ~= nil end
  local dx, dweight, dbias = new(), need_weight and new() or nil, need_bias and new() or nil
  local rc
  if dres == nil then
    rc = C.lt_layer_norm_backward(dx, dweight, dbias, dout, x, weight, mean, rstd)
  else
    rc = C.lt_layer_norm_backward_add(dx, dweight, dbias, dout, dres, x, weight, mean, rstd)
  end
  if rc ~= 0 then fail() end
  return dx, dweight, dbias
end
local layer_norm_backward = M.layer_norm_backward

-- dx, dweight, dbias of layer_norm(x, weight, bias, eps) for dout, with recorded ops, so that they
-- are differentiable again (create_graph); mean and rstd are recomputed from x (functions of it):
-- xhat = (x - mean) rstd, gy = dout weight; dx = rstd (gy - mean(gy) - xhat mean(gy xhat)).
-- need_x, need_weight, need_bias: which to make (nil for the others).
function M.layer_norm_backward_graph(dout, x, weight, eps, need_x, need_weight, need_bias)
  local C = x:size(-1)
  local xc = ops.sub(x, ops.mean(x, -1, true))
  local rstd = ops.rsqrt(ops.add(ops.mean(ops.mul(xc, xc), -1, true), eps))
  local xhat = ops.mul(xc, rstd)
  local gy = weight ~= nil and ops.mul(dout, weight) or dout
  local dx, dw, db
  if need_x then
    local centered = ops.sub(gy, ops.mean(gy, -1, true))
    dx = ops.mul(rstd, ops.sub(centered, ops.mul(xhat, ops.mean(ops.mul(gy, xhat), -1, true))))
  end
  if need_weight then dw = ops.sum(ops.mul(dout, xhat):reshape(-1, C), 0) end
  if need_bias then db = ops.sum(dout:reshape(-1, C), 0) end
  return dx, dw, db
end
local layer_norm_backward_graph = M.layer_norm_backward_graph

record_layer_norm = op.declare {
  name = "LayerNormBackward", op = "layer_norm", save = {"x", "w", "mean", "rstd"},
  record = function(cls, out, x, w, b, mean, rstd, eps)
    local node = {edge(x), edge_or_false(w), edge_or_false(b), cls = cls, eps = eps}
    save(node, "x", x)
    if w ~= nil then save(node, "w", w) end
    save(node, "mean", mean)
    save(node, "rstd", rstd)
    attach(out, node)
  end,
  backward = function(n, g)
    local dx, dw, db = layer_norm_backward(g, n.x, n.w, n.mean, n.rstd, nil, n[2], n[3])
    return n[1] and dx or nil, dw, db
  end,
  double_backward = function(n, g) return layer_norm_backward_graph(g, n.x, n.w, n.eps, n[1], n[2], n[3]) end,
}

return M
