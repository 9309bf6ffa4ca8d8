-- lutra.autograd.elementwise — the declarations (records and backward formulas) of the
-- elementwise ops: binary (tensor op tensor, broadcasting), binary with a scalar on either
-- side, unary, clamp, where, and copies (clone, contiguous, to(dtype/device), copy_).
-- Registered in lutra.autograd.op's records under the op's name: "add", "add_scalar",
-- "exp", "clamp", "where", "copy", ...; comparisons record nothing (bool results).
--
-- Each record function runs after the forward C call, with out already computed, and
-- reads its inputs' edges before attaching the node to out (out may be an input: the
-- in-place forms). Gradients of broadcast inputs are summed back to their shapes.
--
-- Every formula here is written with recorded ops (twice_differentiable), except the unary
-- ops', which call one kernel (ops.unary_backward): their double_backward spells the same
-- derivative out with recorded ops (UNARY_GRAPH below).
local op = require "lutra.autograd.op"
local U = require "lutra.autograd.util"
local ops = require "lutra.ops"
local dtype = require "lutra.dtype"
local fields = require "lutra.tensor.fields"

local declare, edge, attach, save, save_output = op.declare, op.edge, op.attach, op.save, op.save_output
local shape_if_broadcast, reduce_to = U.shape_if_broadcast, U.reduce_to
local UN = ops.UNARY
local sub, mul, div, neg, where = ops.sub, ops.mul, ops.div, ops.neg, ops.where

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

declare {
  name = "AddBackward", twice_differentiable = true, op = "add",
  record = function(cls, out, a, b) attach(out, (binary_node(cls, out, a, b))) end,
  backward = function(n, g) return n[1] and reduce_to(g, n.sa) or nil, n[2] and reduce_to(g, n.sb) or nil end,
}

declare {
  name = "SubBackward", twice_differentiable = true, op = "sub",
  record = function(cls, out, a, b) attach(out, (binary_node(cls, out, a, b))) end,
  backward = function(n, g) return n[1] and reduce_to(g, n.sa) or nil, n[2] and reduce_to(neg(g), n.sb) or nil end,
}

declare {
  name = "MulBackward", twice_differentiable = true, op = "mul", save = {"a", "b"},
  record = function(cls, out, a, b)
    local node, ea, eb = binary_node(cls, out, a, b)
    if ea then save(node, "b", b) end
    if eb then save(node, "a", a) end
    attach(out, node)
  end,
  backward = function(n, g)
    return n[1] and reduce_to(mul(g, n.b), n.sa) or nil, n[2] and reduce_to(mul(g, n.a), n.sb) or nil
  end,
}

declare {
  name = "DivBackward", twice_differentiable = true, op = "div", save = {"a", "b"},
  record = function(cls, out, a, b)
    local node, _, eb = binary_node(cls, out, a, b)
    save(node, "b", b)
    if eb then save(node, "a", a) end
    attach(out, node)
  end,
  backward = function(n, g) -- d(a/b) = g/b, -g a/b^2
    local ga, gb
    if n[1] then ga = reduce_to(div(g, n.b), n.sa) end
    if n[2] then gb = reduce_to(neg(div(div(mul(g, n.a), n.b), n.b)), n.sb) end
    return ga, gb
  end,
}

-- Records a binary op that saves both inputs.
local function record_saving_both(cls, out, a, b)
  local node = binary_node(cls, out, a, b)
  save(node, "a", a)
  save(node, "b", b)
  attach(out, node)
end

declare {
  name = "PowBackward", twice_differentiable = true, op = "pow", save = {"a", "b"},
  record = record_saving_both,
  backward = function(n, g)
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
  end,
}

-- maximum/minimum: the gradient goes to the larger (smaller) input, half to each on ties.
local function declare_extremum(name, pick)
  local wins = pick == "maximum" and ops.gt or ops.lt
  declare {
    name = name, op = pick, save = {"a", "b"}, twice_differentiable = true,
    record = record_saving_both,
    backward = function(n, g)
      local a, b = n.a, n.b
      local tie, half = a:eq(b), mul(g, 0.5)
      local ga, gb
      if n[1] then ga = reduce_to(where(tie, half, where(wins(a, b), g, 0)), n.sa) end
      if n[2] then gb = reduce_to(where(tie, half, where(wins(b, a), g, 0)), n.sb) end
      return ga, gb
    end,
  }
end
declare_extremum("MaximumBackward", "maximum")
declare_extremum("MinimumBackward", "minimum")

-- ---- tensor op scalar (reverse: scalar op tensor) -------------------------------------

declare {
  name = "AddScalarBackward", twice_differentiable = true, op = "add_scalar",
  record = function(cls, out, a) attach(out, {edge(a), cls = cls}) end,
  backward = function(_, g) return g end,
}

