-- lutra.autograd.reduce — the declarations of the reductions (sum, mean, max, min, prod,
-- norm over dims, keepdim or not), var and std, softmax and log_softmax. Registered in
-- lutra.autograd.op's records under the op's name ("sum", "max", "var", "softmax", ...).
--
-- The gradient of a reduction is broadcast back over the reduced dims (re-inserted when
-- keepdim was false). max/min share the gradient evenly among tied maxima (as torch's
-- amax); prod handles zeros (one zero: the product of the others; more: zero).
local op = require "lutra.autograd.op"
local U = require "lutra.autograd.util"
local ops = require "lutra.ops"
local softmax = require "lutra.functional.softmax"
local dtype = require "lutra.dtype"
local fields = require "lutra.tensor.fields"

local declare, edge, attach, save, save_output = op.declare, op.edge, op.attach, op.save, op.save_output
local shape_of, expand_back, reduced_dims, count = U.shape_of, U.expand_back, U.reduced_dims, U.count
local mul, div, sub, where = ops.mul, ops.div, ops.sub, ops.where

local function node_of(cls, a, dims, keepdim)
  local shape = shape_of(a)
  return {edge(a), cls = cls, dims = reduced_dims(dims, #shape), keepdim = keepdim and true or false, shape = shape}
end

local function back(n, g) return expand_back(g, n.dims, n.keepdim, n.shape) end

-- g (reduced shape) with the reduced dims put back as size 1, to broadcast against x.
local function kept(n, t)
  if n.keepdim or #n.shape == 0 then return t end
  for i = 1, #n.dims do t = t:unsqueeze(n.dims[i]) end
  return t
end

local function record_plain(cls, out, a, dims, keepdim) attach(out, node_of(cls, a, dims, keepdim)) end

-- Keeps the input x and the result y.
local function record_saving(cls, out, a, dims, keepdim)
  local node = node_of(cls, a, dims, keepdim)
  save(node, "x", a)
  save_output(node, "y", out)
  attach(out, node)
end

declare {
  name = "SumBackward", twice_differentiable = true, op = "sum", record = record_plain,
  backward = function(n, g) return back(n, g) end,
}

declare {
  name = "MeanBackward", twice_differentiable = true, op = "mean", record = record_plain,
  backward = function(n, g) return back(n, div(g, count(n.dims, n.shape))) end,
}

-- max/min: the gradient goes to the elements equal to the result, split among ties.
declare {
  name = "MaxMinBackward", twice_differentiable = true, op = {"max", "min"}, save = {"x", "y"}, record = record_saving,
  backward = function(n, g)
    local hit = n.x:eq(kept(n, n.y)):to(dtype.name(fields.dtype_id(n.x)))
    local ties = ops.sum(hit, n.dims, true)
    return mul(hit, div(kept(n, g), ties))
  end,
}

declare {
  name = "ProdBackward", twice_differentiable = true, op = "prod", save = {"x", "y"}, record = record_saving,
  backward = function(n, g)
    local x, y = n.x, n.y
    local gk, yk = kept(n, g), kept(n, y)
    local is_zero = x:eq(0)
    local zeros = ops.sum(is_zero:to(dtype.name(fields.dtype_id(x))), n.dims, true)
    -- no zero in the slice: y / x; one zero: the product of the others at the zero, 0 elsewhere
    local others = ops.prod(where(is_zero, 1, x), n.dims, true)
    local plain = div(yk, where(is_zero, 1, x))
    local d = where(zeros:eq(0), plain, where(zeros:eq(1), where(is_zero, others, 0), 0))
    return mul(gk, d)
  end,
}

declare {
  name = "NormBackward", twice_differentiable = true, op = "norm", save = {"x", "y"}, record = record_saving,
  backward = function(n, g) -- x / |x|, 0 where |x| == 0
    local y = n.y
    local gy = where(y:eq(0), 0, div(g, y))
    return mul(expand_back(gy, n.dims, n.keepdim, n.shape), n.x)
  end,
}

-- ---- var, std ---------------------------------------------------------------------------

local function var_std_node(cls, a, dims, keepdim, correction)
  local node = node_of(cls, a, dims, keepdim)
  node.correction = correction
  save(node, "x", a)
  return node
end

declare {
  name = "VarBackward", twice_differentiable = true, op = "var", save = {"x"},
  record = function(cls, out, a, dims, keepdim, correction)
    attach(out, var_std_node(cls, a, dims, keepdim, correction))
  end,
  backward = function(n, g) -- 2 (x - mean) / (N - correction)
    local x = n.x
    local centered = sub(x, ops.mean(x, n.dims, true))
    return mul(centered, back(n, div(g, (count(n.dims, n.shape) - n.correction) / 2)))
  end,
}

declare {
  name = "StdBackward", twice_differentiable = true, op = "std", save = {"x", "y"},
  record = function(cls, out, a, dims, keepdim, correction)
    local node = var_std_node(cls, a, dims, keepdim, correction)
    save_output(node, "y", out)
    attach(out, node)
  end,
  backward = function(n, g) -- (x - mean) / ((N - correction) std), 0 where std == 0
    local x, y = n.x, n.y
    local centered = sub(x, ops.mean(x, n.dims, true))
    local gy = where(y:eq(0), 0, div(g, mul(y, count(n.dims, n.shape) - n.correction)))
    return mul(centered, back(n, gy))
  end,
}

-- ---- softmax, log_softmax -------------------------------------------------------------------

local function record_softmax(cls, out, a, dim)
  local node = {edge(a), cls = cls, dim = dim}
  save_output(node, "y", out)
  attach(out, node)
end

declare {
  name = "SoftmaxBackward", op = "softmax", save = {"y"}, record = record_softmax,
  backward = function(n, g) return softmax.softmax_backward(g, n.y, n.dim) end,
  double_backward = function(n, g) -- y (g - sum(g y))
    local y = n.y
    return mul(y, sub(g, ops.sum(mul(g, y), n.dim, true)))
  end,
}

declare {
  name = "LogSoftmaxBackward", op = "log_softmax", save = {"y"}, record = record_softmax,
  backward = function(n, g) return softmax.log_softmax_backward(g, n.y, n.dim) end,
  double_backward = function(n, g) return sub(g, mul(ops.exp(n.y), ops.sum(g, n.dim, true))) end, -- g - p sum(g)
}

return {}
