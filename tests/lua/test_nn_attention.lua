-- nn.CausalSelfAttention (MHA, GQA, MQA; learned positions or RoPE) and nn.Block
-- against naive references built from matmul, softmax and elementwise ops, in f64;
-- the key/value cache against the full forward.
local lt = require "lutra"
local nn = require "lutra.nn"
local T = require "lutra.testing"
local close, equal, fails = T.assert_close, T.assert_equal, T.assert_error

local TOL = {rtol = 1e-9, atol = 1e-11}

local function randn(...) return lt.randn(...):to("f64") end

local function linear_ref(x, lin)
  local y = x:matmul(lin.weight:t())
  if lin.bias ~= nil then y = y + lin.bias end
  return y
end

-- x (B, T, H, D) rotated by positions pos0 .. pos0 + T - 1: "rotate half",
-- x * cos + cat(-x2, x1) * sin with angle p * theta^(-2j/D), or with rope_freq {inv_freq, scale}
-- angle p * inv_freq[j] and cos, sin times scale.
local function rope_ref(x, theta, pos0, rope_freq)
  local Tn, D = x:size(1), x:size(3)
  local half = D / 2
  local cos, sin = {}, {}
  local scale = rope_freq and rope_freq.scale or 1
  for t = 1, Tn do
    cos[t], sin[t] = {{}}, {{}}
    for j = 0, half - 1 do
      local freq = rope_freq and rope_freq.inv_freq[j + 1] or theta ^ (-2 * j / D)
      local angle = (pos0 + t - 1) * freq
      cos[t][1][j + 1], sin[t][1][j + 1] = scale * math.cos(angle), scale * math.sin(angle)
    end
  end
  cos, sin = lt.tensor(cos, "f64"), lt.tensor(sin, "f64") -- (T, 1, D/2)
  local x1, x2 = x:narrow(3, 0, half), x:narrow(3, half, half)
  return lt.cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, 3)
end

