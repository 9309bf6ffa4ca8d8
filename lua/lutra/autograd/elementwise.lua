-- lutra.autograd.elementwise — records and backward formulas of the elementwise ops:
-- binary (tensor op tensor, broadcasting), binary with a scalar on either side, unary,
-- clamp, where, and copies (clone, contiguous, to(dtype/device), copy_).
--
-- Each record function runs after the forward C call, with out already computed, and
-- reads its inputs' edges before attaching the node to out (out may be an input: the
-- in-place forms). Gradients of broadcast inputs are summed back to their shapes.
local S = require "lutra.autograd.state"
local U = require "lutra.autograd.util"
local ops = require "lutra.ops"
local dtype = require "lutra.dtype"

local edge, attach, save, save_output, class = S.edge, S.attach, S.save, S.save_output, S.class
local shape_if_broadcast, reduce_to = U.shape_if_broadcast, U.reduce_to
local B, UN = ops.BINARY, ops.UNARY
local add, sub, mul, div, neg, where = ops.add, ops.sub, ops.mul, ops.div, ops.neg, ops.where

local function nothing(out) S.clear(out) end -- comparisons: bool results, no gradient

-- ---- tensor op tensor -----------------------------------------------------------------

-- The node of a binary op: edges, and the input shapes when they were broadcast.
local function binary_node(cls, out, a, b)
  local ea, eb = edge(a), edge(b)
  local node = {ea, eb, cls = cls} -- sa/sb only when broadcast: a smaller table in the common case
  if ea then
    local sa = shape_if_broadcast(a, out)
    if sa then node.sa = sa end
  end
  if eb then
    local sb = shape_if_broadcast(b, out)
    if sb then node.sb = sb end
  end
  return node, ea, eb
end

local Add = class("AddBackward")
S.binary[B.add] = function(out, a, b) attach(out, (binary_node(Add, out, a, b))) end
function Add.backward(n, g)
  return n[1] and reduce_to(g, n.sa) or nil, n[2] and reduce_to(g, n.sb) or nil
end

local Sub = class("SubBackward")
S.binary[B.sub] = function(out, a, b) attach(out, (binary_node(Sub, out, a, b))) end
function Sub.backward(n, g)
  return n[1] and reduce_to(g, n.sa) or nil, n[2] and reduce_to(neg(g), n.sb) or nil
end

local Mul = class("MulBackward", {"a", "b"})
S.binary[B.mul] = function(out, a, b)
  local node, ea, eb = binary_node(Mul, out, a, b)
  if ea then save(node, "b", "ver_b", b) end
  if eb then save(node, "a", "ver_a", a) end
  attach(out, node)
end
function Mul.backward(n, g)
  return n[1] and reduce_to(mul(g, n.b), n.sa) or nil, n[2] and reduce_to(mul(g, n.a), n.sb) or nil
end

local Div = class("DivBackward", {"a", "b"})
S.binary[B.div] = function(out, a, b)
  local node, ea, eb = binary_node(Div, out, a, b)
  save(node, "b", "ver_b", b)
  if eb then save(node, "a", "ver_a", a) end
  attach(out, node)
end
function Div.backward(n, g) -- d(a/b) = g/b, -g a/b^2
  local ga, gb
  if n[1] then ga = reduce_to(div(g, n.b), n.sa) end
  if n[2] then gb = reduce_to(neg(div(div(mul(g, n.a), n.b), n.b)), n.sb) end
  return ga, gb
end

local Pow = class("PowBackward", {"a", "b"})
S.binary[B.pow] = function(out, a, b)
  local node = binary_node(Pow, out, a, b)
  save(node, "a", "ver_a", a)
  save(node, "b", "ver_b", b)
  attach(out, node)
end
function Pow.backward(n, g)
  local a, b = n.a, n.b
  local ga, gb
  if n[1] then -- g b a^(b-1), 0 where b == 0 (as torch: no 0 * inf)
    local d = mul(b, ops.pow(a, sub(b, 1)))
    ga = reduce_to(mul(g, where(b:eq(0), 0, d)), n.sa)
  end
  if n[2] then -- g a^b log a, 0 where a == 0 and b >= 0
    local d = mul(ops.pow(a, b), ops.log(a))
    d = where(a:eq(0), where(b:ge(0), 0, d), d)
    gb = reduce_to(mul(g, d), n.sb)
  end
  return ga, gb
