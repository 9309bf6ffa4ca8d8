-- nn.MoE (lutra/nn/moe.lua) and F.grouped_linear against naive references in f64: the output,
-- the balance and z losses from plain Lua doubles (a loop over tokens and their chosen experts,
-- nothing of lutra's ops), the gradients from the same loop written with per-token select and
-- matmul through autograd (none of topk, argsort, index_select, index_add, grouped_linear);
-- capacity dropping, hand formulas for the losses, every float dtype, bad configs.
-- (tests/lua/test_moe_torch.lua checks the same against Mixtral's block in PyTorch.)
local lt = require "lutra"
local T = require "lutra.testing"
local F = lt.F or require "lutra.functional"
local close, equal, assert_error = T.assert_close, T.assert_equal, T.assert_error

local function silu(v) return v / (1 + math.exp(-v)) end
local function gelu(v) return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ^ 3))) end

-- A layer in f64 with weights large enough that the experts differ clearly (router: scale).
local function layer(cfg, scale)
  cfg.dtype = "f64"
  local m = lt.nn.MoE(cfg)
  lt.no_grad(function()
    for _, p in ipairs(m:parameters()) do lt.normal_(p, 0, 0.5) end
    lt.normal_(m.router.weight, 0, scale or 1)
  end)
  return m
end

-- The routing of each token in plain Lua: probs, the chosen experts (by probability, ties to the
-- lower expert, as topk) and their weights; which slots the capacity keeps (in token order).
local function route(m, X)
  local Wr = m.router.weight:tolist()
  local E, k, N, C = m.n_experts, m.top_k, #X, #X[1]
  local tokens, count, psum, zsum = {}, {}, {}, 0
  for e = 1, E do count[e], psum[e] = 0, 0 end
  local cap = m.capacity_factor and math.max(1, math.ceil(m.capacity_factor * N * k / E)) or math.huge
  local dropped = 0
  for n = 1, N do
    local logits, mx = {}, -math.huge
    for e = 1, E do
      local s = 0
      for c = 1, C do s = s + X[n][c] * Wr[e][c] end
      logits[e], mx = s, math.max(mx, s)
    end
    local p, z = {}, 0
    for e = 1, E do p[e] = math.exp(logits[e] - mx); z = z + p[e] end
    zsum = zsum + (mx + math.log(z)) ^ 2
    local order = {}
    for e = 1, E do p[e] = p[e] / z; psum[e] = psum[e] + p[e]; order[e] = e end
    table.sort(order, function(a, b) return p[a] > p[b] or (p[a] == p[b] and a < b) end)
    local gsum = 0
    for j = 1, k do gsum = gsum + p[order[j]] end
    local chosen = {}
    for j = 1, k do
      local e = order[j]
      count[e] = count[e] + 1
      local kept = count[e] <= cap
      if not kept then dropped = dropped + 1 end
      chosen[j] = {e = e, w = m.norm_topk_prob and p[e] / gsum or p[e], kept = kept}
    end
    tokens[n] = {chosen = chosen, probs = p}
  end
  local balance = 0
  for e = 1, E do balance = balance + (count[e] / (N * k)) * (psum[e] / N) end
  return tokens, balance * E, zsum / N, count, dropped
end

-- One expert on one token's row in plain Lua.
local function expert_row(m, W, e, xr)
  local H, C = m.d_ff, m.d_model
  local h = {}
  for j = 1, H do
    local u = 0
    for c = 1, C do u = u + xr[c] * W.up[e][j][c] end
    if m.activation == "swiglu" then
      local g = 0
      for c = 1, C do g = g + xr[c] * W.gate[e][j][c] end
      h[j] = silu(g) * u
    else
      h[j] = gelu(u)
    end
  end
  local y = {}
  for c = 1, C do
    local s = 0
    for j = 1, H do s = s + h[j] * W.down[e][c][j] end
    y[c] = s
  end
  return y
end

-- The layer's output in plain Lua (shared experts included).
local function naive(m, x)
  local X = x:tolist()
  local W = {up = m.w_up:tolist(), down = m.w_down:tolist(), gate = m.w_gate and m.w_gate:tolist()}
  local tokens, balance, z, count, dropped = route(m, X)
  local out = {}
  for n, tk in ipairs(tokens) do
    local y = {}
    for c = 1, m.d_model do y[c] = 0 end
    for _, ch in ipairs(tk.chosen) do
      if ch.kept then
        local ye = expert_row(m, W, ch.e, X[n])
        for c = 1, m.d_model do y[c] = y[c] + ch.w * ye[c] end
      end
    end
    out[n] = y
  end
  if m.shared then
    local s = m.shared(x):tolist()
    for n = 1, #out do
      for c = 1, m.d_model do out[n][c] = out[n][c] + s[n][c] end
    end
  end
  return out, balance, z, count, dropped
