-- lutra.autograd.add_norm — the declaration of add_layer_norm and add_rms_norm:
-- res = x + residual, y = norm(res), registered as "add_norm" in lutra.autograd.op's records.
--
-- Two outputs that both take gradients. res carries the op's node (AddNormBackward: edges x,
-- residual, weight, bias); y's record (AddNormOutput) hands y's gradient to that node, as
-- checkpoint's outputs do. The node runs once res's own gradient (from its other uses) and y's
-- have both arrived, and one kernel gives dx = norm_backward(dy) + dres for x and residual.
local op = require "lutra.autograd.op"
local S = require "lutra.autograd.state"
local engine = require "lutra.autograd.engine"
local F = require "lutra.functional"
local memory = require "lutra.memory"

local declare, edge, attach, save, save_output = op.declare, op.edge, op.attach, op.save, op.save_output

-- It keeps an alias of y's gradient: a reference of its own to the storage, made outside the
-- formula's temporaries. The engine then frees the gradient as usual, and the storage lives
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
}

-- dx (for x and residual, the same tensor), dweight, dbias of the norm of res, with dres
-- (res's own gradient, or nil) added to dx.
local function norm_grads(n, dy, dres)
  if n.center then
    return F.layer_norm_backward(dy, n.res, n.w, n.mean, n.rstd, dres, n[3], n[4])
  end
  local dx, dw = F.rms_norm_backward(dy, n.res, n.w, n.rstd, dres, n[3])
  return dx, dw, nil
end

declare {
  name = "AddNormBackward", op = "add_norm", save = {"res", "w", "mean", "rstd"},
  always = true, -- runs from y's gradient even when res got none of its own
  -- mean is nil for rms_norm.
  record = function(cls, res, y, x, residual, w, b, mean, rstd)
    local node = {edge(x), edge(residual), w ~= nil and edge(w) or false, b ~= nil and edge(b) or false, cls = cls,
                  center = mean ~= nil}
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
}

return {}