declare {
  name = "SubScalarBackward", twice_differentiable = true, op = "sub_scalar",
  record = function(cls, out, a, _, reverse) attach(out, {edge(a), cls = cls, reverse = reverse}) end,
  backward = function(n, g) return n.reverse == 1 and neg(g) or g end,
}

declare {
  name = "MulScalarBackward", twice_differentiable = true, op = "mul_scalar",
  record = function(cls, out, a, s) attach(out, {edge(a), cls = cls, s = s}) end,
  backward = function(n, g) return mul(g, n.s) end,
}

declare {
  name = "DivScalarBackward", twice_differentiable = true, op = "div_scalar", save = {"a"},
  record = function(cls, out, a, s, reverse)
    local node = {edge(a), cls = cls, s = s, reverse = reverse}
    if reverse == 1 then save(node, "a", a) end
    attach(out, node)
  end,
  backward = function(n, g)
    if n.reverse == 0 then return div(g, n.s) end
    return mul(div(div(g, n.a), n.a), -n.s) -- d(s/a) = -s/a^2
  end,
}

-- Records a scalar op that saves its tensor input.
local function record_scalar_saving(cls, out, a, s, reverse)
  local node = {edge(a), cls = cls, s = s, reverse = reverse}
  save(node, "a", a)
  attach(out, node)
end

declare {
  name = "PowScalarBackward", twice_differentiable = true, op = "pow_scalar", save = {"a"},
  record = record_scalar_saving,
  backward = function(n, g)
    local a, s = n.a, n.s
    if n.reverse == 0 then -- a^s: s a^(s-1)
      if s == 0 then return mul(g, 0) end
      return mul(g, mul(ops.pow(a, s - 1), s))
    end
    -- s^a: s^a log s (0 where s == 0 and a >= 0)
    local d = mul(ops.binary(s, a, ops.BINARY.pow), math.log(s))
    if s == 0 then d = where(a:ge(0), 0, d) end
    return mul(g, d)
  end,
}

local function declare_extremum_scalar(name, pick)
  local wins = pick == "maximum" and ops.gt or ops.lt
  declare {
    name = name, op = pick .. "_scalar", save = {"a"}, twice_differentiable = true,
    record = record_scalar_saving,
    backward = function(n, g) return where(n.a:eq(n.s), mul(g, 0.5), where(wins(n.a, n.s), g, 0)) end,
  }
end
declare_extremum_scalar("MaximumScalarBackward", "maximum")
declare_extremum_scalar("MinimumScalarBackward", "minimum")

-- ---- unary ----------------------------------------------------------------------------

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

