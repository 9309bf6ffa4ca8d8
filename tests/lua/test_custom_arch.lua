-- recipes/lib/moe.lua (the MoE layer of recipes/custom_arch.lua, a few lines of sparse dispatch):
-- routing, output and load-balancing loss against a naive reference in plain Lua doubles;
-- gradcheck in f64.
local lt = require "lutra"
local T = require "lutra.testing"
local close, equal = T.assert_close, T.assert_equal

local root = debug.getinfo(1, "S").source:match("^@(.*)/tests/lua/[^/]+$") or "."
local MoE = dofile(root .. "/recipes/lib/moe.lua")

local function gelu(v) return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ^ 3))) end

-- A layer with nonzero biases (they start at zero) and weights large enough that the
-- experts' outputs differ clearly.
local function layer(C, E, k, H)
  local m = MoE{d_model = C, n_experts = E, top_k = k, hidden = H, dtype = "f64", init_std = 0.5}
  lt.no_grad(function()
    lt.normal_(m.b_in, 0, 0.5)
    lt.normal_(m.b_out, 0, 0.5)
  end)
  return m
end

-- The reference: per token, softmax of the router logits, the top k by sorting, gates
-- renormalised over them, each chosen expert's MLP by loops; aux = E * sum f_e P_e.
local function naive(m, x)
  local X, Wr = x:tolist(), m.router.weight:tolist()
  local Wi, Bi, Wo, Bo = m.w_in:tolist(), m.b_in:tolist(), m.w_out:tolist(), m.b_out:tolist()
  local E, k, H, C, N = m.n_experts, m.top_k, m.hidden, #X[1], #X
  local out, count, psum, chosen_sets = {}, {}, {}, {}
  for e = 1, E do count[e], psum[e] = 0, 0 end
  for n = 1, N do
    local logits, mx = {}, -math.huge
    for e = 1, E do
      local s = 0
      for c = 1, C do s = s + X[n][c] * Wr[e][c] end
      logits[e], mx = s, math.max(mx, s)
    end
    local p, z = {}, 0
    for e = 1, E do p[e] = math.exp(logits[e] - mx); z = z + p[e] end
    local order = {}
    for e = 1, E do p[e] = p[e] / z; psum[e] = psum[e] + p[e]; order[e] = e end
    table.sort(order, function(a, b) return p[a] > p[b] end)
    local gsum = 0
    for i = 1, k do gsum = gsum + p[order[i]] end
    local y = {}
    for c = 1, C do y[c] = 0 end
    local set = {}
    for i = 1, k do
      local e = order[i]
      set[e], count[e] = true, count[e] + 1
      local h = {}
      for j = 1, H do
        local s = Bi[e][j]
        for c = 1, C do s = s + X[n][c] * Wi[e][j][c] end
        h[j] = gelu(s)
      end
      for c = 1, C do
        local s = Bo[e][c]
        for j = 1, H do s = s + h[j] * Wo[e][c][j] end
        y[c] = y[c] + p[e] / gsum * s
      end
    end
    out[n], chosen_sets[n] = y, set
  end
  local aux = 0
  for e = 1, E do aux = aux + (count[e] / (N * k)) * (psum[e] / N) end
  return out, aux * E, chosen_sets
end

for _, case in ipairs {{E = 4, k = 2}, {E = 4, k = 1}, {E = 5, k = 3}, {E = 3, k = 3}} do
  test(string.format("MoE E=%d top-%d: output, routing and aux loss match the naive reference", case.E, case.k),
    function()
      local C, H = 6, 5
      local m = layer(C, case.E, case.k, H)
      local x = lt.randn(2, 7, C):to("f64")
      local y = m(x)
      equal(y.shape, {2, 7, C})
      local want, want_aux, sets = naive(m, x:reshape(14, C))
      close(y:reshape(14, C), lt.tensor(want, "f64"), {rtol = 1e-10, atol = 1e-12})
      close(m.aux_loss:item(), want_aux, {rtol = 1e-12, atol = 1e-12})
      -- the slots per expert are the chosen sets' counts
      local counts = {}
      for e = 1, case.E do
        counts[e] = 0
        for n = 1, 14 do counts[e] = counts[e] + (sets[n][e] and 1 or 0) end
      end
      equal(m.counts, counts)
    end)
end

test("MoE aux loss: 1 for uniform routing, E / k when every token goes to the same k experts", function()
  local m = layer(4, 4, 2, 3)
  lt.no_grad(function() m.router.weight:zero_() end) -- equal logits: probs 1/E, ties to experts 1 and 2
  m(lt.randn(8, 4):to("f64"))
  equal(m.counts, {8, 8, 0, 0})
  close(m.aux_loss:item(), 1, {rtol = 1e-12, atol = 0}) -- E * (1/2 * 1/4 + 1/2 * 1/4)
  -- experts 1 and 2 get probability (1 - 2 eps) / 2 each (logits 30 against 0): aux -> E / k = 2
  lt.no_grad(function()
    m.router.weight:copy_(lt.tensor({{30, 0, 0, 0}, {30, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}}, "f64"))
  end)
  m(lt.zeros(8, 4):to("f64") + lt.tensor({1, 0, 0, 0}, "f64"))
  local p = math.exp(30) / (2 * math.exp(30) + 2)
  close(m.aux_loss:item(), 4 * (0.5 * p + 0.5 * p), {rtol = 1e-12, atol = 0})
end)

test("MoE: no aux loss in eval mode; the aux loss of a model is the mean over its layers", function()
  local a, b = layer(4, 4, 2, 3), layer(4, 4, 1, 3)
  local x = lt.randn(3, 4):to("f64")
  a(x)
  b(x)
  local holder = lt.nn.Module:extend("Holder")
  function holder:init() self.layers = {a, b} end
  local h = holder()
  close(MoE.aux_loss_of(h):item(), (a.aux_loss:item() + b.aux_loss:item()) / 2, {rtol = 1e-12, atol = 0})
  a:eval()
  a(x)
  assert(a.aux_loss == nil, "eval mode sets no aux loss")
end)

test("MoE gradcheck (f64): output and aux loss with respect to x and every parameter", function()
  local m = layer(4, 4, 2, 3)
  local x = lt.randn(5, 4):to("f64")
  x.requires_grad = true
  local inputs = {x}
  for _, p in ipairs(m:parameters()) do inputs[#inputs + 1] = p end
  T.gradcheck(function(xx) return {m(xx), m.aux_loss} end, inputs, {eps = 1e-6, atol = 1e-6, rtol = 1e-4})
  -- top-1 as well (its gate is 1: the router learns through the aux loss only)
  local m1 = layer(4, 3, 1, 3)
  local in1 = {x}
  for _, p in ipairs(m1:parameters()) do in1[#in1 + 1] = p end
  T.gradcheck(function(xx) return {m1(xx), m1.aux_loss} end, in1, {eps = 1e-6, atol = 1e-6, rtol = 1e-4})
end)
