-- Autograd, matmul and the fused kernels: finite-difference gradient checks in f64 for matmul
-- (batched, broadcast batch dims), gemm (every transpose, alpha, beta accumulating into out),
-- F.linear, F.layer_norm, F.rms_norm, F.cross_entropy (mean/sum/none, ignore_index, (B, T, V)
-- logits), F.embedding (repeated ids), F.rope (default and given positions), and
-- F.scaled_dot_product_attention (causal or not, GQA, segment ids, sliding windows); and a small MLP's
-- gradients in f32 against the same model run in f64.
local lt = require "lutra"
local T = require "lutra.testing"
local check, close, equal, fails = T.gradcheck, T.assert_close, T.assert_equal, T.assert_error
local F = lt.F

local leaf = T.random_leaf

test("matmul: 2-d, batched, broadcast batch dims, non-contiguous", function()
  check(function(a, b) return a:matmul(b) end, {leaf({3, 4}), leaf({4, 2}, true)})
  check(function(a, b) return lt.matmul(a, b) end, {leaf({2, 3, 4}, true), leaf({4, 5})})
  check(function(a, b) return a:matmul(b) end, {leaf({2, 1, 3, 4}), leaf({3, 4, 2})})
  check(function(a, b) return a:mm(b) end, {leaf({3, 4}), lt.randn(4, 2, "f64")}) -- b without grad
end)

test("gemm: every transpose, alpha, and beta accumulating into out", function()
  for _, ta in ipairs {false, true} do
    for _, tb in ipairs {false, true} do
      local a = leaf(ta and {4, 3} or {3, 4})
      local b = leaf(tb and {2, 4} or {4, 2})
      check(function(x, y) return lt.gemm(x, y, {trans_a = ta, trans_b = tb, alpha = 0.7}) end, {a, b},
        {msg = string.format("trans_a %s trans_b %s", ta, tb)})
    end
  end
  -- out = alpha a b + beta out, where out's old value takes part in the graph
  check(function(x, y, c)
    local acc = c * 1
    lt.gemm(x, y, {alpha = 2, beta = 0.5, out = acc})
    return acc
  end, {leaf({3, 4}), leaf({4, 2}), leaf({3, 2})})
end)

test("F.linear with and without bias, 2-d and 3-d inputs", function()
  check(function(x, w, b) return F.linear(x, w, b) end, {leaf({2, 3, 5}), leaf({4, 5}), leaf({4})})
  check(function(x, w) return F.linear(x, w) end, {leaf({3, 5}, true), leaf({4, 5})})
  local x = leaf({3, 5})
  local y = F.linear(x, lt.randn(4, 5, "f64"))
  equal(y.grad_fn, "LinearBackward")
end)

test("F.layer_norm and F.rms_norm (with and without affine parameters)", function()
  check(function(x, w, b) return (F.layer_norm(x, w, b, 1e-5)) end, {leaf({2, 3, 6}), leaf({6}), leaf({6})})
  check(function(x) return (F.layer_norm(x, {5})) end, {leaf({4, 5}, true)})
  check(function(x, w) return (F.layer_norm(x, w)) end, {leaf({3, 5}), leaf({5})})
  check(function(x, w) return (F.rms_norm(x, w)) end, {leaf({2, 3, 6}), leaf({6})})
  check(function(x) return (F.rms_norm(x)) end, {leaf({4, 5}, true)})
end)

test("F.cross_entropy: mean over valid targets, sum, none, (B, T, V) logits", function()
  local t = lt.tensor({0, 2, -100, 1}, "i64")
  check(function(x)
    return (F.cross_entropy(x, t)), (F.cross_entropy(x, t, {reduction = "sum"})),
      (F.cross_entropy(x, t, {reduction = "none"}))
  end, {leaf({4, 3})})
  local t3 = lt.tensor({{1, 4, 0}, {3, 3, 2}}, "i32")
  check(function(x) return (F.cross_entropy(x, t3, {ignore_index = 3})) end, {leaf({2, 3, 5})})
  local x = leaf({4, 3})
  local loss = F.cross_entropy(x, t)
  equal(loss.grad_fn, "CrossEntropyBackward")
  loss:backward()
  equal(x.grad[2]:tolist(), {0, 0, 0}) -- the ignored row
end)

test("F.embedding: gradients of repeated ids add up", function()
  local ids = lt.tensor({{0, 2, 2}, {3, 0, 2}}, "i64")
  check(function(w) return F.embedding(ids, w) end, {leaf({4, 3})})
  local w = lt.zeros(4, 2, {requires_grad = true})
  F.embedding(ids, w):sum():backward()
  equal(w.grad:tolist(), {{2, 2}, {0, 0}, {3, 3}, {1, 1}})
end)

