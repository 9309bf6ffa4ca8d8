-- Gradients of gradients (backward{create_graph = true}, lutra.autograd.grad(..., {create_graph =
-- true})): finite differences in f64 on the first gradient (lutra.testing.gradcheck of
-- g(theta) = dL/dx, a function recorded by the first backward: its autograd gradient against
-- central differences of g), for the ops whose backward is recorded, on odd shapes and
-- non-contiguous inputs; the engine's semantics (x.grad recorded and summed out of place, the
-- graph retained by default, hooks, a plain backward unchanged after); f32 against f64; and the
-- error that names an op declared without a recorded backward when a gradient of its gradient
-- is asked for.
local lt = require "lutra"
local T = require "lutra.testing"
local F = lt.F
local op = require "lutra.autograd.op"
local check, close, equal, fails = T.gradcheck, T.assert_close, T.assert_equal, T.assert_error

-- f64 leaf of `shape` that requires grad; noncontig: a transposed view of the reversed shape;
-- positive: in [0.5, 1.5) and more; away: |x| >= 0.2 (kinks of relu/abs)
local function leaf(shape, opts)
  opts = opts or {}
  local t
  if opts.noncontig then
    local rev, dims = {}, {}
    for i = #shape, 1, -1 do
      rev[#rev + 1] = shape[i]
      dims[#dims + 1] = i - 1
    end
    t = lt.tensor(T.random_list(rev), {dtype = "f64"}):permute(dims)
  else
    t = lt.tensor(T.random_list(shape), {dtype = "f64"})
  end
  if opts.positive then t = lt.no_grad(function() return t:abs() + 0.5 end) end
  if opts.away then t = lt.no_grad(function() return lt.where(t:ge(0), t + 0.2, t - 0.2) end) end
  return t:requires_grad_()
end

-- d/dtheta of the first gradients of L = loss(inputs...) with respect to every input: gradcheck
-- of the function inputs -> dL/d inputs (each recorded with create_graph). f64, eps 1e-6: the
-- central differences are within ~1e-10 of the derivative (truncation eps^2, rounding 1e-16/eps).
-- The recorded first gradients must also be the plain backward's (within f64 rounding).
local function check_double(name, loss, inputs)
  local function first_grads(...)
    local args = {...}
    return lt.enable_grad(function()
      local g = lt.autograd.grad(loss(unpack(args)), args, nil, {create_graph = true, allow_unused = true})
      local out = {}
      for i = 1, #args do out[#out + 1] = g[i] or lt.zeros_like(args[i]) end
      return out
    end)
  end
  check(first_grads, inputs, {atol = 1e-7, rtol = 1e-6, msg = name})
  -- the recorded first gradients are the plain backward's (checked by the ops' own gradchecks)
  local recorded = first_grads(unpack(inputs))
  local plain = lt.autograd.grad(loss(unpack(inputs)), inputs, nil, {allow_unused = true})
  for i = 1, #inputs do
    local want = plain[i] or lt.zeros_like(inputs[i])
    local scale = want:abs():max():item()
    close(recorded[i]:detach(), want, {atol = 1e-13 * (scale > 0 and scale or 1), rtol = 0,
      msg = name .. ": first gradient of input " .. i})
  end
end

local function wsum(y) -- a fixed random weighting of y cubed: every second derivative non-trivial
  local w = lt.tensor(T.random_list(y.shape), {dtype = "f64"})
  return function(t) return (w * t * t * t):sum() end
end

test("double backward of elementwise ops by finite differences (broadcasting, non-contiguous)", function()
  T.seed(1)
  local function unary(name, opts)
    local x = leaf({3, 4}, opts)
    local s = wsum(x)
    check_double(name, function(a) return s(a[name](a)) end, {x})
  end
  for _, name in ipairs {"exp", "tanh", "sigmoid", "gelu", "silu", "sin", "cos", "square", "neg", "erf", "gelu_erf"} do
    unary(name)
  end
  for _, name in ipairs {"log", "sqrt", "rsqrt", "reciprocal"} do unary(name, {positive = true}) end
  for _, name in ipairs {"relu", "abs"} do unary(name, {away = true, noncontig = true}) end
  local a, b = leaf({3, 4}, {noncontig = true}), leaf({4})
  local s = wsum(a)
  check_double("add", function(x, y) return s(x + y) end, {a, b})
  check_double("sub", function(x, y) return s(x - y) end, {a, b})
  check_double("mul", function(x, y) return s(x * y) end, {a, b})
  check_double("div", function(x, y) return s(x / y) end, {a, leaf({4}, {positive = true})})
  check_double("pow", function(x, y) return s(x ^ y) end, {leaf({3, 4}, {positive = true}), leaf({3, 4})})
  check_double("scalar ops", function(x) return s(2.0 ^ x + 1.5 / (x * x + 1) - x ^ 3 * 0.5) end, {a})
  check_double("maximum", function(x, y) return s(lt.maximum(x, y)) end, {a, leaf({3, 4})})
  check_double("clamp", function(x) return s(x:clamp(-0.4, 0.4) * x) end, {leaf({3, 4}, {away = true})})
  local c = lt.tensor(T.random_list({3, 4}), {dtype = "f64"}):gt(0)
  check_double("where", function(x, y) return s(lt.where(c, x * x, y)) end, {a, b})
  check_double("masked_fill", function(x) return s(F.masked_fill(x:exp(), c, 0.5)) end, {a})
end)

test("double backward of reductions, softmax, matmul, linear by finite differences", function()
  T.seed(2)
  local x = leaf({3, 5}, {noncontig = true})
  local s3 = wsum(lt.zeros(3))
  local s5 = wsum(lt.zeros(5))
  local sx = wsum(x)
  check_double("sum", function(a) return s3(a:sum(1)) end, {x})
  check_double("mean", function(a) return s5(a:mean(0)) end, {x})
  check_double("var", function(a) return s3(a:var(1)) end, {x})
  check_double("std", function(a) return s5(a:std(0)) end, {x})
  check_double("max", function(a) return s3((a:max({1}))) end, {x})
  check_double("prod", function(a) return s3(a:prod(1)) end, {x})
  check_double("softmax", function(a) return sx(lt.softmax(a, 1)) end, {x})
  check_double("softmax dim 0", function(a) return sx(lt.softmax(a, 0)) end, {x})
  check_double("log_softmax", function(a) return sx(lt.log_softmax(a, -1)) end, {x})
  local w, b = leaf({4, 5}), leaf({4})
  local s = wsum(lt.zeros(2, 3, 4))
  local x3 = leaf({2, 3, 5})
  check_double("linear", function(a, ww, bb) return s(F.linear(a, ww, bb)) end, {x3, w, b})
  check_double("linear, no bias", function(a, ww) return s(F.linear(a, ww)) end, {x3, w})
  check_double("matmul", function(a, m) return s(a:matmul(m)) end, {x3, leaf({4, 5}, {noncontig = true}):t()})
  check_double("bmm", function(a, m) return s(a:matmul(m)) end, {x3, leaf({2, 5, 4})})
end)

test("double backward of views, cat, indexing ops by finite differences", function()
  T.seed(3)
  local x = leaf({4, 5})
  local function via(name, view, shape)
    local s = wsum(lt.zeros(shape))
    check_double(name, function(a) return s(view(a:tanh())) end, {x})
  end
  via("reshape", function(a) return a:reshape(2, 10) end, {2, 10})
  via("transpose", function(a) return a:t() end, {5, 4})
  via("permute", function(a) return a:reshape(2, 2, 5):permute(2, 0, 1) end, {5, 2, 2})
  via("narrow", function(a) return a:narrow(1, 1, 3) end, {4, 3})
  via("slice step", function(a) return a:slice(1, 0, 5, 2) end, {4, 3})
  via("select", function(a) return a:select(0, 2) end, {5})
  via("index", function(a) return a[{{1, 3}, 2}] end, {2})
  via("expand", function(a) return a:narrow(1, 0, 1):expand(4, 3) end, {4, 3})
  via("cat", function(a) return lt.cat({a, a:narrow(1, 0, 2)}, 1) end, {4, 7})
  via("stack", function(a) return lt.stack({a, a * 2}, 1) end, {4, 2, 5})
  local gi = lt.tensor({{0, 4}, {2, 2}, {1, 3}, {4, 0}}, {dtype = "i64"})
  via("gather", function(a) return F.gather(a, 1, gi) end, {4, 2})
  local ii = lt.tensor({3, 0, 3}, {dtype = "i64"})
  via("index_select", function(a) return F.index_select(a, 0, ii) end, {3, 5})
  local src = leaf({4, 2})
  local s = wsum(lt.zeros(4, 5))
  check_double("scatter_add", function(a, b) return s(F.scatter_add(a:tanh(), 1, gi, b * b)) end, {x, src})
  check_double("index_add", function(a, b) return s(F.index_add(a:tanh(), 0, ii, b:exp())) end, {x, leaf({3, 5})})
  check_double("scatter", function(a, b) return s(F.scatter(a:tanh(), 1, gi:narrow(1, 0, 1), b:narrow(1, 0, 1) ^ 3)) end,
    {x, src})
  for _, reduce in ipairs {"sum", "mean", "amax"} do
    check_double("scatter_reduce " .. reduce, function(a, b)
      return s(F.scatter_reduce(a:tanh(), 1, gi, b:exp(), reduce, {include_self = reduce ~= "amax"}))
    end, {x, src})
  end
  check_double("index_copy", function(a, b)
    return s(F.index_copy(a:tanh(), 0, lt.tensor({3, 0}, {dtype = "i64"}), b:exp()))
  end, {x, leaf({2, 5})})
  check_double("index assignment", function(a, b)
    local y = a:tanh() * 1
    y[{{1, 3}, 2}] = b * b
    return s(y)
  end, {x, leaf({2})})
  via("logsumexp", function(a) return F.logsumexp(a, 1, true) end, {4, 1})
  via("norm", function(a) return a:norm(1) end, {4})
  via("min", function(a) return (a:min({0})) end, {5})
  via("triu", function(a) return F.triu(a, 1) end, {4, 5})
  via("cast to f32 and back", function(a) return a:to("f32"):to("f64") * 0 + a end, {4, 5})
  via("cumsum", function(a) return F.cumsum(a, 1) end, {4, 5})
  via("cumprod", function(a) return F.cumprod(a, 1) end, {4, 5})
  via("cumprod dim 0, a zero", function(a) return F.cumprod(a * lt.tensor({1, 1, 0, 1, 1}, {dtype = "f64"}), 0) end,
    {4, 5})
  via("tril", function(a) return F.tril(a, -1) end, {4, 5})
  via("sort", function(a) return (F.sort(a, 1)) end, {4, 5})
  via("topk", function(a) return (F.topk(a, 2, 1)) end, {4, 2})
  local ids = lt.tensor({{1, 5}, {0, 1}, {5, 5}}, {dtype = "i64"})
  local se = wsum(lt.zeros(3, 2, 3))
  check_double("embedding", function(w) return se(F.embedding(ids, w)) end, {leaf({6, 3})})
end)

test("double backward of norms, cross_entropy, rope by finite differences", function()
  T.seed(4)
  local x, w, b = leaf({2, 3, 6}), leaf({6}), leaf({6})
  local s = wsum(x)
  check_double("layer_norm", function(a, ww, bb) return s((F.layer_norm(a, ww, bb, 1e-5))) end, {x, w, b})
  check_double("layer_norm, no affine", function(a) return s((F.layer_norm(a, nil, nil, 1e-5))) end, {x})
  check_double("rms_norm", function(a, ww) return s((F.rms_norm(a, ww, 1e-6))) end, {x, w})
  local t = lt.tensor({1, 4, -100, 0, 3}, {dtype = "i64"})
  local logits = leaf({5, 5}, {noncontig = true})
  check_double("cross_entropy mean", function(l) return (F.cross_entropy(l, t)) ^ 2 end, {logits})
  check_double("cross_entropy sum", function(l) return (F.cross_entropy(l, t, {reduction = "sum"})) ^ 2 end, {logits})
  local t2 = lt.tensor({{1, 4}, {0, 3}}, {dtype = "i32"})
  local sn = wsum(lt.zeros(4))
  check_double("cross_entropy none", function(l)
    return sn((F.cross_entropy(l, t2, {reduction = "none"})))
  end, {leaf({2, 2, 5})})
  local q = leaf({1, 3, 2, 4})
  local sq = wsum(q)
  check_double("rope", function(a) return sq(F.rope(a:tanh(), nil, 100.0)) end, {q})
end)

test("a gradient penalty and a Hessian-vector product through an MLP and causal attention", function()
  T.seed(5)
  local x, w1, b1, w2 = leaf({4, 3}), leaf({5, 3}), leaf({5}), leaf({2, 5})
  local function L(xx, a, bb, c) return ((F.linear(F.linear(xx, a, bb):gelu(), c)) ^ 2):sum() end
  -- the penalty ||dL/dx||^2 as a function of the parameters, checked by central differences
  check(function(a, bb, c)
    return lt.enable_grad(function()
      local gx = lt.autograd.grad(L(x, a, bb, c), x, nil, {create_graph = true})
      return (gx * gx):sum()
    end)
  end, {w1, b1, w2}, {atol = 1e-7, rtol = 1e-6, msg = "mlp penalty"})
  -- backward{create_graph = true}, then the penalty's backward into the parameters' .grad
  local loss = L(x, w1, b1, w2)
  loss:backward{create_graph = true}
  assert(x.grad.requires_grad and w1.grad.grad_fn ~= nil, "create_graph: .grad is recorded")
  local gx = x.grad
  lt.zero_grad({x, w1, b1, w2})
  ;(gx * gx):sum():backward()
  local want = lt.autograd.grad((lt.autograd.grad(L(x, w1, b1, w2), x, nil, {create_graph = true}) ^ 2):sum(), w1)
  close(w1.grad, want, {atol = 0, rtol = 0})
  -- Hessian-vector product of attention: H v = d/dtheta <dL/dtheta, v>
  local q, k, v = leaf({2, 4, 3}), leaf({2, 4, 3}), leaf({2, 4, 3})
  local mask = F.triu(lt.ones(4, 4), 1):ne(0)
  local function att(qq, kk, vv)
    local sc = qq:matmul(kk:transpose(-1, -2)) / math.sqrt(3)
    return (lt.softmax(F.masked_fill(sc, mask, -math.huge), -1):matmul(vv) ^ 3):sum()
  end
  check_double("attention", att, {q, k, v})
end)

test("double backward of fused attention, the fused norms and a model of the zoo by finite differences", function()
  T.seed(7)
  -- causal, grouped (4 query heads on 2 kv heads), after a cache (S > T), with a window
  local q, k, v = leaf({1, 3, 4, 2}), leaf({1, 5, 2, 2}), leaf({1, 5, 2, 2})
  local s = wsum(q)
  check_double("attention causal gqa window", function(a, b, c)
    return s((F.scaled_dot_product_attention {a, b, c, causal = true, window = 3}))
  end, {q, k, v})
  check_double("attention, not causal, scale", function(a, b, c)
    return s((F.scaled_dot_product_attention {a, b, c, scale = 0.3}))
  end, {q, k, v})
  local seg = lt.tensor({{0, 0, 1, 1}, {2, 2, 2, 3}}, {dtype = "i64"})
  local qs, ks, vs = leaf({2, 4, 2, 3}), leaf({2, 4, 2, 3}), leaf({2, 4, 2, 3})
  local ss = wsum(qs)
  check_double("attention segments", function(a, b, c)
    return ss((F.scaled_dot_product_attention {a, b, c, segment_ids = seg, causal = true}))
  end, {qs, ks, vs})
  -- lutra.checkpoint: fn recomputed and differentiated with recorded ops, from a recorded argument
  -- and a leaf, one argument passed twice
  local cx, cw = leaf({3, 4}), leaf({4})
  local sc = wsum(cx)
  check_double("checkpoint", function(a, b)
    local h = a:tanh()
    return sc(lt.checkpoint(function(u, v, u2) return (u * v):sin() * u2 end, h, b, h))
  end, {cx, cw})
  -- x + residual and its norm, both outputs used
  local x, r, w, b = leaf({2, 3, 5}), leaf({2, 3, 5}), leaf({5}), leaf({5})
  local sx = wsum(x)
  check_double("add_layer_norm", function(a, c, ww, bb)
    local res, y = F.add_layer_norm(a, c, ww, bb, 1e-5)
    return sx(y) + sx(res * 0.5)
  end, {x, r, w, b})
  check_double("add_rms_norm", function(a, c, ww)
    local res, y = F.add_rms_norm(a, c, ww, 1e-6)
    return sx(y) + sx(res * 0.5)
  end, {x, r, w})
  -- a llama of the zoo (fused qkv attention with RoPE and GQA, add_rms_norm, SwiGLU) and a gpt2
  for _, arch in ipairs {"llama", "gpt2"} do
    lt.manual_seed(3)
    local cfg = {arch = arch, n_layer = 1, n_head = 2, d_model = 8, vocab_size = 11, block_size = 5, dropout = 0}
    if arch == "llama" then cfg.n_kv_head = 1 end
    local model = lt.models.build(cfg)
    model:to("f64")
    local idx = lt.tensor({{1, 4, 9, 2, 7}}, {dtype = "i64"})
    local params = model:parameters()
    -- the token embedding, the first norm's weight, the fused qkv projection, the last parameter
    local qkv_rows = arch == "llama" and 16 or 24
    local picked = {params[1]}
    for _, p in ipairs(params) do if p.ndim == 1 then picked[2] = p break end end
    for _, p in ipairs(params) do if p.ndim == 2 and p:size(0) == qkv_rows then picked[3] = p break end end
    picked[4] = params[#params]
    assert(#picked == 4 and picked[2] ~= picked[4])
    check_double(arch, function() return select(2, model:forward(idx, idx)) end, picked)
  end
end)

test("create_graph: .grad recorded and summed out of place, graph retained, hooks, plain backward after", function()
  local x = lt.tensor({1, 2, 3}, {dtype = "f64"}):requires_grad_()
  local y = (x * x * x):sum()
  y:backward{create_graph = true}
  equal(x.grad:tolist(), {3, 12, 27})
  equal(x.grad.grad_fn ~= nil, true)
  local first = x.grad
  y:backward{create_graph = true} -- retained by default: a second pass sums, out of place
  equal(x.grad:tolist(), {6, 24, 54})
  equal(first:tolist(), {3, 12, 27})
  local g = x.grad
  x.grad = nil
  g:sum():backward() -- d/dx sum(2 * 3x^2) = 12 x
  equal(x.grad:tolist(), {12, 24, 36})
  -- a hook sees (and may replace) the recorded gradient
  local seen
  local z = lt.tensor({0.5, -1}, {dtype = "f64"}):requires_grad_()
  local h = z:exp()
  local hook = h:register_hook(function(gr) seen = gr.requires_grad; return gr * 2 end)
  local gz = lt.autograd.grad((h * h):sum(), z, nil, {create_graph = true})
  equal(seen, true)
  hook.remove() -- (it would fire again where the second pass goes through h)
  local want = lt.no_grad(function() return (z * 2):exp() * 4 end)
  close(gz, want, {atol = 0, rtol = 1e-15})
  close(lt.autograd.grad(gz:sum(), z), lt.no_grad(function() return want * 2 end), {atol = 0, rtol = 1e-15})
  -- retain_graph = false frees the first graph: differentiating through it again is the usual error
  local a = lt.tensor({0.5, 1.5}, {dtype = "f64"}):requires_grad_()
  local ga = lt.autograd.grad((a:sin() * a):sum(), a, nil, {create_graph = true, retain_graph = false})
  fails("backward through the graph a second time", function() ga:sum():backward() end)
  -- the plain path is untouched: nothing recorded, the same values bit for bit
  local p = lt.tensor({0.3, -0.7, 1.1}, {dtype = "f64"}):requires_grad_()
  local function f() return (lt.softmax(p:tanh(), 0) * p:exp()):sum() end
  local plain = lt.autograd.grad(f(), p)
  equal(plain.requires_grad, false)
  local graph = lt.autograd.grad(f(), p, nil, {create_graph = true})
  close(graph:detach(), plain, {atol = 1e-15, rtol = 0})
  equal(lt.autograd.grad(f(), p):tolist(), plain:tolist())
  fails("grad: unknown option creat_graph", function() lt.autograd.grad(f(), p, nil, {creat_graph = true}) end)
end)

test("f32 double backward agrees with f64", function()
  T.seed(6)
  local x64, w64 = leaf({3, 4}), leaf({5, 4})
  local function penalty(x, w)
    local y = lt.log_softmax((F.layer_norm(F.linear(x, w):tanh(), nil, nil, 1e-5)), -1)
    local gx = lt.autograd.grad((y * y):sum(), x, nil, {create_graph = true})
    return lt.autograd.grad((gx * gx):sum(), w)
  end
  local want = penalty(x64, w64)
  local x32 = x64:detach():to("f32"):requires_grad_()
  local w32 = w64:detach():to("f32"):requires_grad_()
  local got = penalty(x32, w32)
  equal(got.dtype, "f32")
  local scale = want:abs():max():item()
  close(got:to("f64"), want, {atol = 1e-4 * scale, rtol = 0})
end)

test("an op whose backward is a fused kernel: first gradients work, their gradient raises naming it", function()
  -- an op declared without a recorded backward (x * w, w broadcast): gradients of two shapes, each
  -- carrying its own raising node, the declaration's hint in the message
  local record_fused = op.declare {
    name = "TestFusedMulBackward", op = "test_fused_mul", save = {"a", "b"}, no_double = "use x * w",
    record = function(cls, out, a, b)
      local node = {op.edge(a), op.edge(b), cls = cls}
      op.save(node, "a", a)
      op.save(node, "b", b)
      op.attach(out, node)
    end,
    backward = function(n, g) return g * n.b, (g * n.a):sum(0) end,
  }
  local function fused_mul(a, b)
    local out = lt.no_grad(function() return a * b end)
    record_fused(out, a, b)
    return out
  end
  local x = lt.tensor(T.random_list({2, 4}), {dtype = "f64"}):requires_grad_()
  local w = lt.tensor(T.random_list({4}), {dtype = "f64"}):requires_grad_()
  local c = fused_mul(x, w)
  local gs = lt.autograd.grad((c * c * c):sum(), {x, w}, nil, {create_graph = true})
  local plain = lt.autograd.grad((fused_mul(x, w) ^ 3):sum(), {x, w})
  close(gs[1]:detach(), plain[1], {atol = 0, rtol = 0})
  close(gs[2]:detach(), plain[2], {atol = 0, rtol = 0})
  equal(gs[1].grad_fn, "DoubleBackwardUnsupported")
  fails("test_fused_mul (TestFusedMulBackward): double backward is not supported (its backward is a fused kernel, "
    .. "not recorded ops); use x * w", function() ((gs[1] * gs[1]):sum() + (gs[2] * gs[2]):sum()):backward() end)
  -- a gradient that never reaches the node does not raise
  local v = lt.tensor(T.random_list({4}), {dtype = "f64"}):requires_grad_()
  local o = fused_mul(x, w)
  local gv = lt.autograd.grad(((o * v) ^ 2):sum(), v, nil, {create_graph = true})
  local hv = lt.autograd.grad(gv:sum(), v)
  local want = lt.no_grad(function() return (o * o):sum(0) * 2 end)
  close(hv, want, {atol = 0, rtol = 1e-15})
end)

test("double backward of grouped_linear, clamp with tensor bounds, einsum, split, repeat_interleave (finite differences)",
  function()
  T.seed(7)
  -- grouped_linear: an empty group in the middle, and x non-contiguous
  local x, w = leaf({5, 3}, {noncontig = true}), leaf({3, 4, 3})
  local s1 = wsum(lt.zeros(5, 4))
  check_double("grouped_linear", function(a, b) return s1(F.grouped_linear(a, b, {2, 0, 3})) end, {x, w})
  -- clamp with broadcast tensor bounds, x kept away from them (the kinks)
  local y = leaf({3, 4}, {away = true})
  local lo, hi = leaf({4}), leaf({3, 1})
  lt.no_grad(function()
    lo:copy_(lt.full({4}, -0.15, {dtype = "f64"}))
    hi:copy_(lt.full({3, 1}, 0.15, {dtype = "f64"}))
  end)
  local s2 = wsum(y)
  check_double("clamp tensor bounds", function(a, l, h) return s2(a:clamp(l, h)) end, {y, lo, hi})
  local a3, b3 = leaf({2, 3, 4}), leaf({2, 4, 5}, {noncontig = true})
  local s3 = wsum(lt.zeros(2, 3, 5))
  check_double("einsum", function(p, q) return s3(lt.einsum("bij,bjk->bik", p, q)) end, {a3, b3})
  local sp = leaf({6, 4})
  local s4, s5 = wsum(lt.zeros(1, 4)), wsum(lt.zeros(2, 4))
  check_double("split", function(p)
    local parts = p:split({1, 3, 2}, 0)
    return s4(parts[1]) + s5(parts[3] * parts[3])
  end, {sp})
  local s6 = wsum(lt.zeros(2, 3))
  check_double("repeat_interleave", function(p) return s6(p:repeat_interleave(lt.tensor({1, 0, 2}, {dtype = "i64"}), 1)) end,
    {leaf({2, 3})})
end)