end

-- The same layer as a differentiable loop over tokens and their kept experts, per-token select
-- and matmul; the routing (which experts) from the plain-Lua route, the weights from a softmax
-- of the router's logits. Returns y (N, C) and aux_coef * balance + z_coef * z.
local function naive_graph(m, x, tokens)
  local N, E, k = x:size(0), m.n_experts, m.top_k
  local logits = x:matmul(m.router.weight:t())
  local probs = logits:softmax(-1)
  local rows = {}
  for n = 1, N do
    local xr = x:select(0, n - 1):unsqueeze(0) -- (1, C)
    local p = probs:select(0, n - 1)
    local gsum
    for _, ch in ipairs(tokens[n].chosen) do
      local pe = p:select(0, ch.e - 1)
      gsum = gsum and gsum + pe or pe
    end
    local y = lt.zeros({1, m.d_model}, {dtype = "f64"})
    for _, ch in ipairs(tokens[n].chosen) do
      if ch.kept then
        local e = ch.e - 1
        local h = xr:matmul(m.w_up:select(0, e):t())
        if m.w_gate then
          h = xr:matmul(m.w_gate:select(0, e):t()):silu() * h
        else
          h = h:gelu()
        end
        local w = p:select(0, ch.e - 1)
        if m.norm_topk_prob then w = w / gsum end
        y = y + h:matmul(m.w_down:select(0, e):t()) * w
      end
    end
    rows[n] = y
  end
  local y = lt.cat(rows, 0)
  if m.shared then y = y + m.shared(x) end
  local count = {}
  for e = 1, E do count[e] = 0 end
  for n = 1, N do
    for _, ch in ipairs(tokens[n].chosen) do count[ch.e] = count[ch.e] + 1 end
  end
  local f = lt.tensor(count, {dtype = "f64"}) * (1 / (N * k))
  local balance = (f * probs:mean(0)):sum() * E
  local lse = logits:exp():sum(-1):log()
  local z = (lse * lse):mean()
  return y, balance * m.aux_loss_coef + z * m.z_loss_coef
end

local CASES = {
  {name = "Mixtral: swiglu, 8 experts top-2", cfg = {n_experts = 8, top_k = 2}},
  {name = "top-1, gelu", cfg = {n_experts = 4, top_k = 1, activation = "gelu"}},
  {name = "top-3 of 5, not renormalised", cfg = {n_experts = 5, top_k = 3, norm_topk_prob = false}},
  {name = "every expert (top_k = n_experts)", cfg = {n_experts = 3, top_k = 3}},
  {name = "2 shared experts", cfg = {n_experts = 4, top_k = 2, n_shared_experts = 2}},
  {name = "capacity 0.5", cfg = {n_experts = 4, top_k = 2, capacity_factor = 0.5}, scale = 3},
  {name = "capacity 1.25, gelu, shared", cfg = {n_experts = 3, top_k = 2, capacity_factor = 1.25, activation = "gelu",
                                               n_shared_experts = 1}, scale = 3},
}

for _, case in ipairs(CASES) do
  test("MoE " .. case.name .. ": output, losses and every gradient match the naive loop (f64)", function()
    local C, H = 6, 5
    local cfg = {d_model = C, d_ff = H, aux_loss_coef = 0.3, z_loss_coef = 0.7}
    for key, v in pairs(case.cfg) do cfg[key] = v end
    local m = layer(cfg, case.scale)
    local x = lt.randn(3, 5, C, {dtype = "f64"})
    x.requires_grad = true
    local y = m(x)
    equal(y.shape, {3, 5, C})
    local xf = x:detach():reshape(15, C)
    local want, balance, z, count, dropped = naive(m, xf)
    close(y:detach():reshape(15, C), lt.tensor(want, {dtype = "f64"}), {rtol = 1e-12, atol = 1e-13})
    close(m.balance_loss:item(), balance, {rtol = 1e-13, atol = 0})
    close(m.z_loss:item(), z, {rtol = 1e-13, atol = 0})
    equal(m.tokens_per_expert, count)
    equal(m.dropped, dropped)
    if cfg.capacity_factor then assert(dropped > 0, "the capacity drops slots in this case") end
    -- gradients of sum(y * gout) + aux_loss, against the naive graph's
    local gout = lt.randn(3, 5, C, {dtype = "f64"})
    ;((y * gout):sum() + m.aux_loss):backward()
    local got = {x = x.grad:clone()}
    for name, p in m:named_parameters() do got[name] = p.grad:clone() end
    m:zero_grad()
    local x2 = xf:clone()
    x2.requires_grad = true
    local tokens = route(m, xf:tolist())
    local y2, aux2 = naive_graph(m, x2, tokens)
    ;((y2 * gout:reshape(15, C)):sum() + aux2):backward()
    close(got.x:reshape(15, C), x2.grad, {rtol = 1e-12, atol = 1e-13, msg = "d x"})
    for name, p in m:named_parameters() do
      close(got[name], p.grad, {rtol = 1e-12, atol = 1e-13, msg = "d " .. name})
    end
  end)
