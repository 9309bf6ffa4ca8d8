-- lutra.hf against models that transformers 5.25 wrote (tests/hf/fixtures/models, written by
-- tests/hf/gen_models.py): each family (gpt2, llama with each RoPE scaling, qwen2, qwen3,
-- mistral with a sliding window shorter than the sequence, SmolLM2's llama; the mixtures of
-- experts mixtral, qwen2_moe, qwen3_moe, more in test_hf_moe.lua), f32 and bf16 files,
-- tied and untied, sharded, a config.json in transformers 4.x's form. Each loads and gives
-- transformers' float64 logits to 1e-5 (relative to the largest); lutra saves it again and loads
-- that bitwise the same, as lutra convert does both ways (through a lutra checkpoint). RoPE's inverse frequencies and attention scaling equal the arrays
-- transformers' own functions return (run in float64: to 1e-13; as transformers runs them, in
-- float32: to float32's rounding). (The other direction, transformers loading what lutra wrote,
-- needs transformers: gen_models.py --check-lutra.)
local lt = require "lutra"
local hf = require "lutra.hf"
local json = require "lutra.json"
local models = require "lutra.models"
local rope = require "lutra.models.rope"
local convert = require "lutra.ckpt.convert"
local T = require "lutra.testing"
local equal = T.assert_equal

local fx = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "hf_model_fixtures.lua")
local NAMES, fixtures, rel_diff, expected, logits_of = fx.NAMES, fx.dir, fx.rel_diff, fx.expected, fx.logits_of

local tmp = os.tmpname()
os.remove(tmp)
os.execute("mkdir -p " .. tmp)

local FAMILY = {gpt2 = "gpt2", gpt2_bf16_untied = "gpt2", qwen2 = "qwen2", qwen2_sliding = "qwen2", qwen3 = "qwen3",
                qwen3_bias_bf16 = "qwen3", mistral_window = "mistral", mixtral = "mixtral", qwen2_moe = "qwen2_moe",
                qwen3_moe = "qwen3_moe"}

local worst = {}
local function check_logits(name, model, exp)
  local d = rel_diff(logits_of(model, exp.ids), exp.logits)
  if exp.ids_short then d = math.max(d, rel_diff(logits_of(model, exp.ids_short), exp.logits_short)) end
  worst[name] = d
  assert(d <= 1e-5, string.format("%s: logits differ from transformers' by %.3g (relative)", name, d))
  return d
end

-- RoPE scalings and sliding windows run in nn.CausalSelfAttention's rope_freq and window
local Attention = require "lutra.nn.attention"
local NEEDS = {llama_linear = "rope_freq", llama_dynamic = "rope_freq", llama_llama3 = "rope_freq",
               llama_yarn = "rope_freq", llama_longrope = "rope_freq", llama_v4_config = "rope_freq",
               qwen2_sliding = "window", mistral_window = "window", mixtral = "window"}
local HAS = {
  rope_freq = pcall(Attention, {d_model = 4, n_head = 1, rope = true, rope_freq = {inv_freq = {1, 0.5}, scale = 1}}),
  window = pcall(Attention, {d_model = 4, n_head = 1, window = 2}),
}

for _, name in ipairs(NAMES) do
  test("transformers' " .. name .. ": same logits; saved again and reloaded: bitwise the same", function()
    if NEEDS[name] and not HAS[NEEDS[name]] then skip("nn.CausalSelfAttention has no " .. NEEDS[name]) end
    local dir = fixtures .. "/" .. name
    local model, _, cfg = hf.load_pretrained(dir, {allow_cast = true})
    equal(hf.family_of(cfg), FAMILY[name] or "llama")
    local exp = expected(name)
    check_logits(name, model, exp)
    local out = tmp .. "/" .. name
    hf.save_pretrained(out, model, nil, {max_shard_size = name:match("sharded") and 30000 or nil})
    local hc = json.read_file(out .. "/config.json")
    equal(hc.model_type, FAMILY[name] or "llama")
    local again = hf.load_pretrained(out)
    local a, b = logits_of(model, exp.ids), logits_of(again, exp.ids)
    equal((a - b):abs():max():item(), 0)
    -- lutra convert both ways: Hugging Face -> lutra checkpoint -> Hugging Face, the same family and logits
    convert.convert(dir, out .. "-ckpt", {cast = true})
    convert.convert(out .. "-ckpt", out .. "-back", {})
    equal(json.read_file(out .. "-back/config.json").model_type, FAMILY[name] or "llama")
    local back = hf.load_pretrained(out .. "-back")
    equal((logits_of(back, exp.ids) - a):abs():max():item(), 0)
  end)
end

test("the figures: max relative logit difference per model", function()
  for _, name in ipairs(NAMES) do
    if worst[name] then io.write(string.format("  %-28s %.3g\n", name, worst[name])) end
  end
end)