end

-- maximum/minimum: the gradient goes to the larger (smaller) input, half to each on ties.
local function extremum(name, pick)
  local cls = class(name, {"a", "b"})
  S.binary[B[pick]] = function(out, a, b)
    local node = binary_node(cls, out, a, b)
    save(node, "a", "ver_a", a)
    save(node, "b", "ver_b", b)
    attach(out, node)
  end
  local wins = pick == "maximum" and ops.gt or ops.lt
  function cls.backward(n, g)
    local a, b = n.a, n.b
    local tie, half = a:eq(b), mul(g, 0.5)
    local ga, gb
    if n[1] then ga = reduce_to(where(tie, half, where(wins(a, b), g, 0)), n.sa) end
    if n[2] then gb = reduce_to(where(tie, half, where(wins(b, a), g, 0)), n.sb) end
    return ga, gb
  end
end
extremum("MaximumBackward", "maximum")
extremum("MinimumBackward", "minimum")

for _, name in ipairs {"eq", "ne", "lt", "le", "gt", "ge"} do
  S.binary[B[name]] = nothing
  S.scalar[B[name]] = nothing
end

-- ---- tensor op scalar (reverse: scalar op tensor) -------------------------------------

local AddS = class("AddScalarBackward")
S.scalar[B.add] = function(out, a) attach(out, {edge(a), cls = AddS}) end

local SubS = class("SubScalarBackward")
S.scalar[B.sub] = function(out, a, s, reverse) attach(out, {edge(a), cls = SubS, reverse = reverse}) end
function SubS.backward(n, g) return n.reverse == 1 and neg(g) or g end

local MulS = class("MulScalarBackward")
S.scalar[B.mul] = function(out, a, s) attach(out, {edge(a), cls = MulS, s = s}) end
function MulS.backward(n, g) return mul(g, n.s) end

local DivS = class("DivScalarBackward", {"a"})
S.scalar[B.div] = function(out, a, s, reverse)
  local node = {edge(a), cls = DivS, s = s, reverse = reverse}
  if reverse == 1 then save(node, "a", "ver_a", a) end
  attach(out, node)
end
function DivS.backward(n, g)
  if n.reverse == 0 then return div(g, n.s) end
  return mul(div(div(g, n.a), n.a), -n.s) -- d(s/a) = -s/a^2
end

local PowS = class("PowScalarBackward", {"a"})
S.scalar[B.pow] = function(out, a, s, reverse)
  local node = {edge(a), cls = PowS, s = s, reverse = reverse}
  save(node, "a", "ver_a", a)
  attach(out, node)
end
function PowS.backward(n, g)
  local a, s = n.a, n.s
  if n.reverse == 0 then -- a^s: s a^(s-1)
    if s == 0 then return mul(g, 0) end
    return mul(g, mul(ops.pow(a, s - 1), s))
  end
  -- s^a: s^a log s (0 where s == 0 and a >= 0)
  local d = mul(ops.binary(s, a, B.pow), math.log(s))
  if s == 0 then d = where(a:ge(0), 0, d) end
  return mul(g, d)
end

local function extremum_scalar(name, pick)
  local cls = class(name, {"a"})
  S.scalar[B[pick]] = function(out, a, s)
    local node = {edge(a), cls = cls, s = s}
    save(node, "a", "ver_a", a)
    attach(out, node)
  end
  local wins = pick == "maximum" and ops.gt or ops.lt
  function cls.backward(n, g)
    return where(n.a:eq(n.s), mul(g, 0.5), where(wins(n.a, n.s), g, 0))
  end
end
extremum_scalar("MaximumScalarBackward", "maximum")
extremum_scalar("MinimumScalarBackward", "minimum")

function AddS.backward(n, g) return g end

-- ---- unary ----------------------------------------------------------------------------