-- The same with recorded ops (relu's mask instead of its kernel).
local from_output_graph = setmetatable({
  [UN.relu] = function(y, g) return where(y:gt(0), g, 0) end,
}, {__index = from_output})

-- grad * op'(x) with recorded ops, as the kernel computes it (host/ops/unary.c).
local GELU_K, GELU_C = 0.7978845608028654, 0.044715
local SQRT1_2, TWO_OVER_SQRTPI, INV_SQRT_2PI = 0.7071067811865476, 1.1283791670955126, 0.3989422804014327
local UNARY_GRAPH = {
  exp = function(x, g) return mul(g, ops.exp(x)) end,
  log = function(x, g) return div(g, x) end,
  sqrt = function(x, g) return div(mul(g, 0.5), ops.sqrt(x)) end,
  rsqrt = function(x, g) return div(mul(g, -0.5), mul(x, ops.sqrt(x))) end,
  tanh = function(x, g)
    local t = ops.tanh(x)
    return mul(g, sub(1, mul(t, t)))
  end,
  sigmoid = function(x, g)
    local s = ops.sigmoid(x)
    return mul(g, mul(s, sub(1, s)))
  end,
  relu = function(x, g) return where(x:gt(0), g, 0) end,
  gelu = function(x, g) -- the tanh approximation's derivative
    local x2 = mul(x, x)
    local t = ops.tanh(mul(ops.add(x, mul(mul(x2, x), GELU_C)), GELU_K))
    local d = ops.add(mul(ops.add(t, 1), 0.5),
      mul(mul(mul(x, 0.5), sub(1, mul(t, t))), mul(ops.add(mul(x2, 3 * GELU_C), 1), GELU_K)))
    return mul(g, d)
  end,
  silu = function(x, g)
    local s = ops.sigmoid(x)
    return mul(g, mul(s, ops.add(mul(x, sub(1, s)), 1)))
  end,
  abs = function(x, g) return where(x:gt(0), g, where(x:lt(0), neg(g), 0)) end,
  sin = function(x, g) return mul(g, ops.cos(x)) end,
  cos = function(x, g) return neg(mul(g, ops.sin(x))) end,
  square = function(x, g) return mul(mul(g, x), 2) end,
  reciprocal = function(x, g) return neg(div(g, mul(x, x))) end,
  erf = function(x, g) return mul(mul(g, TWO_OVER_SQRTPI), ops.exp(neg(mul(x, x)))) end,
  gelu_erf = function(x, g) -- Phi(x) + x phi(x)
    local cdf = mul(ops.add(ops.erf(mul(x, SQRT1_2)), 1), 0.5)
    return mul(g, ops.add(cdf, mul(mul(x, INV_SQRT_2PI), ops.exp(mul(mul(x, x), -0.5)))))
  end,
}

local record_unary_inplace = declare {
  name = "InplaceUnaryBackward", save = {"y"},
  double_backward = function(n, g) return from_output_graph[n.op](n.y, g) end,
  record = function(cls, out, a, code)
    local node = {edge(a), cls = cls, op = code}
    save_output(node, "y", out)
    attach(out, node)
  end,
  backward = function(n, g) return from_output[n.op](n.y, g) end,
}

-- grad_in = grad_out * op'(x) by the C kernel, from the saved input; neg needs nothing.
for name, code in pairs(UN) do
  local keeps_x = code ~= UN.neg
  assert(not keeps_x or UNARY_GRAPH[name], name .. ": no double backward formula")
  local in_place_from_output = from_output[code] ~= nil
  declare {
    name = name:sub(1, 1):upper() .. name:sub(2) .. "Backward", op = name, save = keeps_x and {"x"} or nil,
    record = function(cls, out, a)
      if out == a and in_place_from_output then return record_unary_inplace(out, a, code) end
      local node = {edge(a), cls = cls}
      if keeps_x then save(node, "x", a) end
      attach(out, node)
    end,
    backward = keeps_x and function(n, g) return ops.unary_backward(g, n.x, name) end
      or function(_, g) return neg(g) end,
    double_backward = keeps_x and function(n, g) return UNARY_GRAPH[name](n.x, g) end
      or function(_, g) return neg(g) end,
  }
end

-- ---- clamp, where -------------------------------------------------------------------------

local record_clamp_inplace = declare {
  name = "InplaceClampBackward", twice_differentiable = true, save = {"y"},
  record = function(cls, out, a, lo, hi) -- clamp_: x is gone, the output tells where it was inside (strictly)
    local node = {edge(a), cls = cls, lo = lo, hi = hi}
    save_output(node, "y", out)
    attach(out, node)
  end,
  backward = function(n, g)
    if n.lo ~= nil then g = where(n.y:le(n.lo), 0, g) end
    if n.hi ~= nil then g = where(n.y:ge(n.hi), 0, g) end
    return g
  end,
}

declare {
  name = "ClampBackward", twice_differentiable = true, op = "clamp", save = {"x"},
  record = function(cls, out, a, lo, hi)
    if out == a then return record_clamp_inplace(out, a, lo, hi) end
    local node = {edge(a), cls = cls, lo = lo, hi = hi}
    save(node, "x", a)
    attach(out, node)
  end,
  backward = function(n, g) -- passes where lo <= x <= hi (not where x is NaN, as torch)
    if n.lo ~= nil then g = where(n.x:ge(n.lo), g, 0) end
    if n.hi ~= nil then g = where(n.x:le(n.hi), g, 0) end
    return g
  end,
}

declare {
  name = "WhereBackward", twice_differentiable = true, op = "where", save = {"cond"},
  record = function(cls, out, cond, a, b)
    local node = binary_node(cls, out, a, b)
    save(node, "cond", cond)
    attach(out, node)
  end,
  backward = function(n, g)
    local ga, gb
    if n[1] then ga = reduce_to(where(n.cond, g, 0), n.sa) end
    if n[2] then gb = reduce_to(where(n.cond, 0, g), n.sb) end
    return ga, gb
  end,
}

-- ---- copies -------------------------------------------------------------------------------

-- out is a copy of src (clone, contiguous, to, copy_): converted and broadcast.
declare {
  name = "CopyBackward", twice_differentiable = true, op = "copy",
  record = function(cls, out, src)
    if not dtype.is_float(fields.dtype_id(out)) then return op.clear(out) end
    attach(out, {edge(src), cls = cls, shape = shape_if_broadcast(src, out), dt = fields.dtype_id(src),
      dev = fields.device_id(src)})
  end,
  backward = function(n, g)
    g = reduce_to(g, n.shape)
    if fields.dtype_id(g) ~= n.dt or fields.device_id(g) ~= n.dev then
      g = g:to(dtype.name(n.dt), dtype.device_name(n.dev))
    end
    return g
  end,
}

return {}
