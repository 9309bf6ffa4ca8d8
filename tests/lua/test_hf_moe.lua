-- lutra.hf's mixtures of experts (mixtral, qwen2_moe, qwen3_moe) beyond test_hf_models.lua's
-- logits against transformers: the routing written out in plain Lua (softmax over every expert,
-- top-k, renormalised or not, the shared expert's sigmoid gate) against nn.MoE in f64; a training
-- step of each fixture (finite loss, gradients on the router, every expert tensor and the shared
-- expert); config.json's MoE keys read and written again; what no family describes refused by
-- name. (transformers loading lutra's saves: gen_models.py --check-lutra --only mixtral ...)
local lt = require "lutra"
local hf = require "lutra.hf"
local json = require "lutra.json"
local models = require "lutra.models"
local MoE = require "lutra.nn.moe"
local T = require "lutra.testing"
local equal, assert_error = T.assert_equal, T.assert_error

local fx = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "hf_model_fixtures.lua")
local fixtures = fx.dir

local function fill(m)
  lt.no_grad(function()
    for _, p in ipairs(m:parameters()) do p:copy_(lt.randn(p.shape, {dtype = "f64"}) * 0.5) end
  end)
end

-- y of one token row x (list of C numbers) by the rule alone: experts by index, Lua numbers for the routing
local function reference(moe, x)
  local C, E, k = moe.d_model, moe.n_experts, moe.top_k
  local xt = lt.tensor({x}, "f64") -- (1, C)
  local logits = (xt:matmul(moe.router.weight:t())):reshape(E):tolist()
  local mx, z, probs = -math.huge, 0, {}
  for e = 1, E do mx = math.max(mx, logits[e]) end
  for e = 1, E do probs[e] = math.exp(logits[e] - mx); z = z + probs[e] end
  local order = {}
  for e = 1, E do probs[e] = probs[e] / z; order[e] = e end
  table.sort(order, function(a, b) return probs[a] > probs[b] end)
  local sum = 0
  for i = 1, k do sum = sum + probs[order[i]] end
  local y = lt.zeros({1, C}, {dtype = "f64"})
  for i = 1, k do
    local e = order[i]
    local w = moe.norm_topk_prob and probs[e] / sum or probs[e]
    local g = xt:matmul(moe.w_gate:select(0, e - 1):t())
    local u = xt:matmul(moe.w_up:select(0, e - 1):t())
    y = y + (g:silu() * u):matmul(moe.w_down:select(0, e - 1):t()) * w
  end
  if moe.shared then
    local sh = moe.shared
    local s = (sh.gate(xt):silu() * sh.up(xt)):matmul(sh.proj.weight:t())
    if moe.shared_gate then
      local gl = xt:matmul(moe.shared_gate.weight:t()):item()
      s = s * (1 / (1 + math.exp(-gl)))
    end
    y = y + s
  end
  return y:reshape(C):tolist()
end

test("routing: softmax over all experts, top-k, norm_topk_prob on and off, the shared expert's sigmoid gate", function()
  for _, o in ipairs {{norm = true}, {norm = false}, {norm = false, shared = true}, {norm = true, shared = true}} do
    lt.manual_seed(11)
    local moe = MoE {d_model = 6, d_ff = 5, n_experts = 5, top_k = 2, norm_topk_prob = o.norm,
                     n_shared_experts = o.shared and 1 or 0, shared_hidden = o.shared and 7 or nil,
                     shared_gate = o.shared or nil, dtype = "f64"}
    fill(moe)
    if o.shared then equal(moe.shared.gate.weight.shape, {7, 6}) end
    local x = lt.randn({9, 6}, {dtype = "f64"})
    local y = lt.no_grad(function() return moe(x) end):tolist()
    for n, row in ipairs(x:tolist()) do
      local want = reference(moe, row)
      for c = 1, 6 do
        assert(math.abs(y[n][c] - want[c]) <= 1e-12 * (1 + math.abs(want[c])),
          string.format("norm %s shared %s token %d: %.17g vs %.17g", tostring(o.norm), tostring(o.shared), n,
            y[n][c], want[c]))
      end
    end
  end
  -- the defaults are unchanged: no shared gate, shared width n_shared_experts * d_ff
  local m = MoE {d_model = 4, d_ff = 3, n_experts = 2, top_k = 1, n_shared_experts = 2}
  equal(m.shared_gate, nil)
  equal(m.shared.gate.weight.shape, {6, 4})
  assert_error("need n_shared_experts", MoE, {d_model = 4, d_ff = 3, n_experts = 2, shared_gate = true})
end)

local FIXTURES = {mixtral = "mixtral", qwen2_moe = "qwen2_moe", qwen3_moe = "qwen3_moe"}

for name, family in pairs(FIXTURES) do
  test(name .. ": a training step: finite loss, gradients on the router, every expert and the shared expert", function()
    local model, _, cfg = hf.load_pretrained(fixtures .. "/" .. name, {allow_cast = true})
    equal(hf.family_of(cfg), family)
    model:train()
    local ids = fx.expected(name).ids
    local T1 = ids:size(1) - 1
    local _, loss = model(ids:narrow(1, 0, T1), ids:narrow(1, 1, T1))
    local l = loss:item()
    assert(l == l and math.abs(l) < math.huge, "finite loss: " .. l)
    loss:backward()
    for i, block in ipairs(model.blocks) do
      local mlp = block.mlp
      local ps = {router = mlp.router.weight, w_gate = mlp.w_gate, w_up = mlp.w_up, w_down = mlp.w_down}
      if family == "qwen2_moe" then
        ps.shared_up, ps.shared_gate = mlp.shared.up.weight, mlp.shared_gate.weight
      end
      for what, p in pairs(ps) do
        local g = p.grad and p.grad:abs():sum():item()
        assert(g and g > 0 and g < math.huge, string.format("layer %d %s: a finite nonzero gradient, got %s", i, what,
          tostring(g)))
      end
      -- each expert a token chose has a gradient; an expert nobody chose has none
      local chosen = mlp.tokens_per_expert
      for e = 1, cfg.n_experts do
        local g = mlp.w_up.grad:select(0, e - 1):abs():sum():item()
        equal(g > 0, chosen[e] > 0, string.format("layer %d expert %d (%d slots)", i, e, chosen[e]))
      end
    end
  end)
end

test("config.json's MoE keys: read, written, read again the same; the fixtures' values", function()
  local m = hf.config_from_hf(json.read_file(fixtures .. "/mixtral/config.json"))
  equal({m.arch, m.n_experts, m.top_k, m.ffn_hidden, m.norm_topk_prob, m.sliding_window, m.aux_loss_coef},
    {"moe", 4, 2, 16, true, 8, 0})
  local q2 = hf.config_from_hf(json.read_file(fixtures .. "/qwen2_moe/config.json"))
  equal({q2.n_experts, q2.ffn_hidden, q2.norm_topk_prob, q2.n_shared_experts, q2.shared_expert_hidden,
         q2.shared_expert_gate, q2.qkv_bias}, {4, 16, false, 1, 40, true, true})
  local q3 = hf.config_from_hf(json.read_file(fixtures .. "/qwen3_moe/config.json"))
  equal({q3.n_experts, q3.norm_topk_prob, q3.qk_norm, q3.head_dim}, {4, true, true, 16})
  for _, cfg in ipairs {m, q2, q3} do
    local hc = hf.config_to_hf(cfg)
    local back = hf.config_from_hf(json.decode(json.encode(hc)))
    equal(json.encode(back), json.encode(cfg))
  end
  -- output_router_logits turns the balance loss on: router_aux_loss_coef * top_k / n_layer per layer
  local hc = json.read_file(fixtures .. "/mixtral/config.json")
  hc.output_router_logits, hc.router_aux_loss_coef = true, 0.02
  equal(hf.config_from_hf(hc).aux_loss_coef, 0.02 * 2 / 2)
  -- qwen3_moe's expert count under either name (transformers 5 writes num_local_experts)
  local q = json.read_file(fixtures .. "/qwen3_moe/config.json")
  q.num_experts, q.num_local_experts = q.num_local_experts, nil
  equal(hf.config_from_hf(q).n_experts, 4)
end)

test("what lutra does not compute is refused, naming config.json's field", function()
  local function bad(name, field, value, fragment)
    local hc = json.read_file(fixtures .. "/" .. name .. "/config.json")
    hc[field] = value
    local err = assert_error(fragment, hf.config_from_hf, hc, {path = name .. "/config.json"})
    assert(err:find(name .. "/config.json", 1, true) and err:find(field, 1, true), err)
  end
  bad("qwen2_moe", "decoder_sparse_step", 2, "decoder_sparse_step = 2: lutra needs 1")
  bad("qwen3_moe", "mlp_only_layers", json.array {0}, "mlp_only_layers")
  bad("mixtral", "router_jitter_noise", 0.1, "router_jitter_noise = 0.1: lutra needs 0")
  bad("mixtral", "num_experts_per_tok", 5, "at most the 4 experts")
  bad("qwen2_moe", "norm_topk_prob", "yes", "true or false")
  bad("qwen3_moe", "num_experts", 3, "num_experts's value")
  bad("qwen2_moe", "moe_intermediate_size", 0, "a positive integer")
  -- and lutra MoE models that no family describes are refused when saved
  local base = {arch = "moe", n_layer = 1, n_head = 2, d_model = 8, ffn_hidden = 4, vocab_size = 16, block_size = 8,
                n_experts = 2, top_k = 1}
  local function refused(extra, fragment)
    local c = {}
    for k, v in pairs(base) do c[k] = v end
    for k, v in pairs(extra) do c[k] = v end
    assert_error(fragment, hf.family_of, models.config(c))
  end
  refused({capacity_factor = 1.25}, "capacity_factor")
  refused({n_shared_experts = 1}, "without shared_expert_gate")
  refused({norm_topk_prob = false}, "norm_topk_prob = false")
  refused({mlp = "gelu"}, "SwiGLU experts")
  refused({qk_norm = true, n_shared_experts = 1, shared_expert_gate = true}, "qwen3_moe (qk_norm) has no shared expert")
  equal(hf.family_of(models.config(base)), "mixtral")
end)
