-- lutra.models: configs (defaults, errors naming the key), parameter names and counts,
-- tied embeddings (one tensor, gradient from both uses), initial weight statistics, the
-- loss with ignored targets, dropout in train and eval, the key/value cache, state
-- dicts, and a few steps of training that lower the loss.
local lt = require "lutra"
local models = require "lutra.models"
local T = require "lutra.testing"
local close, equal, fails = T.assert_close, T.assert_equal, T.assert_error

local function small(arch, extra)
  local cfg = {arch = arch, n_layer = 2, n_head = 4, d_model = 32, vocab_size = 64, block_size = 16}
  if arch == "llama" then cfg.n_kv_head = 2 end
  for k, v in pairs(extra or {}) do cfg[k] = v end
  return cfg
end

local function names_of(m)
  local list = {}
  for name in m:named_parameters() do list[#list + 1] = name end
  return list
end

test("config: arch defaults, every key checked, errors name the key", function()
  local g = models.config {arch = "gpt2"}
  equal({g.n_layer, g.n_head, g.d_model, g.vocab_size, g.block_size, g.pos, g.norm, g.mlp, g.bias, g.tie_embeddings,
         g.ffn_hidden, g.n_kv_head},
        {12, 12, 768, 50257, 1024, "learned", "layernorm", "gelu", true, true, 3072, 12})
  local l = models.config {arch = "llama", d_model = 64, n_head = 4}
  equal({l.pos, l.norm, l.mlp, l.bias, l.tie_embeddings, l.ffn_hidden, l.n_kv_head, l.rope_theta},
        {"rope", "rmsnorm", "swiglu", false, false, 192, 4, 10000})
  -- keys of one arch given to the other are honoured
  local mixed = models.config {arch = "gpt2", pos = "rope", n_kv_head = 4, d_model = 64, n_head = 8}
  equal({mixed.pos, mixed.n_kv_head}, {"rope", 4})
  fails("unknown key 'n_layers' (did you mean 'n_layer'?)", function() models.build {arch = "gpt2", n_layers = 2} end)
  fails("unknown key 'flash'", function() models.build {arch = "gpt2", flash = true} end)
  fails("arch must be one of gpt2, llama, moe; got \"gpt3\"", function() models.build {arch = "gpt3"} end)
  fails("arch must be one of gpt2, llama, moe; got nil", function() models.build {n_layer = 2} end)
  fails("n_head must be a positive integer, got 0", function() models.build(small("gpt2", {n_head = 0})) end)
  fails("d_model must be a positive integer, got 32.5", function() models.build(small("gpt2", {d_model = 32.5})) end)
  fails("dropout must be a number in [0, 1), got 1", function() models.build(small("gpt2", {dropout = 1})) end)
  fails("bias must be true or false, got \"yes\"", function() models.build(small("gpt2", {bias = "yes"})) end)
  fails("pos must be one of \"learned\", \"rope\", got \"alibi\"",
    function() models.build(small("gpt2", {pos = "alibi"})) end)
  fails("dtype must be a floating-point dtype", function() models.build(small("gpt2", {dtype = "i32"})) end)
  fails("d_model 30 is not a multiple of n_head 4", function() models.build(small("gpt2", {d_model = 30})) end)
  fails("n_head 4 is not a multiple of n_kv_head 3", function() models.build(small("llama", {n_kv_head = 3})) end)
  fails("rope needs an even head dim", function() models.build(small("llama", {d_model = 12})) end)
  fails("expected a config table", function() models.build("gpt2") end)
end)

test("size: the parameter count of a config is the built model's, and what the device cannot hold is refused", function()
  local size = require "lutra.models.size"
  for _, cfg in ipairs {small("gpt2"), small("llama"), small("gpt2", {bias = false, tie_embeddings = false, ffn_hidden = 20}),
                        small("llama", {bias = true, tie_embeddings = true, n_kv_head = 1}),
                        small("gpt2", {norm = "rmsnorm", mlp = "swiglu"}), small("llama", {pos = "learned"})} do
    local m = models.build(cfg)
    local _, total = size.parameters(m.cfg)
    equal(total, m:num_parameters(), cfg.arch)
  end
  assert(size.device_bytes("cpu") > 0, "physical memory is known on Linux")
  local status = "2 CUDA devices: cuda:0 NVIDIA H200 (sm_90, 140 GiB), cuda:1 NVIDIA A100-SXM4-80GB (sm_80, 79 GiB)"
  equal({size.cuda_bytes(status, 0), size.cuda_bytes(status, 1), size.cuda_bytes(status, 2)}, {140 * 2 ^ 30, 79 * 2 ^ 30})
  equal(size.cuda_bytes("lutra was built without CUDA", 0), nil)
  equal(size.human(1234), "1.2 kB")
  equal(size.human(5.5e15), "5.5 PB")
  -- refused before allocating: the keys of the largest part and the bytes
  local err = fails("models.build: the parameters would need", function() models.build(small("gpt2", {n_layer = 1e9})) end)
  assert(err:find("most are in the blocks (n_layer = 1000000000, d_model = 32, ffn_hidden = 128)", 1, true), err)
  err = fails("more than the", function() models.build(small("llama", {vocab_size = 2 ^ 31 - 1, d_model = 4096})) end)
  assert(err:find("in the token embeddings (vocab_size = 2147483647, d_model = 4096)", 1, true), err)
  fails("d_model must be at most 2147483647, got 2147483648",
    function() models.build(small("gpt2", {d_model = 2 ^ 31, n_head = 1})) end)
  fails("block_size must be at most 2147483647, got 1000000000000", function() models.build(small("gpt2", {block_size = 1e12})) end)
  -- an f16 model needs half the bytes of an f32 one
  local function bytes(dt)
    local e = fails("would need", function() models.build(small("gpt2", {n_layer = 1e9, dtype = dt})) end)
    local n, unit = e:match("would need ([%d.]+) (%a+)")
    return tonumber(n), unit
  end
  local f32, u32 = bytes("f32")
  local f16, u16 = bytes("f16")
  equal(u32, u16)
  close(f16, f32 / 2, {atol = 0.1})
end)

test("gpt2: names, shapes, counts; lm_head is wte.weight", function()
  local m = models.build(small("gpt2"))
  local names = names_of(m)
  equal({names[1], names[2], names[3], names[4], names[5], names[6]},
        {"wte.weight", "wpe.weight", "blocks.0.ln_1.weight", "blocks.0.ln_1.bias", "blocks.0.attn.qkv.weight",
         "blocks.0.attn.qkv.bias"})
  equal(names[#names], "ln_f.bias")
  equal(#names, 2 + 2 * 12 + 2)
  assert(rawequal(m.lm_head.weight, m.wte.weight))
  local sd = m:state_dict()
  assert(rawequal(sd["lm_head.weight"], sd["wte.weight"]))
  local C, V, L = 32, 64, 2
  equal(m:num_parameters(), V * C + 16 * C + L * (12 * C * C + 13 * C) + 2 * C)
  local idx = lt.randint(V, {3, 16})
  local logits, loss = m(idx, idx)
  equal(logits.shape, {3, 16, V})
  equal(loss.shape, {})
  equal(m(idx:narrow(1, 0, 5)).shape, {3, 5, V})
  assert(tostring(m):find("lm_head: Linear(32, 64, bias=false)  0 (weight tied to wte.weight)", 1, true))
end)

test("llama: RMSNorm, SwiGLU, GQA and MQA shapes, no biases, untied head", function()
  local m = models.build(small("llama"))
  local names = names_of(m)
  equal(names, {"wte.weight", "blocks.0.ln_1.weight", "blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight",
                "blocks.0.ln_2.weight", "blocks.0.mlp.gate.weight", "blocks.0.mlp.up.weight",
                "blocks.0.mlp.proj.weight",
                "blocks.1.ln_1.weight", "blocks.1.attn.qkv.weight", "blocks.1.attn.proj.weight", "blocks.1.ln_2.weight",
                "blocks.1.mlp.gate.weight", "blocks.1.mlp.up.weight", "blocks.1.mlp.proj.weight", "ln_f.weight",
                "lm_head.weight"})
  equal(m.blocks[1].attn.qkv.weight.shape, {(4 + 2 * 2) * 8, 32})
  equal(m.blocks[1].mlp.gate.weight.shape, {96, 32})
  assert(not rawequal(m.lm_head.weight, m.wte.weight))
  local C, V, F = 32, 64, 96
  equal(m:num_parameters(), 2 * V * C + 2 * (2 * C + C * 64 + C * C + 3 * C * F) + C)
  local mqa = models.build(small("llama", {n_kv_head = 1}))
  equal(mqa.blocks[2].attn.qkv.weight.shape, {(4 + 2) * 8, 32})
  equal(mqa(lt.randint(64, {2, 7})).shape, {2, 7, 64})
  equal(models.build(small("llama", {dtype = "f64"})).wte.weight.dtype, "f64")
end)

test("tied embeddings: the gradient of wte.weight sums the embedding's and the head's", function()
  local tied = models.build(small("gpt2", {dtype = "f64"}))
  local untied = models.build(small("gpt2", {dtype = "f64", tie_embeddings = false}))
  untied:load_state_dict(tied:state_dict()) -- lm_head.weight gets a copy of wte.weight
  assert(not rawequal(untied.lm_head.weight, untied.wte.weight))
  local idx, targets = lt.randint(64, {2, 16}), lt.randint(64, {2, 16})
  local _, loss_t = tied(idx, targets)
  local _, loss_u = untied(idx, targets)
  close(loss_t:item(), loss_u:item(), {rtol = 1e-12, atol = 0})
  loss_t:backward()
  loss_u:backward()
  local g_emb, g_head = untied.wte.weight.grad, untied.lm_head.weight.grad
  assert(g_emb:abs():max():item() > 1e-6 and g_head:abs():max():item() > 1e-6)
  close(tied.wte.weight.grad, g_emb + g_head, {rtol = 1e-10, atol = 1e-14})
  assert(rawequal(tied.lm_head.weight.grad, tied.wte.weight.grad))
  -- and they accumulate across backward calls
  local _, again = tied(idx, targets)
  again:backward()
  close(tied.wte.weight.grad, (g_emb + g_head) * 2, {rtol = 1e-10, atol = 1e-14})
end)

test("init: N(0, 0.02), residual projections 0.02 / sqrt(2 n_layer), biases zero, norms one", function()
  lt.manual_seed(7)
  local L = 4
  for _, arch in ipairs {"gpt2", "llama"} do
    local m = models.build {arch = arch, n_layer = L, n_head = 4, d_model = 256, vocab_size = 512, block_size = 256}
    for name, p in m:named_parameters() do
      local std, mean = p:std():item(), p:mean():item()
      if name:find("ln_") then
        local want = name:find("bias$") and 0 or 1
        equal({p:min():item(), p:max():item()}, {want, want}, name)
      elseif name:find("bias$") then
        equal(p:abs():max():item(), 0, name)
      else
        local want = name:find("%.proj%.weight$") and 0.02 / math.sqrt(2 * L) or 0.02
        close(std, want, {rtol = 0.05, atol = 0, msg = name})
        close(mean, 0, {rtol = 0, atol = 4 * want / math.sqrt(p:numel()), msg = name})
      end
    end
  end
  -- init_std scales everything; reproducible from the seed
  lt.manual_seed(3)
  local a = models.build(small("gpt2", {init_std = 0.1}))
  lt.manual_seed(3)
  local b = models.build(small("gpt2", {init_std = 0.1}))
  close(a.blocks[1].mlp.fc.weight, b.blocks[1].mlp.fc.weight, {rtol = 0, atol = 0})
  assert(a.wte.weight:std():item() > 0.08)
end)

test("loss: the mean cross-entropy over targets that are not -100", function()
  local m = models.build(small("llama", {dtype = "f64"}))
  local idx, targets = lt.randint(64, {2, 16}), lt.randint(64, {2, 16})
  targets[{0, {2, 9}}] = -100
  local logits, loss = m(idx, targets)
  local lp, tl = logits:log_softmax(-1):tolist(), targets:tolist()
  local sum, n = 0, 0
  for b = 1, 2 do
    for t = 1, 16 do
      if tl[b][t] ~= -100 then sum, n = sum - lp[b][t][tl[b][t] + 1], n + 1 end
    end
  end
  equal(n, 25)
  close(loss:item(), sum / n, {rtol = 1e-12, atol = 0})
  fails("idx must be i64 or i32, got f32", function() m(lt.zeros(2, 3)) end)
  fails("targets must be (B, T) = (2, 16), got [2, 15]", function() m(idx, targets:narrow(1, 0, 15)) end)
  fails("17 positions do not fit the block_size of 16", function() m(lt.randint(64, {1, 17})) end)
end)

test("dropout: random in train mode, reproducible from the seed; eval is the dropout-free model", function()
  local m = models.build(small("gpt2", {dropout = 0.3}))
  local plain = models.build(small("gpt2"))
  plain:load_state_dict(m:state_dict())
  local idx = lt.randint(64, {2, 16})
  lt.manual_seed(11)
  local a = m(idx)
  local b = m(idx)
  assert((a - b):abs():max():item() > 1e-3, "two training forwards should differ")
  lt.manual_seed(11)
  close(m(idx), a, {rtol = 0, atol = 0})
  assert((a - plain(idx)):abs():max():item() > 1e-3)
  m:eval()
  close(m(idx), plain(idx), {rtol = 0, atol = 0})
  close(m(idx), m(idx), {rtol = 0, atol = 0})
end)

test("kv cache: incremental decoding gives the logits of the full forward", function()
  for _, arch in ipairs {"gpt2", "llama"} do
    local m = models.build(small(arch, {dtype = "f64"}))
    local idx = lt.randint(64, {2, 12})
    local full = m(idx)
    local cache = m:kv_cache(2)
    equal({cache.pos, cache.len, #cache.layers}, {0, 16, 2})
    local parts = lt.no_grad(function()
      local out = {m(idx:narrow(1, 0, 7), nil, {cache = cache})}
      for t = 7, 11 do out[#out + 1] = m(idx:narrow(1, t, 1), nil, {cache = cache}) end
      return out
    end)
    equal(cache.pos, 12)
    close(lt.cat(parts, 1), full, {rtol = 1e-10, atol = 1e-12, msg = arch})
    fails("5 positions after 12 do not fit the cache of 16",
      function() lt.no_grad(function() m(idx:narrow(1, 0, 5), nil, {cache = cache}) end) end)
  end
  fails("kv_cache of 32 positions exceeds the learned positions (16)",
    function() models.build(small("gpt2")):kv_cache(1, 32) end)
  equal(models.build(small("llama")):kv_cache(1, 32).len, 32) -- RoPE has no position table
end)

test("state_dict round trip between two models; a different config is refused", function()
  lt.manual_seed(1)
  local a = models.build(small("llama"))
  lt.manual_seed(2)
  local b = models.build(small("llama"))
  local idx = lt.randint(64, {2, 16})
  assert((a(idx) - b(idx)):abs():max():item() > 1e-4)
  b:load_state_dict(a:state_dict())
  close(b(idx), a(idx), {rtol = 0, atol = 0})
  local wide = models.build(small("llama", {ffn_hidden = 64}))
  fails("shape mismatch for 'blocks.0.mlp.gate.weight': the state dict has [96, 32], the model [64, 32]",
    function() wide:load_state_dict(a:state_dict()) end)
  -- llama's layers with learned positions: one key more
  local learned = models.build(small("llama", {pos = "learned"}))
  fails("unexpected keys: wpe.weight", function() b:load_state_dict(learned:state_dict()) end)
  equal(b:load_state_dict(learned:state_dict(), {strict = false}),
    {missing_keys = {}, unexpected_keys = {"wpe.weight"}})
  close(b.blocks[2].mlp.up.weight, learned.blocks[2].mlp.up.weight, {rtol = 0, atol = 0})
  fails("missing keys: wpe.weight", function() learned:load_state_dict(a:state_dict()) end)
end)

test("training: a few SGD steps on one batch lower the loss (gpt2 and llama)", function()
  for _, arch in ipairs {"gpt2", "llama"} do
    lt.manual_seed(0)
    local m = models.build(small(arch))
    local idx = lt.randint(64, {4, 16})
    local targets = idx -- predict the current token: learnable through the residual path
    local first, last
    for step = 1, 30 do
      local _, loss = m(idx, targets)
      if step == 1 then first = loss:item() end
      last = loss:item()
      m:zero_grad()
      loss:backward()
      lt.no_grad(function()
        for _, p in ipairs(m:parameters()) do p:sub_(p.grad * 0.5) end
      end)
    end
    assert(last < first - 1, string.format("%s: loss %.3f -> %.3f", arch, first, last))
  end
end)

test("memory: logits freed by the caller, intermediates released: the same gradients, less memory", function()
  -- With the logits dropped, cross_entropy's backward writes the gradient over them, and
  -- every activation goes as soon as backward used it: the gradients must not change.
  for _, arch in ipairs {"gpt2", "llama"} do
    local grads = {}
    for run = 1, 2 do
      lt.manual_seed(3)
      local m = models.build(small(arch, {dtype = "f64"}))
      local idx = lt.randint(0, 64, {2, 16})
      local tgt = lt.randint(0, 64, {2, 16})
      lt.tidy(function()
        local logits, loss = m(idx, tgt)
        if run == 2 then logits:free() end
        loss:backward()
        if run == 1 then logits:sum() end -- still readable when kept
      end)
      grads[run] = {}
      for name, p in m:named_parameters() do grads[run][name] = p.grad end
    end
    for name, g in pairs(grads[1]) do close(grads[2][name], g, {rtol = 0, atol = 0, msg = arch .. " " .. name}) end
  end
  -- the peak of a step with dropped logits is below that of one that keeps them
  local peaks = {}
  for run = 1, 2 do
    lt.manual_seed(3)
    local m = models.build {arch = "gpt2", n_layer = 1, n_head = 2, d_model = 64, vocab_size = 4096, block_size = 64}
    local idx, tgt = lt.randint(0, 4096, {4, 64}), lt.randint(0, 4096, {4, 64})
    lt.collectgarbage()
    lt.reset_peak_memory_stats()
    local base = lt.memory_stats().allocated
    lt.tidy(function()
      local logits, loss = m(idx, tgt)
      if run == 2 then logits:free() end
      loss:backward()
    end)
    peaks[run] = lt.memory_stats().peak - base
  end
  local logits_bytes = 4 * 64 * 4096 * 4
  assert(peaks[2] <= peaks[1] - logits_bytes + 65536, string.format("peaks %d and %d", peaks[1], peaks[2]))
end)