test("F.rope: default positions, given positions, theta", function()
  check(function(x) return F.rope(x) end, {leaf({2, 3, 2, 4})})
  local pos = lt.tensor({{3, 1, 7}, {0, 5, 2}}, "i64")
  check(function(x) return F.rope(x, pos, 500) end, {leaf({2, 3, 1, 6})})
end)

test("F.rope: the caller's frequencies and scale ({inv_freq =, scale =}); bad rope tables", function()
  local pos = lt.tensor({{3, 1, 7}, {0, 5, 2}}, "i64")
  local rf = {inv_freq = {0.9, 0.02, 0.0004}, scale = 1.3}
  check(function(x) return F.rope(x, pos, rf) end, {leaf({2, 3, 2, 6})})
  check(function(x) return F.rope(x, nil, {inv_freq = lt.tensor({1.5, 0.1}, "f64")}) end, {leaf({1, 4, 1, 4})})
  -- theta's own table and scale 1 are theta, bit for bit; the scale multiplies the result
  local x = lt.randn(2, 3, 2, 6, "f64")
  local tab = {}
  for i = 0, 2 do tab[i + 1] = 500 ^ (-2 * i / 6) end
  close(F.rope(x, pos, {inv_freq = tab}), F.rope(x, pos, 500), {rtol = 0, atol = 0})
  close(F.rope(x, pos, {inv_freq = tab, scale = 2}), F.rope(x, pos, 500) * 2, {rtol = 1e-15, atol = 0})
  close(F.rope_backward(F.rope(x, pos, rf), pos, rf), x * (1.3 * 1.3), {rtol = 1e-13, atol = 1e-13})
  fails("rope: rope must be theta (a number) or a table {inv_freq =, scale =}, got string",
    function() F.rope(x, pos, "llama3") end)
  fails("rope: rope.inv_freq must be a list of numbers or an f64 cpu tensor, got nil", function() F.rope(x, pos, {}) end)
  fails("rope: rope.inv_freq[2] must be a finite number, got nan",
    function() F.rope(x, pos, {inv_freq = {1, 0 / 0, 1}}) end)
  fails("rope: rope.scale must be a positive number, got -1",
    function() F.rope(x, pos, {inv_freq = tab, scale = -1}) end)
  fails("rope: rope: unknown key 'rope_type' (inv_freq, scale)",
    function() F.rope(x, pos, {inv_freq = tab, rope_type = "yarn"}) end)
  fails("rope: inv_freq must be (D / 2) = (3) f64 on the cpu", function() F.rope(x, pos, {inv_freq = {1, 2}}) end)
  fails("rope: rope.inv_freq must be an f64 cpu tensor of D / 2 numbers, got f32 cpu [3]",
    function() F.rope(x, pos, {inv_freq = lt.tensor(tab, "f32")}) end)
end)

test("F.scaled_dot_product_attention: causal or not, GQA, segment ids, scale", function()
  check(function(q, k, v) return (F.scaled_dot_product_attention{q, k, v}) end,
    {leaf({1, 3, 2, 4}), leaf({1, 4, 2, 4}), leaf({1, 4, 2, 4})})
  check(function(q, k, v) return (F.scaled_dot_product_attention{q, k, v, causal = true, scale = 0.3}) end,
    {leaf({2, 3, 4, 2}), leaf({2, 3, 2, 2}), leaf({2, 3, 2, 2})}) -- GQA: 4 heads, 2 kv heads
  local seg = lt.tensor({{0, 0, 1, 1}}, "i64")
  check(function(q, k, v) return (F.scaled_dot_product_attention{q = q, k = k, v = v, causal = true,
    segment_ids = seg}) end, {leaf({1, 4, 1, 3}), leaf({1, 4, 1, 3}), leaf({1, 4, 1, 3})})
  -- only v requires grad
  check(function(v) return (F.scaled_dot_product_attention{lt.ones(1, 2, 1, 2, "f64"), lt.ones(1, 2, 1, 2, "f64"), v}) end,
    {leaf({1, 2, 1, 2})})
end)

