-- peft adapters written by peft 0.21 itself (tests/hf/gen_peft.py: tiny gpt2, llama, qwen2 (q/k/v
-- biases, tied), qwen3 (q_norm/k_norm, head_dim apart) and mistral (sliding window) bases, one
-- adapter directory per LoraConfig option and some combined) load into lutra with the logits peft
-- computed in float64 (max relative difference <= 1e-5 in f32); merge_and_unload's weights match
-- lutra's merge; DoRA's gradients match peft's autograd in f64, and finite differences for the
-- magnitudes; lutra's save of each loads back into lutra exactly.
local lt = require "lutra"
local lora = require "lutra.lora"
local hf = require "lutra.hf"
local json = require "lutra.json"
local st = require "lutra.ckpt.safetensors"
local base_params = require "lutra.lora.base_params"
local hf_names = require "lutra.lora.hf_names"
local T = require "lutra.testing"
local equal = T.assert_equal

local FX = "tests/hf/fixtures/peft"
local ADAPTERS = json.read_file(FX .. "/adapters.json")
local IDS = json.read_file(FX .. "/ids.json")
local ids = lt.tensor(IDS.ids, {dtype = "i64"})
local targets = lt.tensor(IDS.targets, {dtype = "i64"})

local function names()
  local out = {}
  for k in pairs(ADAPTERS) do out[#out + 1] = k end
  table.sort(out)
  return out
end

local function base(arch, dtype)
  local model = hf.load_pretrained(FX .. "/" .. arch, {dtype = dtype, allow_cast = dtype == "f64"})
  model:eval()
  return model
end

local function ref(name) return st.load(FX .. "/" .. name .. ".ref.safetensors") end

-- max |a - b| / max |b|, in f64
local function rel(a, b)
  return lt.no_grad(function()
    local a64, b64 = a:to("f64"), b:to("f64")
    return (a64 - b64):abs():max():item() / b64:abs():max():item()
  end)
end

local function logits_of(model) return lt.no_grad(function() return model(ids) end) end

local function tmpdir()
  local d = os.tmpname()
  os.remove(d)
  os.execute("mkdir -p '" .. d .. "'")
  return d
end

test("every peft adapter (each option, some combined) gives peft's logits (max rel diff <= 1e-5)", function()
  local worst, lines = 0, {}
  for _, name in ipairs(names()) do
    local arch = ADAPTERS[name].base
    local model = base(arch)
    local plain = logits_of(model)
    lora.load(FX .. "/" .. name, model)
    local want = ref(name).logits
    local d = rel(logits_of(model), want)
    local moved = rel(plain, want)
    lines[#lines + 1] = string.format("%-22s %.2e (the adapter moves the logits by %.2f)", name, d, moved)
    assert(moved > 1e-2, name .. ": the adapter barely changes the logits: the comparison would prove nothing")
    assert(d <= 1e-5, string.format("%s: max relative logit difference %.3g against peft", name, d))
    worst = math.max(worst, d)
  end
  print("  load: " .. table.concat(lines, "\n        "))
  print(string.format("  load: worst %.2e over %d adapters", worst, #lines))
end)

-- lutra parameter (and its rows / transposition) of a Hugging Face weight name
local function lutra_param(model, hf_key)
  local e = base_params.param_map(model).by_hf[hf_key]
  assert(e, "no lutra parameter for " .. hf_key)
  local t = model:state_dict()[e.lt]
  if e.rows then t = t:narrow(0, e.rows[1], e.rows[2]) end
  if e.t then t = t:t() end
  return t
end

test("merge_and_unload: lutra's merged weights are peft's (f32 rounding), the logits unchanged", function()
  for _, name in ipairs(names()) do
    local r = ref(name)
    local keys = {}
    for k in pairs(r) do
      if type(k) == "string" and k:find("^merged%.") then keys[#keys + 1] = k end
    end
    if #keys > 0 then
      local model = base(ADAPTERS[name].base)
      lora.load(FX .. "/" .. name, model)
      lora.merge_and_unload(model)
      equal(#lora.layers(model), 0)
      for _, k in ipairs(keys) do
        local d = rel(lutra_param(model, k:sub(#"merged." + 1)), r[k])
        assert(d <= 2e-6, string.format("%s: %s differs from peft's merge by %.3g relative", name, k, d))
      end
      local d = rel(logits_of(model), r.logits)
      assert(d <= 1e-5, string.format("%s merged: logits %.3g from peft's", name, d))
    end
  end
end)

-- The lutra tensor that holds a peft adapter weight of a module (hf: "transformer.h.0.attn.c_attn"),
-- kind "lora_A", "lora_B" or "magnitude", as a view of the gradient (grad = true) or of the weight.
local function adapter_view(model, hf_mod, kind, use_grad)
  for _, l in ipairs(lora.layers(model)) do
    local m = l[2]
    local blocks = rawget(m, "blocks")
    for _, h in ipairs(hf_names.hf_names(model, l[1])) do
      if h[1] == hf_mod then
        local function of(t) return use_grad and t.grad or t end
        if kind == "magnitude" then
          local t = of(m.lora_magnitude)
          return h[2] and t:narrow(0, h[2], h[3]) or t
        end
        local col, r = 0, m.r
        if blocks then
          for i, b in ipairs(blocks) do
            if b[1] == h[2] then col, r = m:block(i) end
          end
        end
        if kind == "lora_A" then return of(m.lora_A.weight):narrow(0, col, r) end
        local b = of(m.lora_B.weight):narrow(1, col, r)
        return h[2] and b:narrow(0, h[2], h[3]) or b
      end
    end
  end
  error("no adapter for " .. hf_mod)
end

local function dora_model(name)
  local model = base(ADAPTERS[name].base, "f64")
  lora.load(FX .. "/" .. name, model, {allow_cast = true})
  model:train()
  return model
end

local function loss_of(model)
  local logits = model(ids)
  return (model:loss(logits, targets))
end

test("DoRA training: lutra's gradients are peft's (f64), the magnitudes' are finite differences", function()
  for _, name in ipairs {"gpt2_dora", "llama_dora", "qwen3_dora", "mistral_dora"} do
    local r = ref(name)
    local model = dora_model(name)
    local loss = loss_of(model)
    -- (transformers computes llama's RoPE angles in f32 even in an f64 model: a 1e-9 floor there)
    local tol = ADAPTERS[name].base == "gpt2" and 1e-10 or 1e-6
    assert(rel(loss, r.loss) < tol, string.format("%s: loss %.3g relative from peft's", name, rel(loss, r.loss)))
    loss:backward()
    local n, worst = 0, 0
    for k, g in pairs(r) do
      if type(k) == "string" and k:find("^grad%.") then
        local hf_mod, kind = k:match("^grad%.(.*)%.(lora_[AB])%.weight$")
        if not hf_mod then
          hf_mod = k:match("^grad%.(.*)%.lora_magnitude_vector%.weight$")
          kind = "magnitude"
        end
        local d = rel(adapter_view(model, hf_mod, kind, true), g)
        worst = math.max(worst, d)
        assert(d < tol, string.format("%s: %s: gradient %.3g relative from peft's", name, k, d))
        n = n + 1
      end
    end
    assert(n >= 6, name .. ": too few gradients compared")
    print(string.format("  %s: %d gradients, worst %.2e relative from peft's", name, n, worst))
    -- the norm ||W + s B A|| does not depend on m: the central difference is the gradient
    local hf_mod = ADAPTERS[name].base == "gpt2" and "transformer.h.0.attn.c_attn" or "model.layers.0.self_attn.v_proj"
    local g = adapter_view(model, hf_mod, "magnitude", true)
    local m = adapter_view(model, hf_mod, "magnitude", false)
    for _, i in ipairs {0, 3, 7} do
      local h = 1e-6
      local x0 = m:narrow(0, i, 1):item()
      local function at(v)
        lt.no_grad(function() m:narrow(0, i, 1):fill_(v) end)
        return lt.no_grad(function() return loss_of(model):item() end)
      end
      local fd = (at(x0 + h) - at(x0 - h)) / (2 * h)
      at(x0)
      local an = g:narrow(0, i, 1):item()
      assert(math.abs(fd - an) <= 1e-7 * math.max(1, math.abs(an)),
        string.format("%s: d loss / d m[%d]: finite difference %.10g, autograd %.10g", name, i, fd, an))
    end
  end
end)

test("modules_to_save: lora.disable runs the base's own modules (peft's originals)", function()
  for _, name in ipairs {"llama_mts", "gpt2_mts_lm_head", "gpt2_mts_wte", "qwen2_mts_lm_head"} do
    local model = base(ADAPTERS[name].base)
    local plain = logits_of(model)
    lora.load(FX .. "/" .. name, model)
    local off = lora.disable(model, logits_of, model)
    equal(rel(off, plain), 0)
  end
end)

test("lutra's save of each adapter loads back into lutra with the same logits, bitwise", function()
  for _, name in ipairs(names()) do
    local arch = ADAPTERS[name].base
    local model = base(arch)
    lora.load(FX .. "/" .. name, model)
    local want = logits_of(model)
    local dir = tmpdir()
    lora.save(dir, model)
    local again = base(arch)
    lora.load(dir, again)
    equal(rel(logits_of(again), want), 0, name)
    os.execute("rm -rf '" .. dir .. "'")
  end
end)

test("training: bias = lora_only on q of a fused qkv trains only those rows; a saved lm_head leaves wte", function()
  local model = base("llama")
  lora.load(FX .. "/llama_bias_lora_only", model) -- k_proj and gate_proj adapted: k's rows of qkv.bias
  model:train()
  local qkv = model.blocks[1].attn.qkv
  local before = qkv.bias:clone()
  local opt = lt.optim.AdamW(lora.param_groups(model, {weight_decay = 0}), {lr = 0.05})
  local _, loss = model(ids, targets)
  loss:backward()
  opt:step()
  local q, k = 32, 16 -- 4 heads of 8 rows; 2 kv heads
  equal(rel(qkv.bias:narrow(0, 0, q), before:narrow(0, 0, q)), 0)
  equal(rel(qkv.bias:narrow(0, q + k, k), before:narrow(0, q + k, k)), 0)
  assert(rel(qkv.bias:narrow(0, q, k), before:narrow(0, q, k)) > 1e-3, "k's biases did not train")

  local g = base("gpt2")
  local wte = g.wte.weight:clone()
  lora.load(FX .. "/gpt2_mts_lm_head", g)
  assert(not rawequal(g.lm_head.weight, g.wte.weight), "lm_head is still tied to wte")
  equal(g.cfg.tie_embeddings, false)
  g:train()
  local head = g.lm_head.weight:clone()
  local gopt = lt.optim.AdamW(lora.param_groups(g, {weight_decay = 0}), {lr = 0.05})
  local _, gl = g(ids, targets)
  gl:backward()
  gopt:step()
  equal(rel(g.wte.weight, wte), 0)
  assert(rel(g.lm_head.weight, head) > 1e-3, "the saved lm_head did not train")
end)

test("lora.apply with dora: the start is the base; merge equals the forward; unmerge restores the weights", function()
  local model = base("gpt2")
  local plain = logits_of(model)
  local w0 = model.blocks[1].attn.qkv.weight:clone()
  lora.apply(model, {targets = {"c_attn", "c_fc"}, r = 4, alpha = 8, dora = true})
  assert(rel(logits_of(model), plain) < 1e-6, "DoRA does not start at the base model")
  lt.manual_seed(3)
  lt.no_grad(function()
    for _, l in ipairs(lora.layers(model)) do
      l[2].lora_B.weight:normal_(0, 0.3)
      l[2].lora_magnitude:mul_(lt.randn(l[2].lora_magnitude.shape) * 0.3 + 1)
    end
  end)
  local adapted = logits_of(model)
  assert(rel(adapted, plain) > 1e-2, "the adapters do nothing")
  lora.merge(model)
  assert(rel(logits_of(model), adapted) < 1e-5, "the merged model differs")
  lora.unmerge(model)
  assert(rel(model.blocks[1].attn.qkv.weight, w0) < 1e-6, "unmerge did not restore the base weight")
  assert(rel(logits_of(model), adapted) < 1e-6, "unmerged forward differs")
  local n = 0
  for _, l in ipairs(lora.layers(model)) do n = n + l[2].out_features + 4 * (l[2].in_features + l[2].out_features) end
  local trainable, _, analytic = lora.count(model)
  equal(trainable, n)
  equal(analytic, n)
end)

test("lutra's adapter_config.json: per-module r and alpha as rank_pattern / alpha_pattern, layers_to_transform", function()
  local model = base("llama")
  lora.apply(model, {targets = "all-linear", split_fused = true, r = 4, alpha = 8, rank_pattern = {q_proj = 2},
                     alpha_pattern = {["model\\.layers\\.1\\.mlp\\.down_proj"] = 3, o_proj = 32}, layers = {1}})
  local dir = tmpdir()
  lora.save(dir, model)
  local conf = json.read_file(dir .. "/adapter_config.json")
  equal(conf.r, 4)
  equal(conf.lora_alpha, 8)
  equal(conf.rank_pattern, {["model\\.layers\\.1\\.self_attn\\.q_proj"] = 2})
  equal(conf.alpha_pattern, {["model\\.layers\\.1\\.self_attn\\.o_proj"] = 32, ["model\\.layers\\.1\\.mlp\\.down_proj"] = 3})
  equal(conf.layers_to_transform, {1})
  equal(conf.layers_pattern, "layers")
  os.execute("rm -rf '" .. dir .. "'")
end)

test("DoRA with dropout in training: x W^T + b + (g - 1) (xd W^T) + g s B A xd, xd the dropped input", function()
  local lin = require("lutra.nn.linear")(12, 10, {dtype = "f64"})
  local m = lora.LoRALinear(lin, {r = 3, alpha = 6, dropout = 0.3, rslora = false})
  lt.manual_seed(5)
  lt.no_grad(function()
    m.bias:normal_(0, 0.5)
    m.lora_B.weight:normal_(0, 0.5)
  end)
  m:enable_dora()
  lt.no_grad(function() m.lora_magnitude:mul_(lt.randn({10}, {dtype = "f64"}) * 0.3 + 1) end)
  m:train()
  local x = lt.randn({4, 12}, {dtype = "f64"})
  lt.manual_seed(9)
  local got = lt.no_grad(function() return m(x) end)
  lt.manual_seed(9)
  local want = lt.no_grad(function()
    local xd = m.lora_dropout(x) -- the same mask: the same draw from the same seed
    local W, A, B = m.weight, m.lora_A.weight, m.lora_B.weight
    local s = m.scaling
    local norm = (W + B:matmul(A) * s):norm(1)
    local g = m.lora_magnitude / norm
    local base = x:matmul(W:t()) + m.bias
    local xdw = xd:matmul(W:t())
    return base + xdw * (g - 1) + xd:matmul(A:t()):matmul(B:t()) * s * g
  end)
  assert(rel(got, want) < 1e-14, string.format("%.3g", rel(got, want)))
  local plain = lt.no_grad(function() m:eval(); return m(x) end)
  assert(rel(got, plain) > 1e-3, "dropout had no effect: the test would prove nothing")
end)

test("qwen2: bias = all trains the q/k/v biases (o_proj has none); a saved lm_head unties from embed_tokens", function()
  local model = base("qwen2")
  equal(model.cfg.tie_embeddings, true)
  lora.load(FX .. "/qwen2_bias_all", model)
  local attn = model.blocks[1].attn
  equal(attn.proj.bias, nil)
  model:train()
  local before = attn.qkv.bias:clone()
  local opt = lt.optim.AdamW(lora.param_groups(model, {weight_decay = 0}), {lr = 0.05})
  local _, loss = model(ids, targets)
  loss:backward()
  opt:step()
  for _, rows in ipairs {{0, 32}, {32, 16}, {48, 16}} do -- q (4 heads of 8), k, v (2 heads each)
    assert(rel(attn.qkv.bias:narrow(0, rows[1], rows[2]), before:narrow(0, rows[1], rows[2])) > 1e-3,
      "the q/k/v biases did not train")
  end

  local q = base("qwen2")
  local wte = q.wte.weight:clone()
  lora.load(FX .. "/qwen2_mts_lm_head", q)
  assert(not rawequal(q.lm_head.weight, q.wte.weight), "lm_head is still tied to embed_tokens")
  q:train()
  local head = q.lm_head.weight:clone()
  local qopt = lt.optim.AdamW(lora.param_groups(q, {weight_decay = 0}), {lr = 0.05})
  local _, ql = q(ids, targets)
  ql:backward()
  qopt:step()
  equal(rel(q.wte.weight, wte), 0)
  assert(rel(q.lm_head.weight, head) > 1e-3, "the saved lm_head did not train")
end)
