-- tests/fuzz/targets_hf.lua — lua_fuzz.lua targets for a Hugging Face directory's files, read
-- as lutra reads them (each input is written to a temporary file first; every error must name it):
--   config     config.json -> lutra.hf.config_from_hf -> lutra's model config: types, ranges and
--              the memory limit refuse before anything is allocated; a config that passes and is
--              small (at most 200k parameters) is built, which must then work
--   tokenizer  tokenizer.json -> lutra.tokenizer.load; a tokenizer that loads encodes and decodes
--   lutra tests/fuzz/lua_fuzz.lua tests/fuzz/targets_hf.lua config --runs=1000000 --seed=2
local hf = require "lutra.hf"
local json = require "lutra.json"
local models = require "lutra.models"
local size = require "lutra.models.size"
local tokenizer = require "lutra.tokenizer"

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/fuzz/"

-- A temporary file for the inputs of one target, removed when the fuzzer's Lua state closes.
local keep = {}
-- In /dev/shm where there is one: a file written at every execution on a disk costs more than
-- the parse it feeds.
local function scratch()
  local path = os.tmpname()
  local probe = io.open("/dev/shm/" .. path:match("[^/]+$"), "wb")
  if probe then
    probe:close()
    os.remove(path)
    path = "/dev/shm/" .. path:match("[^/]+$")
  end
  local sentinel = newproxy(true)
  getmetatable(sentinel).__gc = function() os.remove(path) end
  keep[#keep + 1] = sentinel
  return path
end

local function write(path, bytes)
  local f = assert(io.open(path, "wb"))
  f:write(bytes)
  f:close()
end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- ---- config.json ----------------------------------------------------------------------------

local config_path = scratch()
local config_seeds = {
  -- GPT-2 small as the Hub has it
  [[{"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
  "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
  "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": null,
  "summary_first_dropout": 0.1, "summary_proj_to_labels": true, "summary_type": "cls_index",
  "summary_use_proj": true, "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257}]],
  -- a TinyLlama-like llama with grouped-query attention
  [[{"architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5632,
  "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 22,
  "num_key_value_heads": 4, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "rope_theta": 10000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.35.0", "use_cache": true, "vocab_size": 32000}]],
  -- small ones, as hf.save_pretrained writes them (these get built)
  [[{"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0, "embd_pdrop": 0,
  "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_embd": 16, "n_head": 2,
  "n_inner": null, "n_layer": 1, "n_positions": 16, "reorder_and_upcast_attn": false, "resid_pdrop": 0,
  "scale_attn_by_inverse_layer_idx": false, "scale_attn_weights": true, "tie_word_embeddings": true,
  "torch_dtype": "float32", "use_cache": true, "vocab_size": 31}]],
  [[{"architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0, "head_dim": 8,
  "hidden_act": "silu", "hidden_size": 16, "initializer_range": 0.02, "intermediate_size": 64,
  "max_position_embeddings": 16, "mlp_bias": false, "model_type": "llama", "num_attention_heads": 2,
  "num_hidden_layers": 1, "num_key_value_heads": 1, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "rope_theta": 10000, "tie_word_embeddings": false, "vocab_size": 300}]],
}
local config_dict = {"\"model_type\"", "\"gpt2\"", "\"llama\"", "\"architectures\"", "\"BertModel\"", "\"n_layer\"",
  "\"n_head\"", "\"n_embd\"", "\"n_positions\"", "\"n_ctx\"", "\"n_inner\"", "\"vocab_size\"", "\"head_dim\"",
  "\"hidden_size\"", "\"num_hidden_layers\"", "\"num_attention_heads\"", "\"num_key_value_heads\"",
  "\"intermediate_size\"", "\"max_position_embeddings\"", "\"rope_scaling\"", "\"rope_theta\"", "\"rms_norm_eps\"",
  "\"layer_norm_epsilon\"", "\"tie_word_embeddings\"", "\"attention_bias\"", "\"mlp_bias\"", "\"hidden_act\"",
  "\"activation_function\"", "\"resid_pdrop\"", "\"attention_dropout\"", "\"pruned_heads\"", "\"initializer_range\"",
  "\"scale_attn_weights\"", "\"rope_type\"", "\"yarn\"", "\"silu\"", "\"16\"", "2147483647", "2147483648", "1e9",
  "1e12", "65536", "0.1", "-0", "{\"type\": \"linear\", \"factor\": 2}", "[\"GPT2LMHeadModel\"]"}

local function config_run(bytes)
  write(config_path, bytes)
  local hc = json.read_file(config_path)
  local cfg = hf.config_from_hf(hc, {path = config_path})
  local _, total = size.parameters(cfg)
  if total <= 2e5 then models.build(cfg) end
end

-- ---- tokenizer.json -------------------------------------------------------------------------

local tokenizer_path = scratch()
local tokenizer_seeds = {}
for _, name in ipairs {"bpe_minimal", "bpe_sequence", "bpe_llama3", "bpe_trained", "char"} do
  tokenizer_seeds[#tokenizer_seeds + 1] = read(here .. "corpus_tokenizer/" .. name .. ".json")
end
local tokenizer_dict = {"\"model\"", "\"vocab\"", "\"merges\"", "\"BPE\"", "\"added_tokens\"", "\"id\"",
  "\"content\"", "\"special\"", "\"lstrip\"", "\"rstrip\"", "\"pre_tokenizer\"", "\"ByteLevel\"", "\"Sequence\"",
  "\"Split\"", "\"use_regex\"", "\"add_prefix_space\"", "\"unk_token\"", "\"ignore_merges\"", "\"byte_fallback\"",
  "\"lutra_tokenizer\"", "\"codepoints\"", "\"\\u0120\"", "\"\\u0000\"", "\"a b\"", "[\"a\", \"b\"]",
  "\"<|endoftext|>\"", "268435455", "268435456"}

local function tokenizer_run(bytes)
  write(tokenizer_path, bytes)
  local tok = tokenizer.load(tokenizer_path)
  -- a tokenizer that loaded works: its errors (a byte without a token) are clear ones
  local ok, err = pcall(function()
    local ids = tok:encode("Hello world, caf\195\169! <|endoftext|> 12345")
    tok:decode(ids)
  end)
  if not ok then error(tokenizer_path .. ": after loading: " .. tostring(err), 0) end
end

return {
  config = {seeds = config_seeds, dict = config_dict, run = config_run, names = config_path},
  tokenizer = {seeds = tokenizer_seeds, dict = tokenizer_dict, run = tokenizer_run, names = tokenizer_path},
}