-- grad_in = grad_out * op'(x) by the C kernel, from the saved input; neg needs nothing.
local unary_classes = {}
for name, op in pairs(UN) do
  local cls = class(name:sub(1, 1):upper() .. name:sub(2) .. "Backward", op ~= UN.neg and {"x"} or nil)
  cls.backward = function(n, g) return ops.unary_backward(g, n.x, name) end
  unary_classes[op] = cls
end
unary_classes[UN.neg].backward = function(n, g) return neg(g) end

-- In place (out is x), ops whose derivative the output gives keep the output instead.
local from_output = {
  [UN.exp] = function(y, g) return mul(g, y) end,
  [UN.relu] = function(y, g) return ops.unary_backward(g, y, "relu") end,
  [UN.sigmoid] = function(y, g) return mul(g, mul(y, sub(1, y))) end,
  [UN.tanh] = function(y, g) return mul(g, sub(1, mul(y, y))) end,
  [UN.sqrt] = function(y, g) return div(mul(g, 0.5), y) end,
  [UN.rsqrt] = function(y, g) return mul(g, mul(mul(y, mul(y, y)), -0.5)) end,
  [UN.reciprocal] = function(y, g) return neg(mul(g, mul(y, y))) end,
}
local UnaryOut = class("InplaceUnaryBackward", {"y"})
function UnaryOut.backward(n, g) return from_output[n.op](n.y, g) end

for op, cls in pairs(unary_classes) do
  S.unary[op] = function(out, a)
    local ea = edge(a)
    if out == a and from_output[op] then
      local node = {ea, cls = UnaryOut, op = op}
      save_output(node, "y", "ver_y", out)
      attach(out, node)
      return
    end
    local node = {ea, cls = cls}
    if op ~= UN.neg then save(node, "x", "ver_x", a) end
    attach(out, node)
  end
end

-- ---- clamp, where -------------------------------------------------------------------------

local Clamp = class("ClampBackward", {"x"})
local ClampOut = class("InplaceClampBackward", {"y"})
function S.clamp(out, a, lo, hi)
  if out == a then -- clamp_: x is gone, the output tells where it was inside (strictly)
    local node = {edge(a), cls = ClampOut, lo = lo, hi = hi}
    save_output(node, "y", "ver_y", out)
    return attach(out, node)
  end
  local node = {edge(a), cls = Clamp, lo = lo, hi = hi}
  save(node, "x", "ver_x", a)
  attach(out, node)
end
function Clamp.backward(n, g) -- passes where lo <= x <= hi
  if n.lo ~= nil then g = where(n.x:lt(n.lo), 0, g) end
  if n.hi ~= nil then g = where(n.x:gt(n.hi), 0, g) end
  return g
end
function ClampOut.backward(n, g)
  if n.lo ~= nil then g = where(n.y:le(n.lo), 0, g) end
  if n.hi ~= nil then g = where(n.y:ge(n.hi), 0, g) end
  return g
end

local Where = class("WhereBackward", {"cond"})
function S.where(out, cond, a, b)
  local node = binary_node(Where, out, a, b)
  save(node, "cond", "ver_cond", cond)
  attach(out, node)
end
function Where.backward(n, g)
  local ga, gb
  if n[1] then ga = reduce_to(where(n.cond, g, 0), n.sa) end
  if n[2] then gb = reduce_to(where(n.cond, 0, g), n.sb) end
  return ga, gb
end

-- ---- copies -------------------------------------------------------------------------------

-- out is a copy of src (clone, contiguous, to, copy_): converted and broadcast.
local Copy = class("CopyBackward")
function S.copy(out, src)
  if not dtype.is_float(out.dtype_) then return S.clear(out) end
  attach(out, {edge(src), cls = Copy, shape = shape_if_broadcast(src, out), dt = src.dtype_, dev = src.device_})
end
function Copy.backward(n, g)
  g = reduce_to(g, n.shape)
  if g.dtype_ ~= n.dt or g.device_ ~= n.dev then g = g:to(dtype.name(n.dt), dtype.device_name(n.dev)) end
  return g
end

return {unary_classes = unary_classes}