end

test("MoE: finite differences agree with its gradients (f64, no ties near the routing)", function()
  local m = layer({d_model = 4, d_ff = 3, n_experts = 4, top_k = 2, z_loss_coef = 0.1, n_shared_experts = 1})
  local x = lt.randn(5, 4, {dtype = "f64"})
  x.requires_grad = true
  T.gradcheck(function(xx) return m(xx), m.aux_loss end, {x}, {atol = 1e-7, rtol = 1e-6})
  -- a parameter's: central differences of sum(y * r) + aux_loss in a few elements of each
  local r = lt.randn(5, 4, {dtype = "f64"})
  local function f() return lt.no_grad(function() return ((m(x:detach()) * r):sum() + m.aux_loss):item() end) end
  ;((m(x:detach()) * r):sum() + m.aux_loss):backward()
  for name, p in m:named_parameters() do
    local flat = p:detach():reshape(-1)
    for _, i in ipairs {0, p:numel() - 1, math.floor(p:numel() / 2)} do
      local v = flat[i]:item()
      lt.no_grad(function() flat[i] = v + 1e-6 end)
      local up = f()
      lt.no_grad(function() flat[i] = v - 1e-6 end)
      local down = f()
      lt.no_grad(function() flat[i] = v end)
      close(p.grad:reshape(-1)[i]:item(), (up - down) / 2e-6, {atol = 1e-7, rtol = 1e-6, msg = name})
    end
  end
end)

test("MoE capacity: each expert keeps its earliest tokens; the rest pass through with 0", function()
  -- every token prefers expert 1, then expert 2 (router rows: 2 * sum, sum, 0, 0 on positive x)
  local C = 4
  local m = layer({d_model = C, d_ff = 3, n_experts = 4, top_k = 1, capacity_factor = 1})
  lt.no_grad(function()
    m.router.weight:copy_(lt.tensor({{2, 2, 2, 2}, {1, 1, 1, 1}, {0, 0, 0, 0}, {0, 0, 0, 0}}, {dtype = "f64"}))
  end)
  local x = lt.rand(8, C, {dtype = "f64"}) + 0.5
  local y = m(x)
  -- capacity = ceil(1 * 8 * 1 / 4) = 2: tokens 1 and 2 go through expert 1, tokens 3..8 are dropped
  equal(m.tokens_per_expert, {8, 0, 0, 0})
  equal(m.dropped, 6)
  local want = naive(m, x)
  close(y, lt.tensor(want, {dtype = "f64"}), {rtol = 1e-12, atol = 1e-13})
  for n = 3, 8 do close(y:select(0, n - 1), lt.zeros({C}, {dtype = "f64"}), {atol = 0, rtol = 0}) end
  assert(y:select(0, 0):abs():sum():item() > 0 and y:select(0, 1):abs():sum():item() > 0)
  -- the same layer without capacity computes them all
  m.capacity_factor = nil
  local y_all = m(x)
  equal(m.dropped, 0)
  close(y_all:narrow(0, 0, 2), y:narrow(0, 0, 2), {atol = 0, rtol = 0})
  assert(y_all:select(0, 7):abs():sum():item() > 0)
  -- top-2: the second choices (expert 2) queue in token order too, so expert 2 keeps tokens 1 and 2
  local m2 = layer({d_model = C, d_ff = 3, n_experts = 4, top_k = 2, capacity_factor = 0.5})
  lt.no_grad(function() m2.router.weight:copy_(m.router.weight) end)
  m2(x)
  equal(m2.tokens_per_expert, {8, 8, 0, 0})
  equal(m2.dropped, 12) -- capacity ceil(0.5 * 8 * 2 / 4) = 2 per expert
end)

