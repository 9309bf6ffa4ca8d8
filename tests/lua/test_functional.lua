-- lutra.F: the fused kernels through their Lua wrappers, against naive Lua references
-- (forward) and finite differences or closed forms (backward), in f64 unless noted.
local lt = require "lutra"
local T = require "lutra.testing"
local F = lt.F
local close, equal, fails = T.assert_close, T.assert_equal, T.assert_error

local TOL64 = {rtol = 1e-10, atol = 1e-12}

local function randn_list(shape) return T.random_list(shape, function() return T.uniform() * 2 - 1 end) end
local function rand(shape, dt) return lt.tensor(randn_list(shape), {dtype = dt or "f64"}) end

-- Rows of the last dim as Lua lists.
local function rows(t)
  local c = t:size(-1)
  return t:reshape(-1, c):tolist(), c
end

local function row_stats(r)
  local m, v = 0, 0
  for _, x in ipairs(r) do m = m + x end
  m = m / #r
  for _, x in ipairs(r) do v = v + (x - m) ^ 2 end
  return m, v / #r
end

-- d(sum(dout * f(x)))/dx by central differences, x an f64 tensor modified in place.
local function finite_diff(f, x, dout, h)
  h = h or 1e-6
  local flat = x:view(-1)
  local grad = {}
  for i = 0, flat:size(0) - 1 do
    local v = flat[i]:item()
    flat[i] = v + h
    local up = (f() * dout):sum():item()
    flat[i] = v - h
    local down = (f() * dout):sum():item()
    flat[i] = v
    grad[i + 1] = (up - down) / (2 * h)
  end
  return grad
end

test("layer_norm against a reference, with its saved statistics", function()
  local x, w, b = rand({2, 3, 8}), rand({8}), rand({8})
  local y, mean, rstd = F.layer_norm(x, w, b, 1e-5)
  local xr, c = rows(x)
  local want, wm, wr = {}, {}, {}
  local wl, bl = w:tolist(), b:tolist()
  for i, r in ipairs(xr) do
    local m, v = row_stats(r)
    wm[i], wr[i] = m, 1 / math.sqrt(v + 1e-5)
    want[i] = {}
    for k = 1, c do want[i][k] = (r[k] - m) * wr[i] * wl[k] + bl[k] end
  end
  equal(y.shape, {2, 3, 8})
  close(y:view(-1, 8), want, TOL64)
  close(mean:view(-1), wm, {rtol = 1e-6, atol = 1e-7})
  close(rstd:view(-1), wr, {rtol = 1e-6, atol = 1e-7})
  -- torch's signature with normalized_shape, and no affine
  close(F.layer_norm(x, {8}, w, b), y, TOL64)
  local plain = F.layer_norm(x)
  close(plain, F.layer_norm(x, lt.ones(8, "f64"), lt.zeros(8, "f64")), TOL64)
  fails("only the last dim", function() F.layer_norm(x, {3, 8}, w, b) end)
  -- backward against finite differences
  local dout = rand({2, 3, 8})
  local dx, dw, db = F.layer_norm_backward(dout, x, w, mean, rstd)
  close(dx:view(-1), finite_diff(function() return (F.layer_norm(x, w, b)) end, x, dout), {rtol = 1e-5, atol = 1e-7})
  close(dw, finite_diff(function() return (F.layer_norm(x, w, b)) end, w, dout), {rtol = 1e-5, atol = 1e-7})
  close(db, finite_diff(function() return (F.layer_norm(x, w, b)) end, b, dout), {rtol = 1e-5, atol = 1e-7})
end)

