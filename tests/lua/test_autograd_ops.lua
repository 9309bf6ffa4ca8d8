-- Autograd, elementwise ops: finite-difference gradient checks in f64 (lutra.testing.gradcheck:
-- analytic gradient of a random projection of the outputs against central differences) for
-- every binary op (tensor op tensor with broadcasting, scalars on either side), every unary
-- op, clamp, where, copies and conversions; on random shapes, with non-contiguous inputs;
-- and f32 gradients against the f64 ones.
local lt = require "lutra"
local T = require "lutra.testing"
local check, close, equal, fails = T.gradcheck, T.assert_close, T.assert_equal, T.assert_error

local function ri(lo, hi) return T.randint(lo, hi + 1) end

-- A leaf f64 tensor of the given shape that requires grad; contiguous or not (a
-- transposed view of a tensor of the reversed shape).
local function leaf(shape, opts)
  opts = opts or {}
  local t
  if opts.noncontig and #shape >= 2 then
    local rev = {}
    for i = #shape, 1, -1 do rev[#rev + 1] = shape[i] end
    local dims = {}
    for i = #shape, 1, -1 do dims[#dims + 1] = i - 1 end
    t = lt.tensor(T.random_list(rev), {dtype = "f64"}):permute(dims)
  else
    t = lt.tensor(T.random_list(shape), {dtype = "f64"})
  end
  if opts.positive then t = lt.no_grad(function() return t:abs() + 0.5 end) end
  if opts.away then -- away from 0 (kinks of abs/relu/...)
    t = lt.no_grad(function() return lt.where(t:ge(0), t + 0.2, t - 0.2) end)
  end
  return t:requires_grad_()
end

local function random_shape(nd)
  local s = {}
  for i = 1, nd do s[i] = ri(2, 4) end
  return s
end

