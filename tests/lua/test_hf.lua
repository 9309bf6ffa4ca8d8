-- lutra.hf: Hugging Face directories for gpt2 and llama. Round trips (save then load gives
-- the same weights and bitwise the same logits; sharded; bf16 files), config.json checks (a
-- key lutra cannot honour is an error naming it), weight checks (missing, unexpected,
-- misshapen tensors named), GPT-2 files in the GPT2Model naming, tokenizers; and the
-- name/layout mapping against an independent PyTorch implementation of HF's GPT-2 and
-- Llama (tests/py/ref_hf_models.py reads the exported files under HF's names).
local lt = require "lutra"
local hf = require "lutra.hf"
local st = require "lutra.ckpt.safetensors"
local json = require "lutra.json"
local models = require "lutra.models"
local T = require "lutra.testing"
local equal, fails, close = T.assert_equal, T.assert_error, T.assert_close

local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/lua/[^/]*$")) or "."

local dir = os.tmpname()
os.remove(dir)
os.execute("mkdir -p " .. dir)

local CASES = {
  gpt2 = {arch = "gpt2", n_layer = 2, n_head = 2, d_model = 16, vocab_size = 37, block_size = 24},
  gpt2_untied = {arch = "gpt2", n_layer = 1, n_head = 4, d_model = 16, vocab_size = 29, block_size = 16,
                 tie_embeddings = false, ffn_hidden = 40, norm_eps = 1e-6},
  llama_gqa = {arch = "llama", n_layer = 2, n_head = 4, n_kv_head = 2, d_model = 32, vocab_size = 41, block_size = 32,
               rope_theta = 500000},
  llama_tied_bias = {arch = "llama", n_layer = 2, n_head = 2, n_kv_head = 1, d_model = 16, vocab_size = 23,
                     block_size = 16, tie_embeddings = true, bias = true, ffn_hidden = 24},
}

local function build(name, dt)
  local c = {}
  for k, v in pairs(CASES[name]) do c[k] = v end
  c.dtype = dt
  lt.manual_seed(7)
  local m = models.build(c)
  -- norm weights and biases away from their 1 / 0 init, so that a mix-up shows
  lt.no_grad(function()
    for pname, p in pairs(m:state_dict()) do
      if pname:match("ln_") or pname:match("bias") then p:copy_(lt.randn(p.shape, {dtype = dt}) * 0.2 + 1) end
    end
  end)
  return m
end

local function ids(vocab, B, Tn)
  T.seed(3)
  local l = {}
  for b = 1, B do
    l[b] = {}
    for t = 1, Tn do l[b][t] = T.randint(0, vocab) end
  end
  return l
end

local function logits(m, idlist)
  return lt.no_grad(function() return m(lt.tensor(idlist, "i64")) end)
end

local function count(t)
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n
end

test("round trips: same state, bitwise the same logits; gpt2 and llama, tied, untied, GQA, biases", function()
  for name in pairs(CASES) do
    local m = build(name, "f32")
    local d = dir .. "/" .. name
    hf.save_pretrained(d, m, nil)
    local m2, tok, cfg = hf.load_pretrained(d)
    equal(tok, nil)
    for k, v in pairs(m.cfg) do
      if k ~= "init_std" and k ~= "dropout" then equal(cfg[k], v, name .. " cfg." .. k) end
    end
    local sd, sd2 = m:state_dict(), m2:state_dict()
    equal(count(sd2), count(sd), name)
    for k, v in pairs(sd) do equal(sd2[k]:tolist(), v:tolist(), name .. " " .. k) end
    local idl = ids(cfg.vocab_size, 2, 7)
    equal(logits(m2, idl):tolist(), logits(m, idl):tolist(), name)
    if cfg.tie_embeddings then assert(m2.lm_head.weight == m2.wte.weight, "tied after load") end
    -- the file holds HF's names
    local h = st.read_header(d .. "/model.safetensors")
    local family = cfg.arch
    assert(h.tensors[family == "gpt2" and "transformer.h.0.attn.c_attn.weight" or "model.layers.0.self_attn.k_proj.weight"])
    equal(h.tensors["lm_head.weight"] ~= nil, not cfg.tie_embeddings, name .. " lm_head only when untied")
    equal(h.metadata.format, "pt")
  end
end)

test("shapes and layouts under HF's names", function()
  local m = build("gpt2", "f32")
  hf.save_pretrained(dir .. "/g", m)
  local w = st.load(dir .. "/g/model.safetensors")
  local C = 16
  equal(w["transformer.h.1.attn.c_attn.weight"].shape, {C, 3 * C})
  equal(w["transformer.h.1.mlp.c_fc.weight"].shape, {C, 4 * C})
  equal(w["transformer.h.1.mlp.c_proj.weight"].shape, {4 * C, C})
  equal(w["transformer.wpe.weight"].shape, {24, C})
  -- Conv1D stores (in, out): the transpose of lutra's Linear (out, in)
  equal(w["transformer.h.1.attn.c_attn.weight"]:tolist(), m.blocks[2].attn.qkv.weight:t():tolist())
  equal(w["transformer.h.0.mlp.c_proj.bias"]:tolist(), m.blocks[1].mlp.proj.bias:tolist())
  local l = build("llama_gqa", "f32")
  hf.save_pretrained(dir .. "/l", l)
  w = st.load(dir .. "/l/model.safetensors")
  local qkv = l.blocks[1].attn.qkv.weight -- rows [4 q heads | 2 k heads | 2 v heads] of 8
  equal(w["model.layers.0.self_attn.q_proj.weight"]:tolist(), qkv:narrow(0, 0, 32):tolist())
  equal(w["model.layers.0.self_attn.k_proj.weight"]:tolist(), qkv:narrow(0, 32, 16):tolist())
  equal(w["model.layers.0.self_attn.v_proj.weight"]:tolist(), qkv:narrow(0, 48, 16):tolist())
  equal(w["model.layers.1.mlp.down_proj.weight"].shape, {32, l.cfg.ffn_hidden})
  local hc = json.read_file(dir .. "/l/config.json")
  equal(hc.model_type, "llama")
  equal(hc.num_key_value_heads, 2)
  equal(hc.rope_theta, 500000)
  equal(hc.architectures, {"LlamaForCausalLM"})
  assert(hc.rope_scaling == json.null)
end)

test("linear_modules: HF module names of lutra's Linear layers (for adapters)", function()
  local W = require "lutra.hf.weights"
  local l = W.linear_modules(models.config(CASES.llama_gqa), "llama")
  equal(l["blocks.1.attn.qkv"], {{hf = "model.layers.1.self_attn.q_proj", rows = {0, 32}},
    {hf = "model.layers.1.self_attn.k_proj", rows = {32, 16}}, {hf = "model.layers.1.self_attn.v_proj", rows = {48, 16}}})
  equal(l["blocks.0.mlp.proj"], {{hf = "model.layers.0.mlp.down_proj"}})
  equal(l["lm_head"], {{hf = "lm_head"}})
  local n = 0
  for _ in pairs(l) do n = n + 1 end
  equal(n, 2 * 5 + 1) -- qkv, proj, gate, up, down per layer; lm_head
  local g = W.linear_modules(models.config(CASES.gpt2), "gpt2")
  equal(g["blocks.0.attn.qkv"], {{hf = "transformer.h.0.attn.c_attn", conv1d = true}})
  equal(g["blocks.1.mlp.fc"], {{hf = "transformer.h.1.mlp.c_fc", conv1d = true}})
  equal(g["lm_head"], nil) -- tied: HF has no lm_head weight of its own
end)

test("sharded save and load; bf16 files; stale files of the other layout removed", function()
  local m = build("llama_gqa", "f32")
  local d = dir .. "/sharded"
  hf.save_pretrained(d, m, nil, {max_shard_size = 6000})
  local index = json.read_file(d .. "/model.safetensors.index.json")
  local files = {}
  for _, f in pairs(index.weight_map) do files[f] = true end
  assert(count(files) >= 3, "several shards")
  equal(io.open(d .. "/model.safetensors"), nil)
  local total = 0
  for name, f in pairs(index.weight_map) do
    local h = st.read_header(d .. "/" .. f)
    local e = h.tensors[name]
    total = total + e["end"] - e.begin
  end
  equal(index.metadata.total_size, total)
  local m2 = hf.load_pretrained(d)
  local idl = ids(41, 1, 9)
  equal(logits(m2, idl):tolist(), logits(m, idl):tolist())
  -- an index that names a file without the tensor, or a path outside the directory
  local index_text = json.encode(index)
  local bad = json.decode(index_text)
  local a_file = bad.weight_map["model.norm.weight"]
  local other
  for _, f in pairs(bad.weight_map) do if f ~= a_file then other = f end end
  bad.weight_map["model.norm.weight"] = other
  json.write_file(d .. "/model.safetensors.index.json", bad)
  fails("does not hold model.norm.weight (as model.safetensors.index.json says)", hf.load_pretrained, d)
  bad.weight_map["model.norm.weight"] = "../" .. a_file
  json.write_file(d .. "/model.safetensors.index.json", bad)
  fails("is not a file name in", hf.load_pretrained, d)
  json.write_file(d .. "/model.safetensors.index.json", json.decode(index_text))
  -- saving again as one file removes the shards and the index
  hf.save_pretrained(d, m, nil, {dtype = "bf16"})
  equal(io.open(d .. "/model.safetensors.index.json"), nil)
  for f in pairs(files) do equal(io.open(d .. "/" .. f), nil, f) end
  equal(json.read_file(d .. "/config.json").torch_dtype, "bfloat16")
  equal(st.read_header(d .. "/model.safetensors").tensors["model.norm.weight"].dtype, "bf16")
  -- the f32 model (HF's default) takes bf16 weights only when asked: lossless, but a conversion
  fails("tensor 'model.embed_tokens.weight' is bf16, the parameter is f32: the conversion is lossless but is not made "
    .. "unless asked for", hf.load_pretrained, d)
  local m3 = hf.load_pretrained(d, {allow_cast = true})
  equal(m3.cfg.dtype, "f32")
  for k, v in pairs(m:state_dict()) do equal(m3:state_dict()[k]:tolist(), v:to("bf16"):to("f32"):tolist(), k) end
  local m4 = hf.load_pretrained(d, {dtype = "bf16"})
  equal(m4.wte.weight.dtype, "bf16")
end)

test("config.json: keys lutra cannot honour are errors naming them", function()
  local m = build("llama_gqa", "f32")
  local d = dir .. "/cfgs"
  hf.save_pretrained(d, m)
  local good = json.read_file(d .. "/config.json")
  local function with(changes, fn)
    local c = json.decode(json.encode(good))
    for k, v in pairs(changes) do c[k] = v end
    json.write_file(d .. "/config.json", c)
    local ok, err = pcall(fn or hf.load_pretrained, d)
    json.write_file(d .. "/config.json", good)
    return ok, err
  end
  local function expect(fragment, changes, opts)
    local ok, err = with(changes, function() return hf.load_pretrained(d, opts) end)
    assert(not ok, "expected an error with " .. fragment)
    assert(tostring(err):find(fragment, 1, true), "got: " .. tostring(err))
  end
  -- (RoPE scalings are read: one that lacks a field transformers needs is refused, and no
  -- --ignore-key drops it)
  expect("config.json: rope_scaling: rope_type llama3 needs high_freq_factor (it changes the model's computation, "
    .. "so --ignore-key cannot drop it)", {rope_scaling = {rope_type = "llama3", factor = 8}})
  expect("config.json: hidden_act = \"gelu\": lutra needs \"silu\"", {hidden_act = "gelu"})
  expect("config.json: attention_dropout = 0.1", {attention_dropout = 0.1})
  -- mlp_bias and head_dim apart from hidden_size / num_attention_heads are read: the file then lacks those weights
  expect("missing model.layers.0.mlp.gate_proj.bias [", {mlp_bias = true})
  expect("model.layers.0.self_attn.q_proj.weight is [32, 32] in the file, [64, 32] from config.json", {head_dim = 16})
  expect("config.json: unknown key 'sliding_window' for llama", {sliding_window = 4096})
  expect("config.json: model_type = \"bert\": lutra needs \"gpt2\", \"llama\", \"mistral\", \"mixtral\", \"qwen2\", "
    .. "\"qwen2_moe\", \"qwen3\" or \"qwen3_moe\"", {model_type = "bert"})
  expect("config.json: num_hidden_layers = 1.5: lutra needs a positive integer", {num_hidden_layers = 1.5})
  expect("missing model.layers.2.input_layernorm.weight [32]", {num_hidden_layers = 3}) -- fewer layers in the file
  expect("model.embed_tokens.weight is [41, 32] in the file, [50, 32] from config.json", {vocab_size = 50})
  -- typed: a string is never converted; sizes are limited before anything is allocated
  expect(d .. "/config.json: head_dim = \"16\": lutra needs a positive integer", {head_dim = "16"})
  expect("config.json: head_dim = \"abc\": lutra needs a positive integer", {head_dim = "abc"})
  expect("config.json: tie_word_embeddings = \"yes\": lutra needs true or false", {tie_word_embeddings = "yes"})
  expect("config.json: rope_theta = 0: lutra needs a positive number", {rope_theta = 0})
  expect("config.json: hidden_size = 2147483648: lutra needs a positive integer at most 2147483647",
    {hidden_size = 2 ^ 31})
  expect("config.json: the parameters would need", {num_hidden_layers = 1e9})
  expect("most are in the blocks (num_hidden_layers = 1000000000, hidden_size = 32, intermediate_size = ",
    {num_hidden_layers = 1e9})
  expect("config.json: rope_scaling.type = \"proportional\": lutra needs \"default\", \"linear\", \"dynamic\", "
    .. "\"llama3\", \"yarn\" or \"longrope\" (the RoPE scalings lutra computes)", {rope_scaling = {type = "proportional"}})
  expect("config.json: architectures[1] = \"BertModel\" does not fit model_type = \"llama\" (a llama config names "
    .. "\"LlamaForCausalLM\" or \"LlamaModel\")", {architectures = json.array {"BertModel"}})
  fails("hf: config.json must hold a JSON object, got an array", hf.config_from_hf, json.decode("[1]"))
  fails("hf: x.json: model_type is missing (lutra knows \"gpt2\", \"llama\", \"mistral\", \"mixtral\", \"qwen2\", "
    .. "\"qwen2_moe\", \"qwen3\" or \"qwen3_moe\")", hf.config_from_hf, {}, {path = "x.json"})
  -- tie_word_embeddings over a file that holds lm_head.weight: tied, the file's head dropped (as HF does)
  local ok, tied = with({tie_word_embeddings = true})
  assert(ok, tostring(tied))
  assert(tied.lm_head.weight == tied.wte.weight)
  -- harmless keys are accepted, and ignore_keys lets a user accept one knowingly
  local ok = with({transformers_version = "4.44.0", bos_token_id = 1, eos_token_id = {2, 3}, torch_dtype = "bfloat16",
                   pretraining_tp = 1, _name_or_path = "x", use_cache = false})
  assert(ok, "harmless keys accepted")
  ok = with({sliding_window = 4096}, function() return hf.load_pretrained(d, {ignore_keys = {"sliding_window"}}) end)
  assert(ok, "ignore_keys")
  fails("hf.load_pretrained: " .. dir .. "/nope/config.json not found", hf.load_pretrained, dir .. "/nope")
  -- gpt2's constraints
  local g = build("gpt2", "f32")
  local dg = dir .. "/cfgs_gpt2"
  hf.save_pretrained(dg, g)
  local gc = json.read_file(dg .. "/config.json")
  for key, case in pairs {
    activation_function = {"relu", "activation_function = \"relu\": lutra needs \"gelu_new\""},
    scale_attn_by_inverse_layer_idx = {true, "scale_attn_by_inverse_layer_idx = true: lutra needs false"},
    add_cross_attention = {true, "add_cross_attention = true: lutra needs false"},
    n_ctx = {7, "n_ctx = 7: lutra needs n_positions"},
  } do
    local c = json.decode(json.encode(gc))
    c[key] = case[1]
    json.write_file(dg .. "/config.json", c)
    fails(case[2], hf.load_pretrained, dg)
  end
end)

test("GPT-2 files in GPT2Model naming (no transformer. prefix, attn.bias mask buffers) load", function()
  local m = build("gpt2", "f32")
  local d = dir .. "/gpt2model"
  hf.save_pretrained(d, m)
  local w = st.load(d .. "/model.safetensors")
  local renamed = {}
  for name, t in pairs(w) do renamed[(name:gsub("^transformer%.", ""))] = t end
  renamed["h.0.attn.bias"] = lt.ones(1, 1, 24, 24) -- the causal mask buffer of old checkpoints
  renamed["h.1.attn.masked_bias"] = lt.tensor(-1e4)
  st.save(d .. "/model.safetensors", renamed, {format = "pt"})
  local m2 = hf.load_pretrained(d)
  local idl = ids(37, 1, 5)
  equal(logits(m2, idl):tolist(), logits(m, idl):tolist())
  renamed["h.0.mlp.extra.weight"] = lt.ones(2)
  renamed["h.1.ln_2.bias"] = nil
  st.save(d .. "/model.safetensors", renamed)
  local err = fails("does not hold a gpt2 model of this config.json", hf.load_pretrained, d)
  assert(err:find("missing transformer.h.1.ln_2.bias [16]", 1, true), err)
  assert(err:find("unexpected transformer.h.0.mlp.extra.weight", 1, true), err)
end)

test("save: architectures HF has no name for are errors", function()
  local odd = models.build {arch = "llama", n_layer = 1, n_head = 2, d_model = 8, vocab_size = 11, block_size = 8,
                            pos = "learned"}
  fails("hf: no Hugging Face architecture has pos = learned, norm = rmsnorm, mlp = swiglu", hf.save_pretrained,
    dir .. "/odd", odd)
  local nobias = models.build {arch = "gpt2", n_layer = 1, n_head = 2, d_model = 8, vocab_size = 11, block_size = 8,
                               bias = false}
  fails("hf: a gpt2 model needs bias = true", hf.save_pretrained, dir .. "/odd", nobias)
  fails("hf.save_pretrained: expected a lutra.models model", hf.save_pretrained, dir .. "/odd", {})
end)

test("tokenizer.json travels with the model; bos/eos ids in config.json", function()
  local tokenizer = require "lutra.tokenizer"
  local text = ("the quick brown fox jumps over the lazy dog. "):rep(20)
  local tok = tokenizer.train_bpe(text, {vocab = 300, special_tokens = {"<|endoftext|>"}})
  local c = {arch = "gpt2", n_layer = 1, n_head = 2, d_model = 8, vocab_size = tok.vocab_size, block_size = 16}
  local m = models.build(c)
  local d = dir .. "/withtok"
  hf.save_pretrained(d, m, tok)
  local m2, tok2 = hf.load_pretrained(d)
  equal(tok2:encode("the lazy fox"), tok:encode("the lazy fox"))
  local hc = json.read_file(d .. "/config.json")
  equal(hc.eos_token_id, tok:token_id("<|endoftext|>"))
  equal(hc.bos_token_id, tok:token_id("<|endoftext|>"))
  local idl = {tok:encode("the lazy dog")}
  equal(logits(m2, idl):tolist(), logits(m, idl):tolist())
end)

test("PyTorch (HF's GPT-2 and Llama math under HF's names) gives the same logits", function()
  local PYTHON = T.need_python("torch")
  local dirs, ours, tol = {}, {}, {}
  for _, dt in ipairs {"f64", "f32"} do
    for name in pairs(CASES) do
      local key = name .. "_" .. dt
      local m = build(name, dt)
      local d = dir .. "/torch_" .. key
      hf.save_pretrained(d, m, nil, {max_shard_size = name == "llama_gqa" and 20000 or nil})
      local idl = ids(m.cfg.vocab_size, 2, 11)
      json.write_file(d .. "/ids.json", idl)
      dirs[#dirs + 1] = d
      ours[d] = logits(m, idl)
      tol[d] = dt == "f64" and {rtol = 1e-10, atol = 1e-10} or {rtol = 1e-5, atol = 1e-5}
    end
  end
  local cmd = PYTHON .. " " .. root .. "/tests/py/ref_hf_models.py " .. table.concat(dirs, " ") .. " >/dev/null"
  r = os.execute(cmd)
  assert(r == 0 or r == true, "failed: " .. cmd)
  for _, d in ipairs(dirs) do
    local ref = st.load(d .. "/ref_logits.safetensors").logits
    close(ours[d]:to("f64"), ref, {rtol = tol[d].rtol, atol = tol[d].atol, msg = d})
  end
end)

test("weights of another dtype are refused unless lossless and asked for; NaN/inf are counted and refused", function()
  local m = build("gpt2", "f32")
  local d = dir .. "/dtypes"
  hf.save_pretrained(d, m)
  local file = d .. "/model.safetensors"
  local good = st.load(file)
  local name = "transformer.h.0.mlp.c_fc.weight"
  local function with(dt, fn)
    local w = {}
    for k, t in pairs(good) do w[k] = t end
    w[name] = fn and fn(good[name]) or good[name]:to(dt)
    st.save(file, w, {format = "pt"})
  end
  local head = file .. ": tensor '" .. name .. "' is "
  with("i32")
  fails(head .. "i32, the parameter is f32: integer and bool tensors are not weights", hf.load_pretrained, d)
  fails(head .. "i32, the parameter is f32: integer", function() hf.load_pretrained(d, {allow_cast = true}) end)
  with("f64")
  fails(head .. "f64, the parameter is f32: converting it would lose precision",
    function() hf.load_pretrained(d, {allow_cast = true}) end)
  with("f16")
  fails(head .. "f16, the parameter is f32: the conversion is lossless", hf.load_pretrained, d)
  local m16 = hf.load_pretrained(d, {allow_cast = true})
  equal(m16:state_dict()["blocks.0.mlp.fc.weight"]:tolist(), good[name]:to("f16"):to("f32"):t():tolist())
  -- f32 into an f64 model: lossless, with allow_cast, the values exactly the file's
  with("f32")
  fails("is f32, the parameter is f64: the conversion is lossless", function() hf.load_pretrained(d, {dtype = "f64"}) end)
  local m64 = hf.load_pretrained(d, {dtype = "f64", allow_cast = true})
  equal(m64:state_dict()["blocks.0.mlp.fc.weight"]:tolist(), good[name]:t():tolist())
  -- two NaN and one inf among the values: counted, refused; loaded when the caller opts in
  with("f32", function(t)
    local x = t:clone()
    local flat = x:view(-1)
    flat:narrow(0, 3, 1):fill_(0 / 0)
    flat:narrow(0, 7, 1):fill_(0 / 0)
    flat:narrow(0, 11, 1):fill_(-math.huge)
    return x
  end)
  fails(head:gsub(" is $", "") .. ": 3 of its " .. good[name]:numel() .. " values are not finite", hf.load_pretrained, d)
  local mn = hf.load_pretrained(d, {allow_nonfinite = true})
  local w = mn:state_dict()["blocks.0.mlp.fc.weight"]:t():contiguous():view(-1):tolist()
  assert(w[4] ~= w[4] and w[8] ~= w[8] and w[12] == -math.huge, "the non-finite values loaded as they are")
  -- bf16 and f16 values: NaN and inf are found by their bits
  local wc = require "lutra.ckpt.weight_checks"
  for _, dt in ipairs {"bf16", "f16", "f64", "f32"} do
    local t = lt.tensor({1, 0 / 0, math.huge, -math.huge, 65504, -0.0, 1e-8}, {dtype = dt})
    equal(wc.count_nonfinite(t), 3, dt)
    equal(wc.count_nonfinite(t:narrow(0, 3, 4)), 1, dt .. " view")
  end
  equal(wc.count_nonfinite(lt.tensor({1, 2}, {dtype = "i32"})), 0)
end)

test("cleanup", function() os.execute("rm -rf " .. dir) end)