test("MoE losses: hand values for a uniform router and for a collapsed one", function()
  local m = layer({d_model = 4, d_ff = 3, n_experts = 4, top_k = 2, aux_loss_coef = 0.5, z_loss_coef = 0.25})
  lt.no_grad(function() m.router.weight:fill_(0) end)
  local x = lt.randn(6, 4, {dtype = "f64"})
  m(x)
  -- probs 1/4 everywhere; ties go to the lower experts: f = (1/2, 1/2, 0, 0), P = 1/4 each
  close(m.balance_loss:item(), 4 * (0.5 * 0.25 + 0.5 * 0.25), {rtol = 1e-15, atol = 0})
  close(m.z_loss:item(), math.log(4) ^ 2, {rtol = 1e-15, atol = 0})
  close(m.aux_loss:item(), 0.5 * 1 + 0.25 * math.log(4) ^ 2, {rtol = 1e-15, atol = 0})
  equal(m.tokens_per_expert, {6, 6, 0, 0})
  -- a router that sends everything to expert 1 with probability ~1: balance -> E * (1/k) * 1 = 2
  lt.no_grad(function() m.router.weight:copy_(lt.tensor({{50, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}},
                                                        {dtype = "f64"})) end)
  local xs = lt.zeros(3, 4, {dtype = "f64"}) + lt.tensor({1, 0, 0, 0}, {dtype = "f64"})
  m(xs)
  close(m.balance_loss:item(), 4 * (0.5 * (1 - 3 * math.exp(-50) / (1 + 3 * math.exp(-50)))
    + 0.5 * math.exp(-50) / (1 + 3 * math.exp(-50))), {rtol = 1e-14, atol = 0})
  close(m.z_loss:item(), (50 + math.log(1 + 3 * math.exp(-50))) ^ 2, {rtol = 1e-14, atol = 0})
end)