test("binary ops: same shapes, broadcasting both ways, non-contiguous inputs", function()
  local ops = {
    add = function(a, b) return a + b end,
    sub = function(a, b) return a - b end,
    mul = function(a, b) return a * b end,
    div = function(a, b) return a / b end,
    pow = function(a, b) return a ^ b end,
    maximum = function(a, b) return lt.maximum(a, b) end,
    minimum = function(a, b) return a:minimum(b) end,
  }
  for name, f in pairs(ops) do
    for trial = 1, 3 do
      local shape = random_shape(ri(1, 3))
      local bshape = {}
      for i = 1, #shape do bshape[i] = T.uniform() < 0.5 and 1 or shape[i] end -- broadcast some dims
      if trial == 2 then bshape = {shape[#shape]} end -- fewer dims
      local pos = name == "pow" or name == "div"
      local a = leaf(shape, {noncontig = trial == 3, positive = name == "pow"})
      local b = leaf(bshape, {positive = pos})
      if trial == 2 then a, b = b, a end -- the broadcast one first
      check(f, {a, b}, {msg = name .. " trial " .. trial})
    end
  end
end)

test("binary ops with a scalar on either side", function()
  local x = leaf({3, 4}, {positive = true})
  check(function(a) return a + 2, 2 + a, a - 3, 3 - a, a * 1.5, 1.5 * a, a / 4, 4 / a end, {x})
  check(function(a) return a ^ 2.5, a ^ 0, 2 ^ a, a:maximum(1), a:minimum(1) end, {x})
  check(function(a) return -a, a:neg() end, {leaf({5})})
  -- only the tensor side gets a gradient; comparisons give none
  local y = leaf({4})
  local c = y:gt(0)
  equal(c.requires_grad, false)
  equal(c.grad_fn, nil)
end)

test("maximum/minimum: ties share the gradient evenly", function()
  local a = lt.tensor({1, 2, 3}, {dtype = "f64", requires_grad = true})
  local b = lt.tensor({1, 1, 4}, {dtype = "f64", requires_grad = true})
  lt.maximum(a, b):sum():backward()
  equal(a.grad:tolist(), {0.5, 1, 0})
  equal(b.grad:tolist(), {0.5, 0, 1})
end)

test("every unary op", function()
  for _, op in ipairs {"neg", "exp", "tanh", "sigmoid", "gelu", "gelu_erf", "erf", "silu", "sin", "cos", "square"} do
    check(function(a) return a[op](a) end, {leaf(random_shape(2), {noncontig = true})}, {msg = op})
  end
  for _, op in ipairs {"relu", "abs"} do -- kinks at 0
    check(function(a) return a[op](a) end, {leaf(random_shape(2), {away = true})}, {msg = op})
  end
  for _, op in ipairs {"log", "sqrt", "rsqrt", "reciprocal"} do
    check(function(a) return a[op](a) end, {leaf(random_shape(2), {positive = true})}, {msg = op})
  end
  -- function form and the operator
  check(function(a) return lt.exp(a), -a end, {leaf({3})})
  -- in place on results of ops: the ops whose derivative their output gives
  for _, op in ipairs {"exp_", "relu_", "sigmoid_", "tanh_", "sqrt_", "rsqrt_", "reciprocal_", "neg_"} do
    check(function(a)
      local y = a * 1
      return y[op](y)
    end, {leaf({4}, {positive = true})}, {msg = op})
  end
end)

test("clamp passes the gradient inside [lo, hi] only; one-sided bounds", function()
  local x = leaf({4, 5}, {away = true})
  check(function(a) return a:clamp(-0.5, 0.5), a:clamp(0.1), a:clamp(nil, -0.1) end, {x})
  local y = lt.tensor({-2, 0, 2}, {dtype = "f64", requires_grad = true})
  y:clamp(-1, 1):sum():backward()
  equal(y.grad:tolist(), {0, 1, 0})
  -- clamp_ in place on a result: the mask comes from the output
  check(function(a) return (a * 1):clamp_(-0.5, 0.5), (a * 2):clamp_(0.2) end, {x})
end)

test("where: gradients masked by cond, broadcast back, scalar branches", function()
  local cond = lt.tensor(T.random_list({3, 4}, function() return T.uniform() < 0.5 end))
  check(function(a, b) return lt.where(cond, a, b) end, {leaf({3, 4}), leaf({1, 4})})
  check(function(a) return lt.where(cond, a, 0), lt.where(cond, 1, a), a:where(cond, 2) end, {leaf({3, 4})})
end)

test("copies and conversions: clone, contiguous, to, copy_, type round trips", function()
  check(function(a) return a:clone(), a:contiguous(), a:t():contiguous(), a:to("f64") end,
    {leaf({3, 4}, {noncontig = true})})
  -- copy_ into a plain tensor makes it depend on the source (broadcasting, converting)
  check(function(a)
    local buf = lt.zeros(2, 3, 4, "f64")
    buf:copy_(a)
    return buf
  end, {leaf({3, 4})})
  -- f64 -> f32 -> f64: the gradient converts back (loose: f32 rounding)
  local x = leaf({5})
  local y = x:float()
  equal(y.dtype, "f32")
  equal(y.grad_fn, "CopyBackward")
  local loss = (y * y):sum()
  loss:backward()
  equal(x.grad.dtype, "f64")
  close(x.grad, (x * 2):detach(), {rtol = 1e-6})
  -- to an integer dtype: no gradient
  equal(x:long().requires_grad, false)
end)

test("f32 and bf16 gradients agree with f64 ones", function()
  local x64 = leaf({4, 6})
  local w64 = leaf({6})
  local function f(x, w) return ((x * w):tanh() + x:sigmoid() / 2):sum() end
  f(x64, w64):backward()
  for _, dt in ipairs {"f32", "bf16"} do
    local x = x64:detach():to(dt):requires_grad_()
    local w = w64:detach():to(dt):requires_grad_()
    f(x, w):backward()
    equal(x.grad.dtype, dt)
    local tol = dt == "f32" and {rtol = 1e-5, atol = 1e-6} or {rtol = 2e-2, atol = 2e-2}
    close(x.grad:double(), x64.grad, tol)
    close(w.grad:double(), w64.grad, tol)
  end
end)

test("gradcheck itself catches a wrong gradient and bad arguments", function()
  local x = leaf({3})
  -- a hook that doubles the gradient makes the analytic one wrong
  local function wrong(a)
    local y = a * 1
    if y.requires_grad then y:register_hook(function(g) return g * 2 end) end -- (not under no_grad)
    return y:exp()
  end
  fails("gradcheck: input 1 element", function() check(wrong, {x}) end)
  fails("no input requires grad", function() check(function(a) return a * 2 end, {lt.ones(2, "f64")}) end)
  fails("no floating point tensor", function() check(function(a) return a:gt(0) end, {x}) end)
end)
