-- lutra.functional.clamp — clamp with number or tensor bounds, and torch's names for its halves.
--
--   F.clamp(x, min, max, out)   -> min(max(x, min), max); min, max: numbers, tensors or nil (not both)
--   F.clamp_min(x, min), F.clamp_max(x, max)   one bound; F.clip = F.clamp (torch's alias)
--   F.clamp_(x, min, max), F.clamp_min_, F.clamp_max_, F.clip_   the same, written into x
--
-- Number bounds run the C clamp (lt_clamp, lutra/ops/elementwise.lua's clamp). Tensor bounds have
-- x's dtype and device (no promotion) and broadcast with x, as torch's: the result has the
-- broadcast shape; a number beside a tensor bound becomes a 0-d tensor of x's dtype. A NaN in x, or
-- in a tensor bound, gives NaN; min > max gives max. Gradients as torch's: x's passes where
-- min <= x <= max (so not where x is NaN); min's where x < min < max; max's where x > max or
-- max < min; each summed back to its input's shape.
local errors = require "lutra.errors"
local ops = require "lutra.ops"
local op = require "lutra.autograd.op"
local U = require "lutra.functional.util"
local AU = require "lutra.autograd.util"
local create = require "lutra.create"

local M = {}

local raise = errors.raise
local need, tracked, edge_or_false = U.need, U.tracked, U.edge_or_false
local edge, attach, save = op.edge, op.attach, op.save
local is_tensor, where, maximum, minimum = ops.is_tensor, ops.where, ops.maximum, ops.minimum
local shape_of, shape_if_broadcast, reduce_to = AU.shape_of, AU.shape_if_broadcast, AU.reduce_to

local record_clamp -- the declaration's, below

-- a bound as given (nil, a number) or checked against x (a tensor of x's dtype and device)
local function bound(name, what, b, x)
  if b == nil or type(b) == "number" then return b end
  if not is_tensor(b) then
    raise(string.format("%s: %s must be a number, a tensor or nil, got %s", name, what, type(b)))
  end
  if b.dtype ~= x.dtype or b.device ~= x.device then
    raise(string.format("%s: %s is %s on %s, expected x's dtype and device (%s on %s)", name, what, b.dtype, b.device,
      x.dtype, x.device))
  end
  return b
end

-- a number bound beside a tensor one: a 0-d tensor of x's dtype and device
local function as_tensor(b, x)
  if type(b) ~= "number" then return b end
  return create.full({}, b, {dtype = x.dtype, device = x.device})
end

local function clamp_tensors(x, lo, hi)
  local y = op.untracked(function()
    local y = x
    if lo ~= nil then y = maximum(y, lo) end
    if hi ~= nil then y = minimum(y, hi) end
    return y
  end)
  if tracked(x, lo, hi) then record_clamp(y, x, lo, hi) end
  return y
end

local function clamp(name, x, lo, hi, out)
  need(name, "x", x)
  lo, hi = bound(name, "min", lo, x), bound(name, "max", hi, x)
  if lo == nil and hi == nil then raise(name .. ": at least one of min and max must be given") end
  if not is_tensor(lo) and not is_tensor(hi) then return ops.clamp(x, lo, hi, out) end
  local y = clamp_tensors(x, as_tensor(lo, x), as_tensor(hi, x))
  if out == nil then return y end
  need(name, "out", out)
  if table.concat(out.shape, ",") ~= table.concat(y.shape, ",") then
    raise(string.format("%s: out has shape [%s], expected [%s]", name, table.concat(out.shape, ","),
      table.concat(y.shape, ",")))
  end
  return out:copy_(y)
end

local function clamp_(name, x, lo, hi)
  need(name, "x", x)
  if not is_tensor(lo) and not is_tensor(hi) then
    bound(name, "min", lo, x)
    bound(name, "max", hi, x)
    if lo == nil and hi == nil then raise(name .. ": at least one of min and max must be given") end
    return ops.clamp_(x, lo, hi)
  end
  -- tensor bounds: clamped from a copy when recording (the node keeps x, which the write changes)
  local src = tracked(x, is_tensor(lo) and lo or nil, is_tensor(hi) and hi or nil) and x:clone() or x
  local y = clamp(name, src, lo, hi)
  if table.concat(y.shape, ",") ~= table.concat(x.shape, ",") then
    raise(string.format("%s: the bounds broadcast x [%s] to [%s]; in place, x's shape must not change", name,
      table.concat(x.shape, ","), table.concat(y.shape, ",")))
  end
  return x:copy_(y)
end

-- x:clamp(min, max, out): min(max(x, min), max); min and max are numbers, tensors (broadcasting) or nil.
function M.clamp(x, min, max, out) return clamp("clamp", x, min, max, out) end
-- x:clip(min, max, out): torch's alias of clamp.
function M.clip(x, min, max, out) return clamp("clip", x, min, max, out) end
-- x:clamp_min(min, out): max(x, min), min a number or a tensor.
function M.clamp_min(x, min, out)
  if min == nil then raise("clamp_min: min must be a number or a tensor, got nil") end
  return clamp("clamp_min", x, min, nil, out)
end
-- x:clamp_max(max, out): min(x, max), max a number or a tensor.
function M.clamp_max(x, max, out)
  if max == nil then raise("clamp_max: max must be a number or a tensor, got nil") end
  return clamp("clamp_max", x, nil, max, out)
end
-- x:clamp_(min, max): x:clamp written into x (the bounds must not broadcast x to a larger shape).
function M.clamp_(x, min, max) return clamp_("clamp_", x, min, max) end
-- x:clip_(min, max): torch's alias of clamp_.
function M.clip_(x, min, max) return clamp_("clip_", x, min, max) end
-- x:clamp_min_(min): x:clamp_min written into x.
function M.clamp_min_(x, min)
  if min == nil then raise("clamp_min_: min must be a number or a tensor, got nil") end
  return clamp_("clamp_min_", x, min, nil)
end
-- x:clamp_max_(max): x:clamp_max written into x.
function M.clamp_max_(x, max)
  if max == nil then raise("clamp_max_: max must be a number or a tensor, got nil") end
  return clamp_("clamp_max_", x, nil, max)
end

-- torch's clamp_backward and clamp_backward_min_max (derivatives.yaml), masks by nested where
record_clamp = op.declare {
  name = "ClampTensorBackward", save = {"x", "lo", "hi"}, twice_differentiable = true, -- masks and sums
  record = function(cls, out, x, lo, hi)
    local node = {edge(x), edge_or_false(lo), edge_or_false(hi), cls = cls, sx = shape_if_broadcast(x, out)}
    save(node, "x", x)
    if lo ~= nil then
      save(node, "lo", lo)
      node.slo = shape_of(lo)
    end
    if hi ~= nil then
      save(node, "hi", hi)
      node.shi = shape_of(hi)
    end
    attach(out, node)
  end,
  backward = function(n, g)
    local x, lo, hi = n.x, n.lo, n.hi
    local gx, glo, ghi
    if n[1] then
      gx = g
      if lo ~= nil then gx = where(x:ge(lo), gx, 0) end
      if hi ~= nil then gx = where(x:le(hi), gx, 0) end
      gx = reduce_to(gx, n.sx)
    end
    if n[2] then
      glo = where(x:lt(lo), g, 0)
      if hi ~= nil then glo = where(lo:lt(hi), glo, 0) end
      glo = reduce_to(glo, n.slo)
    end
    if n[3] then
      ghi = where(x:gt(hi), g, 0)
      if lo ~= nil then ghi = where(hi:lt(lo), g, ghi) end
      ghi = reduce_to(ghi, n.shi)
    end
    return gx, glo, ghi
  end,
}

return M
