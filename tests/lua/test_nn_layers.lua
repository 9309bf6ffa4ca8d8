-- nn layers: each forward against a naive reference composed from basic tensor ops
-- (matmul, elementwise, reductions), in f64; shapes, options, dropout.
local lt = require "lutra"
local nn = require "lutra.nn"
local T = require "lutra.testing"
local close, equal, fails = T.assert_close, T.assert_equal, T.assert_error

local TIGHT = {rtol = 1e-10, atol = 1e-12}
local F64 = {dtype = "f64"}

local function randn(...) return lt.randn(...):to("f64") end

test("Linear: x @ W^T + b, weight (out, in), any leading dims, no bias", function()
  local lin = nn.Linear(5, 3, F64)
  equal(lin.weight.shape, {3, 5})
  equal(lin.bias.shape, {3})
  local bound = 1 / math.sqrt(5)
  assert(lin.weight:abs():max():item() <= bound and lin.bias:abs():max():item() <= bound)
  local x = randn(2, 4, 5)
  local want = x:reshape(8, 5):matmul(lin.weight:t()):reshape(2, 4, 3) + lin.bias
  close(lin(x), want, TIGHT)
  -- a non-contiguous input
  local xt = randn(5, 6):t()
  close(lin(xt), xt:contiguous():matmul(lin.weight:t()) + lin.bias, TIGHT)
  local nob = nn.Linear(5, 3, {bias = false, dtype = "f64"})
  assert(nob.bias == nil)
  close(nob(x), x:matmul(nob.weight:t()), TIGHT)
  equal(lin:num_parameters(), 18)
  equal(nob:num_parameters(), 15)
end)

test("Embedding: rows of the weight (one-hot matmul reference)", function()
  local emb = nn.Embedding(10, 4, F64)
  local ids = lt.tensor({{1, 9, 0}, {3, 3, 7}}, "i64")
  local onehot = ids:unsqueeze(-1):eq(lt.arange(10)):to("f64") -- (2, 3, 10)
  close(emb(ids), onehot:matmul(emb.weight), TIGHT)
  -- N(0, 1) at start
  local big = nn.Embedding(1000, 64)
  close(big.weight:std():item(), 1, {rtol = 0.02, atol = 0})
  fails("out of range", function() emb(lt.tensor({10}, "i64")) end)
end)

local function layer_norm_ref(x, w, b, eps)
  local mean = x:mean(-1, true)
  local xc = x - mean
  local var = (xc * xc):mean(-1, true)
  local y = xc / (var + eps):sqrt()
  if w then y = y * w end
  if b then y = y + b end
  return y
end

test("LayerNorm: (x - mean) / sqrt(var + eps) * w + b; bias=false; affine=false", function()
  local ln = nn.LayerNorm(6, {eps = 1e-3, dtype = "f64"})
  close(ln.weight, {1, 1, 1, 1, 1, 1}, TIGHT)
  close(ln.bias, {0, 0, 0, 0, 0, 0}, TIGHT)
  lt.no_grad(function()
    ln.weight:copy_(randn(6))
    ln.bias:copy_(randn(6))
  end)
  local x = randn(3, 2, 6) * 3 + 1
  close(ln(x), layer_norm_ref(x, ln.weight, ln.bias, 1e-3), TIGHT)
  local nob = nn.LayerNorm(6, {bias = false, dtype = "f64"})
  assert(nob.bias == nil)
  equal(nob:num_parameters(), 6)
  close(nob(x), layer_norm_ref(x, nob.weight, nil, 1e-5), TIGHT)
  local plain = nn.LayerNorm(6, {affine = false, dtype = "f64"})
  equal(plain:num_parameters(), 0)
  close(plain(x), layer_norm_ref(x, nil, nil, 1e-5), TIGHT)
  fails("eps must be a positive number", function() nn.LayerNorm(6, {eps = 0}) end)
end)

test("RMSNorm: x / sqrt(mean(x^2) + eps) * w", function()
  local rn = nn.RMSNorm(8, {eps = 1e-4, dtype = "f64"})
  close(rn.weight, {1, 1, 1, 1, 1, 1, 1, 1}, TIGHT)
  lt.no_grad(function() rn.weight:copy_(randn(8)) end)
  local x = randn(2, 5, 8) * 2
  local want = x / ((x * x):mean(-1, true) + 1e-4):sqrt() * rn.weight
  close(rn(x), want, TIGHT)
  equal(rn:num_parameters(), 8)
end)

test("Dropout: zeroes about p, scales the rest by 1/(1-p); identity in eval and at p = 0", function()
  local d = nn.Dropout(0.25)
  local x = lt.ones(200, 100)
  local y = d(x)
  local zeros = y:eq(0):to("f64"):mean():item()
  close(zeros, 0.25, {rtol = 0, atol = 0.01})
  -- kept elements are exactly 1 / 0.75
  local kept = y:ne(0):to("f32")
  close((y - kept * (1 / 0.75)):abs():max():item(), 0, {rtol = 0, atol = 1e-6})
  -- reproducible from the seed, and a new mask each call
  lt.manual_seed(5)
  local a = d(x)
  local b = d(x)
  lt.manual_seed(5)
  close(d(x), a, {rtol = 0, atol = 0})
  assert(a:ne(b):to("f64"):sum():item() > 0)
  -- the mean is kept
  close(y:mean():item(), 1, {rtol = 0, atol = 0.02})
  d:eval()
  assert(d(x) == x)
  equal(nn.Dropout(0)(x), x)
  local all = nn.Dropout(1)(x)
  equal(all:abs():sum():item(), 0)
  fails("p must be a number in [0, 1]", function() nn.Dropout(1.5) end)
  -- other dtypes: the mask takes x's dtype
  equal(nn.Dropout(0.5)(lt.ones(4, "f64")).dtype, "f64")
end)

local K, CUBIC = math.sqrt(2 / math.pi), 0.044715
local function gelu_ref(x) return x * 0.5 * ((x + x * x * x * CUBIC) * K):tanh() + x * 0.5 end
local function silu_ref(x) return x / ((-x):exp() + 1) end

test("MLP: proj(gelu_tanh(fc(x))), hidden 4x by default", function()
  local mlp = nn.MLP {d_model = 6, dtype = "f64"}
  equal(mlp.fc.weight.shape, {24, 6})
  equal(mlp.proj.weight.shape, {6, 24})
  local x = randn(2, 3, 6)
  local h = x:matmul(mlp.fc.weight:t()) + mlp.fc.bias
  close(mlp(x), gelu_ref(h):matmul(mlp.proj.weight:t()) + mlp.proj.bias, TIGHT)
  local small = nn.MLP {d_model = 6, hidden = 10, bias = false}
  equal(small:num_parameters(), 120)
end)

test("SwiGLU: proj(silu(gate(x)) * up(x)), no bias, hidden 8/3 rounded to 32", function()
  local sw = nn.SwiGLU {d_model = 48, dtype = "f64"}
  equal(sw.gate.weight.shape, {128, 48})
  assert(sw.gate.bias == nil and sw.up.bias == nil and sw.proj.bias == nil)
  local x = randn(2, 3, 48)
  local g, u = x:matmul(sw.gate.weight:t()), x:matmul(sw.up.weight:t())
  close(sw(x), (silu_ref(g) * u):matmul(sw.proj.weight:t()), TIGHT)
  equal(nn.SwiGLU {d_model = 32, hidden = 40}.up.weight.shape, {40, 32})
  equal(nn.SwiGLU.default_hidden(32), 96)
end)