test("rms_norm against a reference, and its backward", function()
  local x, w = rand({4, 6}), rand({6})
  local y, rstd = F.rms_norm(x, w, 1e-6)
  local xr = x:tolist()
  local wl = w:tolist()
  local want = {}
  for i, r in ipairs(xr) do
    local ms = 0
    for _, v in ipairs(r) do ms = ms + v * v end
    local rs = 1 / math.sqrt(ms / #r + 1e-6)
    want[i] = {}
    for k = 1, #r do want[i][k] = r[k] * rs * wl[k] end
  end
  close(y, want, TOL64)
  equal(rstd:numel(), 4)
  close(F.rms_norm(x, {6}, w, 1e-6), y, TOL64)
  local dout = rand({4, 6})
  local dx, dw = F.rms_norm_backward(dout, x, w, rstd)
  close(dx:view(-1), finite_diff(function() return (F.rms_norm(x, w)) end, x, dout), {rtol = 1e-5, atol = 1e-7})
  close(dw, finite_diff(function() return (F.rms_norm(x, w)) end, w, dout), {rtol = 1e-5, atol = 1e-7})
end)

test("linear", function()
  local x, w, b = rand({2, 3, 4}), rand({5, 4}), rand({5})
  local y = F.linear(x, w, b)
  equal(y.shape, {2, 3, 5})
  close(y, x:matmul(w:t()) + b, TOL64)
  close(F.linear(x, w), x:matmul(w:t()), TOL64)
  -- the bias goes in first and the gemm adds into it: f32, 2-D and non-contiguous x, and the
  -- cases that add it after (a broadcast (1, out) bias, an out given); errors as before
  local x32, w32, b32 = lt.randn(3, 7, 6), lt.randn(9, 6), lt.randn(9)
  local want = x32:to("f64"):matmul(w32:to("f64"):t()) + b32:to("f64")
  close(F.linear(x32, w32, b32):to("f64"), want, {rtol = 1e-5, atol = 1e-5})
  local xt = lt.randn(6, 5):t()
  close(F.linear(xt, w32, b32):to("f64"), xt:to("f64"):matmul(w32:to("f64"):t()) + b32:to("f64"),
    {rtol = 1e-5, atol = 1e-5})
  fails("dtype mismatch", function() F.linear(x32, w32, b32:to("f64")) end)
  close(F.linear(x32, w32, b32:view(1, 9)):to("f64"), want, {rtol = 1e-5, atol = 1e-5})
  local out = lt.empty(3, 7, 9)
  F.linear(x32, w32, b32, out)
  close(out:to("f64"), want, {rtol = 1e-5, atol = 1e-5})
  fails("[3,7,9] and [8]", function() F.linear(x32, w32, lt.randn(8)) end)
end)

test("cross_entropy: mean over non-ignored targets, sum, none, (B, T, V) logits", function()
  local logits = rand({2, 3, 5})
  local targets = lt.tensor({{0, 4, -100}, {2, -100, 1}}, {dtype = "i64"})
  local lr = logits:reshape(-1, 5):tolist()
  local tl = targets:reshape(-1):tolist()
  local want, total, count = {}, 0, 0
  for i, r in ipairs(lr) do
    local mx = math.max(unpack(r))
    local s = 0
    for _, v in ipairs(r) do s = s + math.exp(v - mx) end
    local lse = mx + math.log(s)
    if tl[i] == -100 then
      want[i] = 0
    else
      want[i] = lse - r[tl[i] + 1] -- targets are 0-based class indices
      total, count = total + want[i], count + 1
    end
  end
  local loss, losses, lse = F.cross_entropy(logits, targets)
  equal(loss.shape, {})
  close(loss:item(), total / count, {rtol = 1e-6})
  close(losses, want, {rtol = 1e-6, atol = 1e-7})
  equal(lse:numel(), 6)
  close(F.cross_entropy(logits, targets, {reduction = "sum"}):item(), total, {rtol = 1e-6})
  close(F.cross_entropy(logits, targets, {reduction = "none"}), want, {rtol = 1e-6, atol = 1e-7})
  -- a different ignore_index: now -100 is a bad class index, so use 4 instead
  local t2 = lt.tensor({{0, 4, 1}, {2, 3, 1}}, {dtype = "i32"})
  local l2 = F.cross_entropy(logits, t2, {ignore_index = 4})
  local l2_want = F.cross_entropy(logits, t2, {reduction = "none", ignore_index = 4}):sum():item() / 5
  close(l2:item(), l2_want, {rtol = 1e-6})
  fails("reduction must be", function() F.cross_entropy(logits, targets, {reduction = "avg"}) end)
  -- backward: dlogits = dloss * (softmax - onehot), 0 on ignored rows
  local dlosses = lt.ones(6)
  local dlogits = F.cross_entropy_backward(dlosses, logits, targets, lse)
  equal(dlogits.shape, {2, 3, 5})
  local p = logits:reshape(-1, 5):softmax(-1):tolist()
  for i = 1, 6 do
    for k = 1, 5 do
      p[i][k] = tl[i] == -100 and 0 or p[i][k] - (k - 1 == tl[i] and 1 or 0)
    end
  end
  close(dlogits:reshape(-1, 5), p, {rtol = 1e-5, atol = 1e-6})
end)

test("embedding and its backward", function()
  local w = rand({6, 3})
  local ids = lt.tensor({{5, 0}, {2, 5}}, {dtype = "i64"})
  local y = F.embedding(ids, w)
  equal(y.shape, {2, 2, 3})
  local wl = w:tolist()
  close(y, {{wl[6], wl[1]}, {wl[3], wl[6]}}, TOL64)
  local dout = rand({2, 2, 3})
  local dw = F.embedding_backward(dout, ids, w)
  equal(dw.shape, {6, 3})
  local d = dout:tolist()
  local want = {}
  for v = 1, 6 do want[v] = {0, 0, 0} end
  for _, pair in ipairs {{{1, 1}, 6}, {{1, 2}, 1}, {{2, 1}, 3}, {{2, 2}, 6}} do
    for k = 1, 3 do want[pair[2]][k] = want[pair[2]][k] + d[pair[1][1]][pair[1][2]][k] end
  end
  close(dw, want, TOL64)
  close(F.embedding_backward(dout, ids, {6, 3}), want, TOL64)
end)

test("rope: rotate-half reference, positions, and the inverse as backward", function()
  local B, Tn, H, D, theta = 2, 3, 2, 4, 10000
  local x = rand({B, Tn, H, D})
  local xl = x:tolist()
  local function ref(pos)
    local out = {}
    for b = 1, B do
      out[b] = {}
      for t = 1, Tn do
        out[b][t] = {}
        local p = pos and pos[t] or (t - 1)
        for h = 1, H do
          local r, o = xl[b][t][h], {}
          for i = 1, D / 2 do
            local ang = p * theta ^ (-2 * (i - 1) / D)
            o[i] = r[i] * math.cos(ang) - r[i + D / 2] * math.sin(ang)
            o[i + D / 2] = r[i + D / 2] * math.cos(ang) + r[i] * math.sin(ang)
          end
          out[b][t][h] = o
        end
      end
    end
    return out
  end
  local tol = {rtol = 1e-6, atol = 1e-7}
  close(F.rope(x), ref(), tol)
  local pos = lt.tensor({4, 1, 7}, {dtype = "i64"})
  close(F.rope(x, pos, theta), ref({4, 1, 7}), tol)
  close(F.rope_backward(F.rope(x, pos), pos), x, {rtol = 1e-9, atol = 1e-12})
end)

-- Naive attention in Lua: q (B, T, H, D), k and v (B, S, Hkv, D).
local function ref_attention(q, k, v, scale, causal)
  local ql, kl, vl = q:tolist(), k:tolist(), v:tolist()
  local B, Tn, H, D = unpack(q.shape)
  local S, Hkv = k:size(1), k:size(2)
  local out = {}
  for b = 1, B do
    out[b] = {}
    for t = 1, Tn do
      out[b][t] = {}
      for h = 1, H do
        local kh = math.floor((h - 1) / (H / Hkv)) + 1
        local scores, mx = {}, -math.huge
        for s = 1, S do
          if not causal or (s - 1) <= (t - 1) + (S - Tn) then
            local dot = 0
            for d = 1, D do dot = dot + ql[b][t][h][d] * kl[b][s][kh][d] end
            scores[s] = dot * scale
            mx = math.max(mx, scores[s])
          end
        end
        local z, o = 0, {}
        for d = 1, D do o[d] = 0 end
        for s, sc in pairs(scores) do
          local p = math.exp(sc - mx)
          z = z + p
          for d = 1, D do o[d] = o[d] + p * vl[b][s][kh][d] end
        end
        for d = 1, D do o[d] = o[d] / z end
        out[b][t][h] = o
      end
    end
  end
  return out
end

test("scaled_dot_product_attention: causal, GQA, scale, backward", function()
  local q, k, v = rand({1, 4, 4, 3}), rand({1, 4, 2, 3}), rand({1, 4, 2, 3})
  local tol = {rtol = 1e-8, atol = 1e-10}
  for _, causal in ipairs {false, true} do
    local out, lse = F.scaled_dot_product_attention {q, k, v, causal = causal}
    equal(out.shape, {1, 4, 4, 3})
    equal(lse.shape, {1, 4, 4})
    close(out, ref_attention(q, k, v, 1 / math.sqrt(3), causal), tol)
  end
  close(F.scaled_dot_product_attention {q = q, k = k, v = v, scale = 0.3}, ref_attention(q, k, v, 0.3, false), tol)
  -- backward of sum(dout * out) against finite differences
  local dout = rand({1, 4, 4, 3})
  local out, lse = F.scaled_dot_product_attention {q, k, v, causal = true}
  local dq, dk, dv = F.attention_backward {dout, q, k, v, out, lse, causal = true}
  local function f() return (F.scaled_dot_product_attention {q, k, v, causal = true}) end
  local fd = {rtol = 1e-5, atol = 1e-7}
  close(dq:view(-1), finite_diff(f, q, dout), fd)
  close(dk:view(-1), finite_diff(f, k, dout), fd)
  close(dv:view(-1), finite_diff(f, v, dout), fd)
  fails("expected a table", function() F.scaled_dot_product_attention(q, k, v) end)
end)

test("adamw_step against the update rule", function()
  local p, g = rand({5}, "f32"), rand({5}, "f32")
  local m, v = lt.zeros(5), lt.zeros(5)
  local p0, gl = p:tolist(), g:tolist()
  local lr, b1, b2, eps, wd = 1e-2, 0.9, 0.999, 1e-8, 0.1
  local mm, vv = {}, {}
  for step = 1, 3 do
    F.adamw_step(p, g, m, v, {lr = lr, beta1 = b1, beta2 = b2, eps = eps, weight_decay = wd, step = step})
    for i = 1, 5 do
      mm[i] = b1 * (mm[i] or 0) + (1 - b1) * gl[i]
      vv[i] = b2 * (vv[i] or 0) + (1 - b2) * gl[i] ^ 2
      local mhat, vhat = mm[i] / (1 - b1 ^ step), vv[i] / (1 - b2 ^ step)
      p0[i] = p0[i] - lr * (mhat / (math.sqrt(vhat) + eps) + wd * p0[i])
    end
  end
  close(p, p0, {rtol = 1e-5, atol = 1e-6})
  close(m, mm, {rtol = 1e-5, atol = 1e-7})
  fails("opts.step", function() F.adamw_step(p, g, m, v, {lr = 1}) end)
end)

test("softmax, log_softmax and unary backward wrappers", function()
  local x, dout = rand({3, 4}), rand({3, 4})
  local y = x:softmax(-1)
  close(F.softmax_backward(dout, y, -1):view(-1), finite_diff(function() return x:softmax(-1) end, x, dout),
    {rtol = 1e-6, atol = 1e-8})
  local ly = x:log_softmax(1)
  close(F.log_softmax_backward(dout, ly, 1):view(-1), finite_diff(function() return x:log_softmax(1) end, x, dout),
    {rtol = 1e-6, atol = 1e-8})
  for _, op in ipairs {"tanh", "gelu", "silu", "sigmoid", "exp"} do
    close(F.unary_backward(dout, x, op):view(-1), finite_diff(function() return x[op](x) end, x, dout),
      {rtol = 1e-6, atol = 1e-8, msg = op})
  end
  fails("unknown op", function() F.unary_backward(dout, x, "nope") end)
  close(F.relu(x), x:relu(), TOL64)
end)
