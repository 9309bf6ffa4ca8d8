-- lutra.lora: wrapping by name, freezing, the trainable count against r (in + out), merge /
-- unmerge against the unmerged forward, disable, training the adapters alone, and PEFT's
-- adapter layout on disk (save -> load round trip, names, config).
local lt = require "lutra"
local lora = require "lutra.lora"
local models = require "lutra.models"
local optim = require "lutra.optim"
local T = require "lutra.testing"
local close, equal, assert_error = T.assert_close, T.assert_equal, T.assert_error

local function gpt2(extra)
  local cfg = {arch = "gpt2", n_layer = 2, n_head = 2, d_model = 16, vocab_size = 37, block_size = 12}
  for k, v in pairs(extra or {}) do cfg[k] = v end
  return models.build(cfg)
end

local function llama(extra)
  local cfg = {arch = "llama", n_layer = 2, n_head = 4, n_kv_head = 2, d_model = 16, vocab_size = 29,
               block_size = 12, ffn_hidden = 24}
  for k, v in pairs(extra or {}) do cfg[k] = v end
  return models.build(cfg)
end

local function ids(B, Tn, V) return lt.randint(0, V, {B, Tn}, {dtype = "i64"}) end

-- the adapters' B start at zero: give them values so that the adapter path matters
local function randomize_B(model)
  lt.no_grad(function()
    for _, l in ipairs(lora.layers(model)) do l[2].lora_B.weight:normal_(0, 0.2) end
  end)
end

local function snapshot(model)
  local s = {}
  for name, p in model:named_parameters() do s[name] = p:clone() end
  return s
end