test("MoE.aux_loss_of sums the layers' aux losses; nil before any forward", function()
  local model = lt.nn.Module()
  model.a = layer({d_model = 4, d_ff = 3, n_experts = 3, top_k = 1})
  model.b = layer({d_model = 4, d_ff = 3, n_experts = 3, top_k = 2})
  equal(lt.nn.MoE.aux_loss_of(model), nil)
  local x = lt.randn(4, 4, {dtype = "f64"})
  model.a(x)
  model.b(x)
  close(lt.nn.MoE.aux_loss_of(model):item(), model.a.aux_loss:item() + model.b.aux_loss:item(), {rtol = 0, atol = 0})
  equal(#model:parameters(), 8) -- the aux losses set in forward are not parameters
end)

for _, dt in ipairs {"f32", "bf16", "f16"} do
  test("MoE in " .. dt .. ": the f64 layer's output and gradients within the dtype's rounding", function()
    local m = layer({d_model = 8, d_ff = 6, n_experts = 4, top_k = 2, n_shared_experts = 1}, 0.3)
    local x = lt.randn(10, 8, {dtype = "f64"})
    local y64 = m(x)
    y64:sum():backward()
    local g64 = m.w_up.grad:clone()
    local tokens64 = m.tokens_per_expert
    m:zero_grad()
    m:to(dt)
    local y = m(x:to(dt))
    equal(y.dtype, dt)
    y:sum():backward()
    equal(m.w_up.grad.dtype, dt)
    local same = table.concat(m.tokens_per_expert, ",") == table.concat(tokens64, ",")
    if dt == "f32" then assert(same, "f32 routes as f64 here") end
    if same then -- bf16/f16 may route a near tie differently: then only that they ran
      local tol = ({f32 = 1e-5, bf16 = 5e-2, f16 = 1e-2})[dt]
      close(y:to("f64"), y64:detach(), {rtol = tol, atol = tol})
      close(m.w_up.grad:to("f64"), g64, {rtol = tol, atol = tol * 10})
    end
  end)
end

test("F.grouped_linear: each group's rows times its matrix, gradients included, empty groups, strided x", function()
  local W = lt.randn(4, 3, 5, {dtype = "f64"})
  W.requires_grad = true
  local base = lt.randn(5, 9, {dtype = "f64"})
  local x = base:t() -- (9, 5), not contiguous
  x.requires_grad = true
  local counts = {3, 0, 6, 0}
  local y = F.grouped_linear(x, W, counts)
  local want = lt.cat({x:narrow(0, 0, 3):matmul(W:select(0, 0):t()), x:narrow(0, 3, 6):matmul(W:select(0, 2):t())}, 0)
  close(y, want, {rtol = 0, atol = 1e-14})
  T.gradcheck(function(xx, ww) return F.grouped_linear(xx, ww, counts) end,
              {x:detach():clone():requires_grad_(), W:detach():clone():requires_grad_()}, {atol = 1e-8})
  local g = lt.randn(9, 3, {dtype = "f64"})
  ;(y * g):sum():backward()
  close(W.grad:select(0, 1), lt.zeros({3, 5}, {dtype = "f64"}), {atol = 0, rtol = 0})
  close(W.grad:select(0, 2), g:narrow(0, 3, 6):t():matmul(x:detach():narrow(0, 3, 6)), {rtol = 0, atol = 1e-14})
end)

test("F.grouped_linear and nn.MoE: bad arguments are errors that say what is wrong", function()
  local W = lt.randn(2, 3, 4)
  local x = lt.randn(5, 4)
  assert_error("grouped_linear: counts sum to 4, x has 5 rows", F.grouped_linear, x, W, {1, 3})
  assert_error("grouped_linear: counts must be a list of 2 row counts", F.grouped_linear, x, W, {5})
  assert_error("grouped_linear: counts[2] must be a non-negative integer, got -1", F.grouped_linear, x, W, {6, -1})
  assert_error("grouped_linear: expected x (M, in) and weight (G, out, in)", F.grouped_linear, lt.randn(5, 3), W,
               {5, 0})
  assert_error("grouped_linear: x is f64", F.grouped_linear, x:to("f64"), W, {5, 0})
  local MoE = lt.nn.MoE
  assert_error("MoE: top_k (3) must be at most n_experts (2)", MoE, {d_model = 4, d_ff = 4, n_experts = 2, top_k = 3})
  assert_error("MoE: n_experts must be a positive integer", MoE, {d_model = 4, d_ff = 4})
  assert_error("MoE: d_ff must be a positive integer", MoE, {d_model = 4, n_experts = 2})
  assert_error("MoE: activation must be \"swiglu\" or \"gelu\"", MoE,
               {d_model = 4, d_ff = 4, n_experts = 2, activation = "relu"})
  assert_error("MoE: capacity_factor must be a positive number", MoE,
               {d_model = 4, d_ff = 4, n_experts = 2, capacity_factor = 0})
  assert_error("MoE: aux_loss_coef must be a number >= 0", MoE,
               {d_model = 4, d_ff = 4, n_experts = 2, aux_loss_coef = -1})
  assert_error("MoE: n_shared_experts must be a positive integer", MoE,
               {d_model = 4, d_ff = 4, n_experts = 2, n_shared_experts = 1.5})
  assert_error("MoE: unknown option 'experts'", MoE, {d_model = 4, d_ff = 4, n_experts = 2, experts = 4})
  local m = MoE{d_model = 4, d_ff = 4, n_experts = 2}
  assert_error("MoE: expected x (..., 4), got [3, 5]", m, lt.randn(3, 5))
end)

test("MoE on a non-contiguous x (a transposed view): the contiguous copy's output and gradient, bit for bit", function()
  local m = layer({d_model = 6, d_ff = 4, n_experts = 4, top_k = 2, n_shared_experts = 1})
  local base = lt.randn(6, 2, 5, {dtype = "f64"})
  local xt = base:permute(1, 2, 0) -- (2, 5, 6), strided
  assert(not xt:is_contiguous())
  local xc = xt:contiguous()
  local gout = lt.randn(2, 5, 6, {dtype = "f64"})
  local b1 = base:clone()
  b1.requires_grad = true
  local y1 = m(b1:permute(1, 2, 0))
  ;(y1 * gout):sum():backward()
  local xc2 = xc:clone()
  xc2.requires_grad = true
  local y2 = m(xc2)
  ;(y2 * gout):sum():backward()
  close(y1, y2, {rtol = 0, atol = 0})
  close(b1.grad:permute(1, 2, 0), xc2.grad, {rtol = 0, atol = 0})
end)

test("MoE under autocast bf16: experts in bf16 (as Linear), softmax and losses in f32, f32 parameter gradients",
  function()
    local m = layer({d_model = 8, d_ff = 6, n_experts = 4, top_k = 2, n_shared_experts = 1}, 0.3)
    m:to("f32")
    local x = lt.randn(10, 8)
    local y64 = m(x):to("f64")
    local y = F.autocast("bf16", function()
      local out = m(x)
      equal({out.dtype, m.z_loss.dtype, m.balance_loss.dtype}, {"bf16", "f32", "f32"})
      ;(out:to("f32"):sum() + m.aux_loss):backward()
      return out
    end)
    for _, p in ipairs(m:parameters()) do equal(p.grad.dtype, "f32") end
    close(y:to("f64"), y64:detach(), {rtol = 5e-2, atol = 5e-2})
  end)