test("F.scaled_dot_product_attention: sliding windows, with segments, after a cache; bad windows", function()
  check(function(q, k, v) return (F.scaled_dot_product_attention{q, k, v, causal = true, window = 2}) end,
    {leaf({2, 5, 2, 3}), leaf({2, 5, 1, 3}), leaf({2, 5, 1, 3})})
  local seg = lt.tensor({{0, 0, 0, 0, 1, 1}}, "i32")
  check(function(q, k, v) return (F.scaled_dot_product_attention{q, k, v, causal = true, window = 3,
    segment_ids = seg}) end, {leaf({1, 6, 1, 4}), leaf({1, 6, 1, 4}), leaf({1, 6, 1, 4})})
  -- 2 queries at positions 4, 5 after 4 cached keys: the window counts absolute positions
  check(function(q, k, v) return (F.scaled_dot_product_attention{q, k, v, causal = true, window = 3}) end,
    {leaf({1, 2, 2, 3}), leaf({1, 6, 2, 3}), leaf({1, 6, 2, 3})})
  -- window 1: each query sees its own key alone, so out = v
  local v = lt.randn(1, 4, 1, 3, "f64")
  local out = F.scaled_dot_product_attention{lt.randn(1, 4, 1, 3, "f64"), lt.randn(1, 4, 1, 3, "f64"), v,
    causal = true, window = 1}
  close(out, v, {rtol = 1e-12, atol = 1e-12})
  -- F.attention_backward with the window gives the recorded op's gradients (and not those without it)
  local q, k, vv = leaf({1, 5, 1, 3}), leaf({1, 5, 1, 3}), leaf({1, 5, 1, 3})
  local G = lt.randn(1, 5, 1, 3, "f64")
  local o, lse = F.scaled_dot_product_attention{q, k, vv, causal = true, window = 2}
  ;(o * G):sum():backward()
  local dq, dk, dv = F.attention_backward{G, q, k, vv, o, lse, causal = true, window = 2}
  close(dq, q.grad, {rtol = 1e-12, atol = 1e-12})
  close(dk, k.grad, {rtol = 1e-12, atol = 1e-12})
  close(dv, vv.grad, {rtol = 1e-12, atol = 1e-12})
  local o0, lse0 = F.scaled_dot_product_attention{q, k, vv, causal = true}
  local dq0 = F.attention_backward{G, q, k, vv, o0, lse0, causal = true}
  assert((dq0 - dq):abs():max():item() > 1e-6, "the window changes the gradients")
  fails("attention_forward: window must be >= 0 (0: none), got -1", function()
    F.scaled_dot_product_attention{q, k, k, causal = true, window = -1}
  end)
  fails("attention_forward: a sliding window (window 2) needs causal attention", function()
    F.scaled_dot_product_attention{q, k, k, window = 2}
  end)
  fails("scaled_dot_product_attention: window must be an integer (0 or nil: none), got 1.5", function()
    F.scaled_dot_product_attention{q, k, k, causal = true, window = 1.5}
  end)
end)

test("a small MLP: f32 gradients match f64 ones; .grad keeps the parameter's dtype", function()
  local function mlp(x, w1, b1, w2, g, t)
    local h = F.linear(x, w1, b1):gelu()
    h = F.layer_norm(h, g)
    return F.cross_entropy(F.linear(h, w2), t)
  end
  local shapes = {{6, 5}, {8, 5}, {8}, {3, 8}, {8}}
  local p64 = {}
  for i, s in ipairs(shapes) do p64[i] = leaf(s) end
  local t = lt.tensor({0, 2, 1, 1, 0, 2}, "i64")
  mlp(p64[1], p64[2], p64[3], p64[4], p64[5], t):backward()
  local p32 = {}
  for i = 1, #p64 do p32[i] = p64[i]:detach():float():requires_grad_() end
  mlp(p32[1], p32[2], p32[3], p32[4], p32[5], t):backward()
  for i = 1, #p64 do
    equal(p32[i].grad.dtype, "f32")
    close(p32[i].grad:double(), p64[i].grad, {rtol = 1e-4, atol = 1e-5, msg = "param " .. i})
  end
end)

test("errors: out= with inputs that require grad into a leaf, wrong shapes still reported", function()
  local w = lt.ones(3, 3, {requires_grad = true})
  fails("leaf tensor that requires grad", function() lt.matmul(lt.ones(3, 3), lt.ones(3, 3), w) end)
  fails("inner dims differ", function() lt.matmul(w, lt.ones(2, 2)) end)
end)

test("F.cross_entropy on logits only the graph holds: the same gradients, also with retain_graph", function()
  local x = leaf({4, 5})
  local w = leaf({3, 5})
  local t = lt.tensor({0, 2, 1, 2}, "i64")
  local function loss()
    local logits = F.linear(x, w) -- held by the graph only once this function returns
    return F.cross_entropy(logits, t)
  end
  loss():backward()
  local once = w.grad:tolist()
  w.grad = nil
  local l = loss()
  collectgarbage()
  l:backward{retain_graph = true}
  l:backward() -- the logits were kept for this second pass
  close(w.grad, lt.tensor(once, {dtype = "f64"}) * 2, {rtol = 1e-12, atol = 1e-14})
end)