test("all-linear wraps every Linear but lm_head; trainable count = sum r (in + out)", function()
  for _, case in ipairs {{gpt2, 4}, {llama, 5}} do
    local model = case[1]()
    local total_before = model:num_parameters()
    local _, names = lora.apply(model, {r = 4, alpha = 8})
    equal(#names, case[2] * 2) -- per block: gpt2 qkv, proj, fc, proj; llama + gate, up
    for _, n in ipairs(names) do assert(not n:find("lm_head"), n) end
    local analytic = 0
    for _, l in ipairs(lora.layers(model)) do
      local w = l[2].weight
      analytic = analytic + 4 * (w:size(0) + w:size(1))
    end
    local trainable, total, counted = lora.count(model)
    equal(trainable, analytic)
    equal(counted, analytic)
    equal(model:num_parameters{trainable = true}, analytic)
    equal(total, total_before + analytic)
    local tr = lora.trainable(model)
    equal(#tr, 2 * #names)
    for _, e in ipairs(tr) do assert(e[1]:find("%.lora_[AB]%.weight$"), e[1]) end
    assert(lora.summary(model):find("trainable params: " .. tostring(analytic):reverse():gsub("(%d%d%d)", "%1,")
      :reverse():gsub("^,", ""), 1, true), lora.summary(model))
  end
  -- gpt2 d16 4x MLP, 2 layers, r 4: qkv 4(16+48), proj 4(16+16), fc 4(16+64), proj 4(64+16) = 1024 per layer
  local m = gpt2()
  lora.apply(m, {r = 4, alpha = 8})
  equal((lora.count(m)), 2 * 1024)
end)

test("targets by pattern; a pattern that matches nothing is an error naming the Linears", function()
  local model = llama()
  local _, names = lora.apply(model, {targets = {"attn%.qkv$", "mlp%.proj$"}, r = 2})
  equal(names, {"blocks.0.attn.qkv", "blocks.0.mlp.proj", "blocks.1.attn.qkv", "blocks.1.mlp.proj"})
  assert_error("matches no Linear module", function() lora.apply(llama(), {targets = {"nope"}}) end)
  assert_error("already has an adapter", function() lora.apply(model, {targets = {"qkv"}}) end)
  assert_error("r must be a positive integer", function() lora.apply(llama(), {r = 0}) end)
  assert_error("unknown option 'rank'", function() lora.apply(llama(), {rank = 4}) end)
  assert_error("bad target pattern", function() lora.apply(llama(), {targets = {"[a"}}) end)
  -- the wrapped model starts equal to the base (B = 0); the state_dict keeps the base names
  local base = gpt2()
  local x = ids(2, 7, 37)
  local y0 = lt.no_grad(function() return base(x) end)
  lora.apply(base, {r = 3})
  close(lt.no_grad(function() return base(x) end), y0)
  local sd = base:state_dict()
  assert(sd["blocks.0.attn.qkv.weight"] ~= nil and sd["blocks.0.attn.qkv.lora_A.weight"] ~= nil)
end)

test("scaling alpha / r, or alpha / sqrt(r) with rsLoRA; A kaiming-uniform in 1/sqrt(in)", function()
  local m = gpt2()
  lora.apply(m, {r = 4, alpha = 16})
  local l = lora.layers(m)[1][2]
  equal(l.scaling, 4)
  local a = l.lora_A.weight
  assert(a:abs():max():item() <= 1 / math.sqrt(16) and a:abs():max():item() > 0.5 / math.sqrt(16))
  equal(l.lora_B.weight:abs():max():item(), 0)
  local m2 = gpt2()
  lora.apply(m2, {r = 4, alpha = 16, rslora = true})
  equal(lora.layers(m2)[1][2].scaling, 8)
  -- the forward is base + s B A x, by hand on one layer
  randomize_B(m)
  local x = lt.randn(3, 16)
  local want = x:matmul(l.weight:t()) + l.bias + x:matmul(l.lora_A.weight:t()):matmul(l.lora_B.weight:t()) * 4
  close(lt.no_grad(function() return l(x) end), want, {rtol = 1e-5, atol = 1e-5})
end)

test("merge then unmerge: outputs equal the unmerged adapter model (fp32), weights restored", function()
  for _, mk in ipairs {gpt2, llama} do
    local model = mk()
    lora.apply(model, {r = 4, alpha = 8, rslora = mk == llama})
    randomize_B(model)
    local V = model.cfg.vocab_size
    local x = ids(2, 9, V)
    local before = snapshot(model)
    local y = lt.no_grad(function() return model(x) end)
    lora.merge(model)
    local ym = lt.no_grad(function() return model(x) end)
    close(ym, y, {rtol = 1e-4, atol = 1e-5})
    -- merged weights are not the base's: the update is real
    local l = lora.layers(model)[1]
    assert((model:state_dict()[l[1] .. ".weight"] - before[l[1] .. ".weight"]):abs():max():item() > 1e-3)
    assert_error("is merged", function() lora.disable(model, function() end) end)
    lora.unmerge(model)
    for name, p in model:named_parameters() do close(p, before[name], {rtol = 1e-5, atol = 1e-6}) end
    close(lt.no_grad(function() return model(x) end), y, {rtol = 1e-4, atol = 1e-5})
  end
end)

test("disable runs the base model (no second copy), restores the adapters, errors too", function()
  local model = llama()
  local x = ids(2, 6, 29)
  local y_base = lt.no_grad(function() return model(x) end)
  lora.apply(model, {r = 2})
  randomize_B(model)
  local y_lora = lt.no_grad(function() return model(x) end)
  assert((y_lora - y_base):abs():max():item() > 1e-4)
  local y_off = lora.disable(model, function() return lt.no_grad(function() return model(x) end) end)
  close(y_off, y_base)
  close(lt.no_grad(function() return model(x) end), y_lora)
  assert_error("boom", function() lora.disable(model, function() error("boom") end) end)
  close(lt.no_grad(function() return model(x) end), y_lora)
  assert_error("no LoRA layers", function() lora.disable(llama(), function() end) end)
end)

test("training: the optimizer sees only the adapters; the base weights do not move", function()
  local model = gpt2()
  lora.apply(model, {r = 4, alpha = 8, dropout = 0.1})
  local base = snapshot(model)
  local opt = optim.AdamW(lora.param_groups(model), {lr = 1e-2})
  local tr = lora.trainable(model)
  equal(#opt.params, #tr)
  local trainable = {}
  for _, e in ipairs(tr) do trainable[e[2]] = true end
  for _, p in ipairs(opt.params) do assert(trainable[p]) end
  -- also an optimizer built from the whole model: the frozen ones get no gradient, no state
  local opt2 = optim.AdamW(model, {lr = 1e-2})
  local x, y = ids(4, 10, 37), ids(4, 10, 37)
  local first, last
  for _ = 1, 8 do
    opt:zero_grad()
    local _, loss = model(x, y)
    loss:backward()
    opt:step()
    last = loss:item()
    first = first or last
  end
  assert(last < first, string.format("loss %g -> %g", first, last))
  for name, p in model:named_parameters() do
    if name:find("lora_") then
      if name:find("lora_B") then assert((p - base[name]):abs():max():item() > 0, name) end
    else
      equal(p.grad, nil, name)
      equal((p - base[name]):abs():max():item(), 0, name) -- bitwise
    end
  end
  local _, loss = model(x, y)
  loss:backward()
  opt2:step()
  local n = 0
  for key in pairs(opt2.state) do
    assert(key:find("lora_"), key)
    n = n + 1
  end
  equal(n, #tr)
end)

test("merge_and_unload leaves plain Linears with the merged weights", function()
  local model = gpt2()
  lora.apply(model, {r = 2})
  randomize_B(model)
  local x = ids(1, 5, 37)
  local y = lt.no_grad(function() return model(x) end)
  lora.merge_and_unload(model)
  equal(#lora.layers(model), 0)
  assert(getmetatable(model.blocks[1].attn.qkv) == lt.nn.Linear)
  close(lt.no_grad(function() return model(x) end), y, {rtol = 1e-4, atol = 1e-5})
end)