test("RoPE frequencies and scaling equal transformers' (default, linear, dynamic, llama3, yarn, longrope)", function()
  local cases = json.read_file(fixtures .. "/rope.json")
  assert(#cases >= 12, "rope.json holds the cases")
  local kinds = {}
  for _, c in ipairs(cases) do
    local cfg = hf.config_from_hf(c.config, {path = "rope.json"})
    local dim = cfg.head_dim or cfg.d_model / cfg.n_head
    local seq = c.seq_len ~= json.null and c.seq_len or nil
    local f = rope.frequencies(cfg.rope_scaling, cfg.rope_theta, dim, seq)
    local what = c.name .. (seq and (" seq_len " .. seq) or "")
    equal(#f.inv_freq, #c.inv_freq_f64, what .. ": dim / 2 frequencies")
    for i, want in ipairs(c.inv_freq_f64) do
      local got = f.inv_freq[i]
      assert(math.abs(got - want) <= 1e-13 * math.abs(want),
        string.format("%s: inv_freq[%d] = %.17g, transformers (float64) %.17g", what, i, got, want))
      local w32 = c.inv_freq_f32[i]
      assert(math.abs(got - w32) <= 2 ^ -20 * math.abs(w32), -- a few float32 roundings on the way
        string.format("%s: inv_freq[%d] = %.17g, transformers (float32) %.9g", what, i, got, w32))
    end
    assert(math.abs(f.scale - c.scale_f64) <= 1e-14 * c.scale_f64,
      string.format("%s: scale %.17g, transformers %.17g", what, f.scale, c.scale_f64))
    kinds[(cfg.rope_scaling or {rope_type = "default"}).rope_type] = true
  end
  for _, k in ipairs(rope.types) do assert(kinds[k], "a case of rope_type " .. k) end
end)

test("a config.json in transformers 4.x's form reads as its 5.x form does", function()
  local v4 = json.read_file(fixtures .. "/llama_v4_config/config.json")
  assert(v4.rope_scaling and v4.torch_dtype and v4.rope_parameters == nil, "the fixture holds the 4.x keys")
  local v5 = json.decode(json.encode(v4))
  v5.rope_parameters = {rope_type = "linear", factor = v4.rope_scaling.factor, rope_theta = v4.rope_theta}
  v5.rope_scaling, v5.rope_theta, v5.torch_dtype, v5.dtype = nil, nil, nil, "float32"
  local a, b = hf.config_from_hf(v4), hf.config_from_hf(v5)
  equal(json.encode(a), json.encode(b))
  equal(a.rope_theta, 20000)
  equal(a.rope_scaling.factor, 3)
end)

test("q/k norm, head_dim apart, biases apart, sliding window: finite-difference gradients (f64), packed rows", function()
  lt.manual_seed(5)
  local m = models.build {arch = "llama", n_layer = 2, n_head = 2, n_kv_head = 1, d_model = 8, head_dim = 6,
                          vocab_size = 11, block_size = 16, qk_norm = true, qkv_bias = true, out_bias = false,
                          sliding_window = 3, layer_types = {"full_attention", "sliding_attention"}, dtype = "f64"}
  lt.no_grad(function()
    for _, p in ipairs(m:parameters()) do p:copy_(lt.randn(p.shape, {dtype = "f64"}) * 0.5 + (p.ndim == 1 and 1 or 0)) end
  end)
  local x = lt.tensor({{1, 2, 3, 4, 5, 6, 7, 8}}, "i64")
  local y = lt.tensor({{2, 3, 4, 5, 6, 7, 8, 9}}, "i64")
  local attn = m.blocks[2].attn
  T.gradcheck(function()
    local _, loss = m(x, y)
    return loss
  end, {attn.q_norm.weight, attn.k_norm.weight, attn.qkv.weight, attn.qkv.bias, m.blocks[1].attn.k_norm.weight})
  -- packed: two documents in one row give each one's logits alone (positions restart, no attention across)
  local a, b = lt.tensor({{1, 2, 3, 4, 5}}, "i64"), lt.tensor({{6, 7, 8}}, "i64")
  local row = lt.tensor({{1, 2, 3, 4, 5, 6, 7, 8}}, "i64")
  local pos = lt.tensor({{0, 1, 2, 3, 4, 0, 1, 2}}, "i64")
  local seg = lt.tensor({{0, 0, 0, 0, 0, 1, 1, 1}}, "i64")
  lt.no_grad(function()
    local packed = m(row, nil, {positions = pos, segments = seg})
    local la, lb = m(a), m(b)
    local d = math.max((packed:narrow(1, 0, 5) - la):abs():max():item(), (packed:narrow(1, 5, 3) - lb):abs():max():item())
    assert(d < 1e-12, "packed rows: " .. d)
    -- a key/value cache gives the logits of the whole sequence, one token at a time
    local cache = m:kv_cache(1, 8)
    local whole = m(row)
    for t = 0, 7 do
      local step = m(row:narrow(1, t, 1), nil, {cache = cache})
      local dt = (step - whole:narrow(1, t, 1)):abs():max():item()
      assert(dt < 1e-12, "cached step " .. t .. ": " .. dt)
    end
  end)
end)

test("cleanup", function() os.execute("rm -rf " .. tmp) end)
