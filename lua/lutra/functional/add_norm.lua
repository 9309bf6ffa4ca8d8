-- lutra.functional.add_norm — the residual add fused with the norm, F.add_layer_norm and
-- F.add_rms_norm, and their one autograd declaration (AddNormBackward, record "add_norm"):
--
--   F.add_layer_norm(x, residual, weight, bias, eps) -> res, y, mean, rstd
--   F.add_rms_norm(x, residual, weight, eps)         -> res, y, rstd
--
-- res = x + residual (a pre-norm block's new residual stream), y = the norm of res, in one pass
-- (lt_add_layer_norm_forward, lt_add_rms_norm_forward: host/ops/layer_norm.c, host/ops/rms_norm.c); x and residual
-- have one shape and dtype.
--
-- Two outputs that both take gradients. res carries the op's node (AddNormBackward: edges x,
-- residual, weight, bias); y's record (AddNormOutput) hands y's gradient to that node, as
-- checkpoint's outputs do. The node runs once res's own gradient (from its other uses) and y's
-- have both arrived, and one kernel gives dx = norm_backward(dy) + dres for x and residual (so a
-- hook or retain_grad on res sees the gradient of res's other uses only).
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local op = require "lutra.autograd.op"
local S = require "lutra.autograd.state"
local engine = require "lutra.autograd.engine"
local U = require "lutra.functional.util"
local layer_norm = require "lutra.functional.layer_norm"
local rms_norm = require "lutra.functional.rms_norm"
local C = lt.C

local M = {}

local new, fail = memory.new, errors.fail
local need, tensor_or_nil, tracked4, row_stats = U.need, U.tensor_or_nil, U.tracked4, U.row_stats
local declare, edge, attach, save, save_output = op.declare, op.edge, op.attach, op.save, op.save_output
local layer_norm_backward, rms_norm_backward = layer_norm.layer_norm_backward, rms_norm.rms_norm_backward
local ops = require "lutra.ops"

-- y's record keeps an alias of y's gradient: a reference of its own to the storage, made outside
-- the formula's temporaries. The engine then frees the gradient as usual, and the storage lives
-- until AddNormBackward used and freed the alias. (The extra reference also keeps the engine
-- from summing into that storage in place meanwhile.)
local record_output = declare {
  name = "AddNormOutput",
  record = function(cls, y, node) attach(y, {node, cls = cls}) end,
  backward = function(n, g)
    local owner = memory.set_owner(nil)
    n[1].dy = S.alias(g)
    memory.set_owner(owner)
    return engine.DELIVERED
  end,
  -- create_graph: y's gradient as it is (recorded; nothing is freed in that mode)
  double_backward = function(n, g)
    n[1].dy = g
    return engine.DELIVERED
  end,
}

-- dx (for x and residual, the same tensor), dweight, dbias of the norm of res, with dres
-- (res's own gradient, or nil) added to dx.
local function norm_grads(n, dy, dres)
  if n.center then
    return layer_norm_backward(dy, n.res, n.w, n.mean, n.rstd, dres, n[3], n[4])
  end
  local dx, dw = rms_norm_backward(dy, n.res, n.w, n.rstd, dres, n[3])
  return dx, dw, nil
end

local record_add_norm = declare {
  name = "AddNormBackward", op = "add_norm", save = {"res", "w", "mean", "rstd"},
  always = true, -- runs from y's gradient even when res got none of its own
  -- mean is nil for rms_norm.
  record = function(cls, res, y, x, residual, w, b, mean, rstd, eps)
    local node = {edge(x), edge(residual), w ~= nil and edge(w) or false, b ~= nil and edge(b) or false, cls = cls,
                  center = mean ~= nil, eps = eps}
    save_output(node, "res", res)
    if w ~= nil then save(node, "w", w) end
    if mean ~= nil then save(node, "mean", mean) end
    save(node, "rstd", rstd)
    attach(res, node)
    record_output(y, node)
  end,
  backward = function(n, g) -- g: res's own gradient (nil when it had none)
    local dy = n.dy
    n.dy = nil
    if dy == nil then -- y took no gradient: res's passes through the add
      if g == nil then return nil end
      return g, g
    end
    local ok, dx, dw, db = pcall(norm_grads, n, dy, g)
    dy:free()
    if not ok then error(dx, 0) end
    local gx = (n[1] or n[2]) and dx or nil
    return {n[1] and gx or nil, n[2] and gx or nil, dw, db}
  end,
  -- the same with recorded ops (the norms' backward_graph, from res, which this node made)
  double_backward = function(n, g)
    local dy = n.dy
    n.dy = nil
    if dy == nil then
      if g == nil then return nil end
      return g, g
    end
    local dx, dw, db
    if n.center then
      dx, dw, db = layer_norm.layer_norm_backward_graph(dy, n.res, n.w, n.eps, true, n[3], n[4])
    else
      dx, dw = rms_norm.rms_norm_backward_graph(dy, n.res, n.w, n.eps, true, n[3])
    end
    if g ~= nil then dx = ops.add(dx, g) end
    return {n[1] and dx or nil, n[2] and dx or nil, dw, db}
  end,
}

function M.add_layer_norm(x, residual, weight, bias, eps)
  need("add_layer_norm", "x", x)
  need("add_layer_norm", "residual", residual)
  tensor_or_nil("add_layer_norm", "weight", weight)
  tensor_or_nil("add_layer_norm", "bias", bias)
  local res, out = new(), new()
  local mean, rstd = row_stats(x), row_stats(x)
  if C.lt_add_layer_norm_forward(res, out, mean, rstd, x, residual, weight, bias, eps or 1e-5) ~= 0 then fail() end
  if tracked4(x, residual, weight, bias) then
    record_add_norm(res, out, x, residual, weight, bias, mean, rstd, eps or 1e-5)
  end
  return res, out, mean, rstd
end

function M.add_rms_norm(x, residual, weight, eps)
  need("add_rms_norm", "x", x)
  need("add_rms_norm", "residual", residual)
  tensor_or_nil("add_rms_norm", "weight", weight)
  local res, out = new(), new()
  local rstd = row_stats(x)
  if C.lt_add_rms_norm_forward(res, out, rstd, x, residual, weight, eps or 1e-6) ~= 0 then fail() end
  if tracked4(x, residual, weight) then record_add_norm(res, out, x, residual, weight, nil, nil, rstd, eps or 1e-6) end
  return res, out, rstd
end

return M