-- Causal softmax attention, head by head; head h reads kv head h // (H / Hkv). With a window W,
-- query t also needs t - s < W (transformers' sliding window: kv_idx > q_idx - sliding_window).
local function attention_ref(attn, x, pos0, rope_freq)
  pos0 = pos0 or 0
  local B, Tn = x:size(0), x:size(1)
  local H, Hkv, D = attn.n_head, attn.n_kv_head, attn.head_dim
  local qkv = linear_ref(x, attn.qkv)
  local q = qkv:narrow(2, 0, H * D):reshape(B, Tn, H, D)
  local k = qkv:narrow(2, H * D, Hkv * D):reshape(B, Tn, Hkv, D)
  local v = qkv:narrow(2, (H + Hkv) * D, Hkv * D):reshape(B, Tn, Hkv, D)
  if attn.rope then
    q, k = rope_ref(q, attn.rope_theta, pos0, rope_freq), rope_ref(k, attn.rope_theta, pos0, rope_freq)
  end
  local allowed = lt.arange(Tn):unsqueeze(1):ge(lt.arange(Tn)) -- (T, T): key s <= query t
  local in_window = (lt.arange(Tn):unsqueeze(1) - lt.arange(Tn)):lt(attn.window > 0 and attn.window or Tn + 1)
  local heads = {}
  for h = 0, H - 1 do
    local g = math.floor(h / (H / Hkv))
    local qh, kh, vh = q:select(2, h), k:select(2, g), v:select(2, g) -- (B, T, D)
    local scores = qh:matmul(kh:transpose(1, 2)) / math.sqrt(D)
    scores = lt.where(allowed, scores, -math.huge)
    scores = lt.where(in_window, scores, -math.huge)
    heads[#heads + 1] = scores:softmax(-1):matmul(vh)
  end
  local y = lt.stack(heads, 2):reshape(B, Tn, H * D)
  return linear_ref(y, attn.proj)
end

local CASES = {
  {name = "MHA", n_head = 4, n_kv_head = 4},
  {name = "GQA", n_head = 4, n_kv_head = 2},
  {name = "MQA", n_head = 4, n_kv_head = 1},
  {name = "GQA + RoPE", n_head = 6, n_kv_head = 3, rope = true, bias = false},
  {name = "MQA + RoPE, theta 500", n_head = 2, n_kv_head = 1, rope = true, rope_theta = 500},
  {name = "GQA + RoPE, sliding window 3", n_head = 4, n_kv_head = 2, rope = true, window = 3},
  {name = "MHA, sliding window 1", n_head = 2, n_kv_head = 2, window = 1},
}

for _, c in ipairs(CASES) do
  test("CausalSelfAttention " .. c.name .. ": shapes and forward against the reference", function()
    local C = c.n_head * 4
    local attn = nn.CausalSelfAttention {d_model = C, n_head = c.n_head, n_kv_head = c.n_kv_head, rope = c.rope,
                                         rope_theta = c.rope_theta, bias = c.bias, window = c.window, dtype = "f64"}
    equal(attn.qkv.weight.shape, {(c.n_head + 2 * c.n_kv_head) * 4, C})
    equal(attn.proj.weight.shape, {C, C})
    equal(attn.qkv.bias == nil, c.bias == false)
    local x = randn(2, 7, C)
    local y = attn(x)
    equal(y.shape, {2, 7, C})
    close(y, attention_ref(attn, x), TOL)
  end)
end

test("CausalSelfAttention: the future does not leak", function()
  local attn = nn.CausalSelfAttention {d_model = 8, n_head = 2, rope = true, dtype = "f64"}
  local x = randn(1, 6, 8)
  local y = attn(x)
  local x2 = x:clone()
  x2[{0, {4}}] = randn(2, 8) -- change positions 4 and 5
  local y2 = attn(x2)
  close(y2:narrow(1, 0, 4), y:narrow(1, 0, 4), TOL)
  assert((y2:narrow(1, 4, 2) - y:narrow(1, 4, 2)):abs():max():item() > 1e-3)
end)

test("CausalSelfAttention: incremental decoding with the cache equals the full forward", function()
  for _, rope in ipairs {false, true} do
    local attn = nn.CausalSelfAttention {d_model = 12, n_head = 3, n_kv_head = 1, rope = rope, dtype = "f64"}
    local x = randn(2, 9, 12)
    local full = attn(x)
    local cache = attn:new_cache(2, 10)
    equal(cache.k.shape, {2, 10, 1, 4})
    local parts = lt.no_grad(function()
      local a = attn(x:narrow(1, 0, 5), cache, 0)
      local b = attn(x:narrow(1, 5, 1), cache, 5)
      local c = attn(x:narrow(1, 6, 3), cache, 6)
      return {a, b, c}
    end)
    close(lt.cat(parts, 1), full, TOL)
    fails("the key/value cache is for inference: run under lutra.no_grad", function() attn(x, cache, 0) end)
    fails("the cache holds 10 positions; 9 + 2 do not fit",
      function() lt.no_grad(function() attn(x:narrow(1, 0, 2), cache, 9) end) end)
  end
end)

test("CausalSelfAttention: sliding window, incremental decoding with the cache equals the full forward", function()
  local attn = nn.CausalSelfAttention {d_model = 12, n_head = 3, n_kv_head = 1, rope = true, window = 4,
                                       dtype = "f64"}
  local x = randn(2, 11, 12)
  local full = attn(x)
  close(full, attention_ref(attn, x), TOL)
  local cache = attn:new_cache(2, 12)
  local parts = lt.no_grad(function()
    local out = {attn(x:narrow(1, 0, 3), cache, 0)}
    for t = 3, 10 do out[#out + 1] = attn(x:narrow(1, t, 1), cache, t) end
    return out
  end)
  close(lt.cat(parts, 1), full, TOL)
  -- a key leaves the window: position 9 no longer sees positions 0 .. 5
  local x2 = x:clone()
  x2[{0, {0, 6}}] = randn(6, 12)
  close(attn(x2):narrow(1, 9, 2), full:narrow(1, 9, 2), TOL)
end)

test("CausalSelfAttention: sliding window gradients (the fused qkv op) against finite differences", function()
  local attn = nn.CausalSelfAttention {d_model = 8, n_head = 2, n_kv_head = 1, rope = true, window = 2, dtype = "f64"}
  local x = T.random_leaf({1, 5, 8})
  T.gradcheck(function(a) return attn(a) end, {x})
  equal(attn:extra_repr(), "d_model=8, n_head=2, n_kv_head=1, rope_theta=10000, window=2")
end)

-- a llama3-like table for head dim 6 (3 frequencies) and a yarn-like scale
local RF = {inv_freq = {1.0, 0.05, 0.0007}, scale = 1.15}

test("CausalSelfAttention: rope_freq (the caller's frequencies and scale), full, cached and gradients", function()
  local attn = nn.CausalSelfAttention {d_model = 12, n_head = 2, n_kv_head = 1, rope = true, rope_freq = RF,
                                       window = 3, dtype = "f64"}
  equal(attn:extra_repr(), "d_model=12, n_head=2, n_kv_head=1, rope_freq, window=3")
  local x = randn(2, 7, 12)
  local full = attn(x)
  close(full, attention_ref(attn, x, 0, RF), TOL)
  local cache = attn:new_cache(2, 7)
  local parts = lt.no_grad(function() return {attn(x:narrow(1, 0, 4), cache, 0), attn(x:narrow(1, 4, 3), cache, 4)} end)
  close(lt.cat(parts, 1), full, TOL)
  -- the same as an f64 tensor of frequencies
  local attn2 = nn.CausalSelfAttention {d_model = 12, n_head = 2, n_kv_head = 1, rope = true, window = 3,
    rope_freq = {inv_freq = lt.tensor(RF.inv_freq, "f64"), scale = RF.scale}, dtype = "f64"}
  lt.no_grad(function()
    attn2.qkv.weight:copy_(attn.qkv.weight)
    attn2.qkv.bias:copy_(attn.qkv.bias)
    attn2.proj.weight:copy_(attn.proj.weight)
    attn2.proj.bias:copy_(attn.proj.bias)
  end)
  close(attn2(x), full, {rtol = 0, atol = 0})
  local small = nn.CausalSelfAttention {d_model = 6, n_head = 1, rope = true, rope_freq = RF, dtype = "f64"}
  T.gradcheck(function(a) return small(a) end, {T.random_leaf({1, 4, 6})})
end)

test("CausalSelfAttention: bad configs and inputs", function()
  fails("CausalSelfAttention: give rope_theta or rope_freq, not both",
    function() nn.CausalSelfAttention {d_model = 12, n_head = 2, rope = true, rope_theta = 5, rope_freq = RF} end)
  fails("CausalSelfAttention: rope_freq needs rope = true",
    function() nn.CausalSelfAttention {d_model = 12, n_head = 2, rope_freq = RF} end)
  fails("CausalSelfAttention: rope_freq.inv_freq has 2 numbers, expected 3", function()
    nn.CausalSelfAttention {d_model = 12, n_head = 2, rope = true, rope_freq = {inv_freq = {1, 2}}}
  end)
  fails("CausalSelfAttention: rope_freq.scale must be a positive number, got 0", function()
    nn.CausalSelfAttention {d_model = 12, n_head = 2, rope = true, rope_freq = {inv_freq = RF.inv_freq, scale = 0}}
  end)
  fails("CausalSelfAttention: rope_freq: unknown key 'factor' (inv_freq, scale)", function()
    nn.CausalSelfAttention {d_model = 12, n_head = 2, rope = true, rope_freq = {inv_freq = RF.inv_freq, factor = 8}}
  end)
  fails("CausalSelfAttention: window must be a positive integer, got -2",
    function() nn.CausalSelfAttention {d_model = 8, n_head = 2, window = -2} end)
  fails("CausalSelfAttention: window must be a positive integer, got 1.5",
    function() nn.CausalSelfAttention {d_model = 8, n_head = 2, window = 1.5} end)
  fails("d_model 10 is not a multiple of n_head 4", function() nn.CausalSelfAttention {d_model = 10, n_head = 4} end)
  fails("n_head 4 is not a multiple of n_kv_head 3",
    function() nn.CausalSelfAttention {d_model = 12, n_head = 4, n_kv_head = 3} end)
  fails("rope needs an even head dim", function() nn.CausalSelfAttention {d_model = 6, n_head = 2, rope = true} end)
  fails("unknown option 'heads'", function() nn.CausalSelfAttention {d_model = 6, heads = 2} end)
  local attn = nn.CausalSelfAttention {d_model = 8, n_head = 2}
  fails("expected x (B, T, 8), got [2, 8]", function() attn(lt.randn(2, 8)) end)
end)

local function layer_norm_ref(x, w, b, eps)
  local xc = x - x:mean(-1, true)
  local y = xc / ((xc * xc):mean(-1, true) + eps):sqrt() * w
  if b ~= nil then y = y + b end
  return y
end
local function rms_norm_ref(x, w, eps) return x / ((x * x):mean(-1, true) + eps):sqrt() * w end
local K, CUBIC = math.sqrt(2 / math.pi), 0.044715
local function gelu_ref(x) return x * 0.5 * ((x + x * x * x * CUBIC) * K):tanh() + x * 0.5 end
local function silu_ref(x) return x / ((-x):exp() + 1) end

test("Block (GPT-2 style): x + attn(ln_1(x)), then + mlp(ln_2(x))", function()
  local blk = nn.Block {d_model = 16, n_head = 4, dtype = "f64"}
  lt.no_grad(function()
    for _, p in ipairs(blk:parameters()) do p:copy_(randn(p.shape) * 0.5) end
  end)
  local x = randn(2, 5, 16)
  local h = x + attention_ref(blk.attn, layer_norm_ref(x, blk.ln_1.weight, blk.ln_1.bias, 1e-5))
  local m = blk.mlp
  local want = h + linear_ref(gelu_ref(linear_ref(layer_norm_ref(h, blk.ln_2.weight, blk.ln_2.bias, 1e-5), m.fc)),
    m.proj)
  close(blk(x), want, TOL)
end)

test("Block (Llama style): RMSNorm, RoPE, GQA, SwiGLU", function()
  local blk = nn.Block {d_model = 16, n_head = 4, n_kv_head = 2, norm = "rmsnorm", norm_eps = 1e-5, mlp = "swiglu",
                        ffn_hidden = 24, bias = false, rope = true, dtype = "f64"}
  equal(blk.ln_1.__name, "RMSNorm")
  equal(blk.mlp.__name, "SwiGLU")
  lt.no_grad(function()
    for _, p in ipairs(blk:parameters()) do p:copy_(randn(p.shape) * 0.5) end
  end)
  local x = randn(2, 5, 16)
  local h = x + attention_ref(blk.attn, rms_norm_ref(x, blk.ln_1.weight, 1e-5))
  local m = blk.mlp
  local n = rms_norm_ref(h, blk.ln_2.weight, 1e-5)
  close(blk(x), h + linear_ref(silu_ref(linear_ref(n, m.gate)) * linear_ref(n, m.up), m.proj), TOL)
  fails("norm must be \"layernorm\" or \"rmsnorm\"", function() nn.Block {d_model = 8, n_head = 2, norm = "batch"} end)
  fails("mlp must be \"gelu\" or \"swiglu\"", function() nn.Block {d_model = 8, n_head = 2, mlp = "relu"} end)
end)
