-- lutra.autograd.reduce — records and backward formulas of the reductions (sum, mean,
-- max, min, prod, norm over dims, keepdim or not), var and std, softmax and log_softmax.
--
-- The gradient of a reduction is broadcast back over the reduced dims (re-inserted when
-- keepdim was false). max/min share the gradient evenly among tied maxima (as torch's
-- amax); prod handles zeros (one zero: the product of the others; more: zero).
local S = require "lutra.autograd.state"
local U = require "lutra.autograd.util"
local ops = require "lutra.ops"
local F = require "lutra.functional"
local dtype = require "lutra.dtype"

local edge, attach, save, save_output, class = S.edge, S.attach, S.save, S.save_output, S.class
local shape_of, expand_back, reduced_dims, count = U.shape_of, U.expand_back, U.reduced_dims, U.count
local R = ops.REDUCE
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

local Sum = class("SumBackward")
function Sum.backward(n, g) return back(n, g) end

local Mean = class("MeanBackward")
function Mean.backward(n, g) return back(n, div(g, count(n.dims, n.shape))) end

-- max/min: the gradient goes to the elements equal to the result, split among ties.
local Extremum = class("MaxMinBackward", {"x", "y"})
function Extremum.backward(n, g)
  local hit = n.x:eq(kept(n, n.y)):to(dtype.name(n.x.dtype_))
  local ties = ops.sum(hit, n.dims, true)
  return mul(hit, div(kept(n, g), ties))
end

local Prod = class("ProdBackward", {"x", "y"})
function Prod.backward(n, g)
  local x, y = n.x, n.y
  local gk, yk = kept(n, g), kept(n, y)
  local is_zero = x:eq(0)
  local zeros = ops.sum(is_zero:to(dtype.name(x.dtype_)), n.dims, true)
  -- no zero in the slice: y / x; one zero: the product of the others at the zero, 0 elsewhere
  local others = ops.prod(where(is_zero, 1, x), n.dims, true)
  local plain = div(yk, where(is_zero, 1, x))
  local d = where(zeros:eq(0), plain, where(zeros:eq(1), where(is_zero, others, 0), 0))
  return mul(gk, d)
end

local Norm = class("NormBackward", {"x", "y"})
function Norm.backward(n, g) -- x / |x|, 0 where |x| == 0
  local y = n.y
  local gy = where(y:eq(0), 0, div(g, y))
  return mul(expand_back(gy, n.dims, n.keepdim, n.shape), n.x)
end

function S.reduce(out, a, op, dims, keepdim)
  if op == R.sum then
    attach(out, node_of(Sum, a, dims, keepdim))
  elseif op == R.mean then
    attach(out, node_of(Mean, a, dims, keepdim))
  else
    local cls = (op == R.max or op == R.min) and Extremum or op == R.prod and Prod or Norm
    local node = node_of(cls, a, dims, keepdim)
    save(node, "x", "ver_x", a)
    save_output(node, "y", "ver_y", out)
    attach(out, node)
  end
end

-- ---- var, std ---------------------------------------------------------------------------

local Var = class("VarBackward", {"x"})
function Var.backward(n, g) -- 2 (x - mean) / (N - correction)
  local x = n.x
  local centered = sub(x, ops.mean(x, n.dims, true))
  return mul(centered, back(n, div(g, (count(n.dims, n.shape) - n.correction) / 2)))
end

local Std = class("StdBackward", {"x", "y"})
function Std.backward(n, g) -- (x - mean) / ((N - correction) std), 0 where std == 0
  local x, y = n.x, n.y
  local centered = sub(x, ops.mean(x, n.dims, true))
  local gy = where(y:eq(0), 0, div(g, mul(y, count(n.dims, n.shape) - n.correction)))
  return mul(centered, back(n, gy))
end

function S.var_std(out, a, name, dims, keepdim, correction)
  local node = node_of(name == "std" and Std or Var, a, dims, keepdim)
  node.correction = correction
  save(node, "x", "ver_x", a)
  if name == "std" then save_output(node, "y", "ver_y", out) end
  attach(out, node)
end

-- ---- softmax, log_softmax -------------------------------------------------------------------

local Softmax = class("SoftmaxBackward", {"y"})
function Softmax.backward(n, g) return F.softmax_backward(g, n.y, n.dim) end

local LogSoftmax = class("LogSoftmaxBackward", {"y"})
function LogSoftmax.backward(n, g) return F.log_softmax_backward(g, n.y, n.dim) end

function S.softmax(out, a, name, dim)
  local node = {edge(a), cls = name == "softmax" and Softmax or LogSoftmax, dim = dim}
  save_output(node, "y", "ver_y", out)
  attach(out, node)
end

return {}
