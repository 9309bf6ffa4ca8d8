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

local function tmpdir()
  local d = os.tmpname()
  os.remove(d)
  os.execute("mkdir -p '" .. d .. "'")
  return d
end

test("save/load in PEFT's layout (gpt2): names, shapes, config; a fresh base + load = the trained model", function()
  local st = require "lutra.ckpt.safetensors"
  local json = require "lutra.json"
  lt.manual_seed(7)
  local model = gpt2()
  lora.apply(model, {r = 4, alpha = 8, dropout = 0.05})
  randomize_B(model)
  local x = ids(2, 8, 37)
  local y = lt.no_grad(function() return model:eval()(x) end)
  local dir = tmpdir()
  lora.save(dir, model)
  local h = st.read_header(dir .. "/adapter_model.safetensors")
  equal(#h.names, 2 * 4 * 2)
  local a = h.tensors["base_model.model.transformer.h.0.attn.c_attn.lora_A.weight"]
  local b = h.tensors["base_model.model.transformer.h.0.attn.c_attn.lora_B.weight"]
  equal(a.shape, {4, 16})
  equal(b.shape, {48, 4})
  equal(h.tensors["base_model.model.transformer.h.1.mlp.c_proj.lora_B.weight"].shape, {16, 4})
  equal(h.tensors["base_model.model.transformer.h.1.mlp.c_fc.lora_A.weight"].shape, {4, 16})
  local conf = json.read_file(dir .. "/adapter_config.json")
  equal(conf.peft_type, "LORA")
  equal(conf.task_type, "CAUSAL_LM")
  equal(conf.r, 4)
  equal(conf.lora_alpha, 8)
  equal(conf.lora_dropout, 0.05)
  equal(conf.use_rslora, false)
  equal(conf.bias, "none")
  equal(conf.fan_in_fan_out, true)
  equal({unpack(conf.target_modules)}, {"c_attn", "c_fc", "c_proj"})
  -- a fresh base model (same seed), not wrapped: load wraps what the file has adapters for
  lt.manual_seed(7)
  local fresh = gpt2()
  lora.load(dir, fresh)
  equal(#lora.layers(fresh), 8)
  close(lt.no_grad(function() return fresh:eval()(x) end), y)
  -- into an already wrapped model (other values): overwritten
  lt.manual_seed(7)
  local again = gpt2()
  lora.apply(again, {r = 4, alpha = 8})
  lora.load(dir, again)
  close(lt.no_grad(function() return again:eval()(x) end), y)
  -- a model wrapped with another rank: the shapes are named
  local other = gpt2()
  lora.apply(other, {r = 2})
  assert_error("shapes in the file", function() lora.load(dir, other) end)
  os.execute("rm -rf '" .. dir .. "'")
end)

test("llama's fused qkv: exported as q_proj, k_proj, v_proj (same A, B rows), loaded back exactly", function()
  local st = require "lutra.ckpt.safetensors"
  local json = require "lutra.json"
  lt.manual_seed(3)
  local model = llama() -- d 16, 4 heads of 4, 2 kv heads: q 16 rows, k 8, v 8
  lora.apply(model, {r = 2, alpha = 4, rslora = true})
  randomize_B(model)
  local x = ids(2, 6, 29)
  local y = lt.no_grad(function() return model(x) end)
  local dir = tmpdir()
  lora.save(dir, model)
  local t = st.load(dir .. "/adapter_model.safetensors")
  local pre = "base_model.model.model.layers.1.self_attn."
  local l = model.blocks[2].attn.qkv
  close(t[pre .. "q_proj.lora_A.weight"], l.lora_A.weight)
  close(t[pre .. "v_proj.lora_A.weight"], l.lora_A.weight)
  close(t[pre .. "q_proj.lora_B.weight"], l.lora_B.weight:narrow(0, 0, 16))
  close(t[pre .. "k_proj.lora_B.weight"], l.lora_B.weight:narrow(0, 16, 8))
  close(t[pre .. "v_proj.lora_B.weight"], l.lora_B.weight:narrow(0, 24, 8))
  assert(t["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"] ~= nil)
  assert(t["base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight"] ~= nil)
  local conf = json.read_file(dir .. "/adapter_config.json")
  equal({unpack(conf.target_modules)}, {"down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"})
  equal(conf.use_rslora, true)
  equal(conf.fan_in_fan_out, false)
  lt.manual_seed(3)
  local fresh = llama()
  lora.load(dir, fresh)
  equal(lora.layers(fresh)[1][2].scaling, 4 / math.sqrt(2))
  close(lt.no_grad(function() return fresh(x) end), y)
  -- independent q/k/v adapters (different A, as PEFT trains them): row blocks of the fused layer
  local ak = t[pre .. "k_proj.lora_A.weight"] + 1
  t[pre .. "k_proj.lora_A.weight"] = ak
  st.save(dir .. "/adapter_model.safetensors", t, {format = "pt"})
  lt.manual_seed(3)
  local blocked = llama()
  lora.load(dir, blocked)
  local m = blocked.blocks[2].attn.qkv
  equal(m.blocks, {{0, 16}, {16, 8}, {24, 8}})
  local d = m:delta()
  local s = 4 / math.sqrt(2)
  close(d:narrow(0, 0, 16), t[pre .. "q_proj.lora_B.weight"]:matmul(t[pre .. "q_proj.lora_A.weight"]) * s,
    {atol = 1e-6, rtol = 1e-5})
  close(d:narrow(0, 16, 8), t[pre .. "k_proj.lora_B.weight"]:matmul(ak) * s, {atol = 1e-6, rtol = 1e-5})
  close(d:narrow(0, 24, 8), t[pre .. "v_proj.lora_B.weight"]:matmul(t[pre .. "v_proj.lora_A.weight"]) * s,
    {atol = 1e-6, rtol = 1e-5})
  -- written back block by block: the same tensors
  local dir2 = tmpdir()
  lora.save(dir2, blocked)
  local t2 = st.load(dir2 .. "/adapter_model.safetensors")
  for k, v in pairs(t) do close(t2[k], v) end
  os.execute("rm -rf '" .. dir .. "' '" .. dir2 .. "'")
end)

test("PEFT module names: lutra.hf.weights' map and lora.hf_names' own table agree (gpt2, llama)", function()
  local hf_names = require "lutra.lora.hf_names"
  local have = pcall(require, "lutra.hf.weights")
  for _, mk in ipairs {gpt2, llama} do
    local model = mk()
    local names = {}
    for name, m in model:named_modules() do
      if getmetatable(m) == lt.nn.Linear then names[#names + 1] = name end
    end
    local with = {}
    for _, n in ipairs(names) do with[n] = hf_names.hf_names(model, n) end
    -- again with lutra.hf.weights unavailable: the built-in table
    local saved_loaded, saved_preload = package.loaded["lutra.hf.weights"], package.preload["lutra.hf.weights"]
    package.loaded["lutra.hf.weights"] = nil
    package.preload["lutra.hf.weights"] = function() error("hidden for the test") end
    rawset(model, "_peft_names", nil)
    local ok, err = pcall(function()
      for _, n in ipairs(names) do equal(hf_names.hf_names(model, n), with[n], n) end
    end)
    package.loaded["lutra.hf.weights"], package.preload["lutra.hf.weights"] = saved_loaded, saved_preload
    assert(ok, err)
    if mk == llama then
      equal(with["blocks.0.attn.qkv"], {{"model.layers.0.self_attn.q_proj", 0, 16},
                                        {"model.layers.0.self_attn.k_proj", 16, 8},
                                        {"model.layers.0.self_attn.v_proj", 24, 8}})
    else
      equal(with["blocks.1.mlp.fc"], {{"transformer.h.1.mlp.c_fc"}})
    end
  end
  _ = have
end)

test("PEFT's merge in PyTorch (tests/py/ref_lora.py): base + exported adapters = lutra's merged model", function()
  local python = T.need_python("torch")
  local hf = require "lutra.hf"
  local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/lua/[^/]*$")) or "."
  local cases = {{gpt2, {r = 4, alpha = 8}, 2 * 4}, {llama, {r = 4, alpha = 8, rslora = true}, 2 * 7},
                 {llama, {r = 2, alpha = 4, targets = {"q_proj", "v_proj", "down_proj"}}, 2 * 3}}
  for _, case in ipairs(cases) do
    local mk = case[1]
    local dir = tmpdir()
    local model = mk()
    hf.save_pretrained(dir .. "/base", model)
    lora.apply(model, case[2])
    randomize_B(model)
    lora.save(dir .. "/adapter", model)
    lora.merge_and_unload(model)
    hf.save_pretrained(dir .. "/merged", model)
    local p = io.popen(string.format("%s %s/tests/py/ref_lora.py %s/base %s/adapter %s/merged 2>&1; echo rc=$?",
      python, root, dir, dir, dir))
    local out = p:read("*a")
    p:close()
    assert(out:find("rc=0", 1, true), out)
    local n = tonumber(out:match("modules=(%d+)"))
    equal(n, case[3], out) -- llama all-linear: q, k, v, o, gate, up, down per layer
    os.execute("rm -rf '" .. dir .. "'")
  end
end)

test("PEFT-style targets on llama: {q_proj, v_proj} are row blocks of qkv; k rows stay untouched", function()
  local r = 4
  local model = llama() -- q 16 rows, k 8, v 8 of qkv; d_model 16
  local _, names = lora.apply(model, {targets = {"q_proj", "v_proj"}, r = r, alpha = 8})
  equal(names, {"blocks.0.attn.qkv", "blocks.1.attn.qkv"})
  local m = model.blocks[1].attn.qkv
  equal(m.blocks, {{0, 16}, {24, 8}})
  local trainable, _, analytic = lora.count(model)
  equal(analytic, 2 * (r * (16 + 16) + r * (16 + 8))) -- PEFT's count for q_proj and v_proj
  equal(trainable, analytic)
  -- training moves the q and v rows only
  local x, y = ids(2, 6, 29), ids(2, 6, 29)
  local opt = optim.AdamW(lora.param_groups(model), {lr = 1e-2})
  for _ = 1, 3 do
    opt:zero_grad()
    local _, loss = model(x, y)
    loss:backward()
    opt:step()
  end
  local d = m:delta()
  assert(d:narrow(0, 0, 16):abs():max():item() > 0)
  equal(d:narrow(0, 16, 8):abs():max():item(), 0)
  assert(d:narrow(0, 24, 8):abs():max():item() > 0)
  -- split_fused: every part its own adapter (PEFT's count for all-linear on llama)
  local full = llama()
  lora.apply(full, {r = r, split_fused = true})
  equal(full.blocks[1].attn.qkv.blocks, {{0, 16}, {16, 8}, {24, 8}})
  local t2, _, a2 = lora.count(full)
  local per_layer = r * (16 + 16) + 2 * r * (16 + 8) + r * (16 + 16) + 2 * r * (16 + 24) + r * (24 + 16)
  equal(a2, 2 * per_layer)
  equal(t2, a2)
  local st = require "lutra.ckpt.safetensors"
  local json = require "lutra.json"
  local dir = tmpdir()
  lora.save(dir, model)
  local h = st.read_header(dir .. "/adapter_model.safetensors")
  equal(#h.names, 2 * 2 * 2)
  equal(h.tensors["base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight"].shape, {8, r})
  equal(h.tensors["base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight"], nil)
  equal({unpack(json.read_file(dir .. "/adapter_config.json").target_modules)}, {"q_proj", "v_proj"})
  local fresh = llama()
  lt.no_grad(function() -- the same base weights as `model`
    for name, p in fresh:named_parameters() do p:copy_(model:state_dict()[name]) end
  end)
  lora.load(dir, fresh)
  equal(fresh.blocks[1].attn.qkv.blocks, {{0, 16}, {24, 8}})
  close(lt.no_grad(function() return fresh(x) end), lt.no_grad(function() return model(x) end))
  os.execute("rm -rf '" .. dir .. "'")
end)
