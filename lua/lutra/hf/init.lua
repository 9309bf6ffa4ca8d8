-- lutra.hf — Hugging Face model directories for the gpt2 and llama families:
-- config.json, model.safetensors (or model-0000k-of-0000n.safetensors with
-- model.safetensors.index.json) and tokenizer.json.
--
--   local hf = require "lutra.hf"
--   local model, tok, cfg = hf.load_pretrained("gpt2-dir")          -- {dtype =, device =, ignore_keys = {..}}
--   hf.save_pretrained("out-dir", model, tok)                       -- {dtype = "bf16", max_shard_size = bytes}
--   local cfg = hf.config_from_hf(json.read_file("config.json"), {path = "config.json"})  -- lutra's model config
--
-- The architecture comes from config.json (model_type gpt2 or llama; architectures, when
-- present, must name that family's classes). A key lutra cannot honour (rope_scaling not null,
-- another hidden_act, cross attention, ...) is an error that names it; keys that do not change
-- the model (torch_dtype, token ids, generation settings, ...) are accepted; an unknown key is
-- an error unless listed in opts.ignore_keys (lutra cannot tell whether it changes the math).
-- Every key lutra reads is typed: sizes are integers in [1, 2^31 - 1], epsilons and
-- rope_theta positive finite numbers, dropouts in [0, 1), flags true or false (a string "16" or
-- "yes" is an error, never converted); and a model whose parameters would not fit in the
-- device's memory is refused before anything is allocated (lutra.models.size). Errors name
-- the file and the key. The model is built in f32 (HF's default; opts.dtype to change) and each
-- weight must have the model's dtype (lutra.ckpt.weight_checks): opts.allow_cast accepts the
-- lossless conversions (bf16, f16 -> f32), opts.allow_nonfinite NaN/inf values. tokenizer is
-- nil when the directory has no tokenizer.json.
local errors = require "lutra.errors"
local fields = require "lutra.tensor.fields"
local json = require "lutra.json"
local models = require "lutra.models"
local st = require "lutra.ckpt.safetensors"
local W = require "lutra.hf.weights"
local wc = require "lutra.ckpt.weight_checks"
local grad = require "lutra.nn.grad"

local raise = errors.raise

local M = {}

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local null = json.null
local function is_null(v) return v == nil or v == null end
-- A value as errors show it: its JSON, cut to 120 characters.
local function show(v)
  local ok, s = pcall(json.encode, v)
  s = ok and s or tostring(v)
  return #s > 120 and s:sub(1, 117) .. "..." or s
end

-- Keys of every PretrainedConfig that do not change the model's computation.
local HARMLESS = {}
for k in ([[architectures torch_dtype transformers_version _name_or_path name_or_path bos_token_id eos_token_id
  pad_token_id sep_token_id decoder_start_token_id use_cache initializer_range return_dict output_hidden_states
  output_attentions torchscript use_bfloat16 tf_legacy_loss is_decoder tie_encoder_decoder max_length min_length
  do_sample early_stopping num_beams num_beam_groups diversity_penalty temperature top_k top_p typical_p
  repetition_penalty length_penalty no_repeat_ngram_size encoder_no_repeat_ngram_size bad_words_ids
  num_return_sequences output_scores return_dict_in_generate forced_bos_token_id forced_eos_token_id
  remove_invalid_values exponential_decay_length_penalty suppress_tokens begin_suppress_tokens finetuning_task
  id2label label2id tokenizer_class prefix problem_type task_specific_params gradient_checkpointing
  chunk_size_feed_forward cross_attention_hidden_size model_type]]):gmatch("%S+") do
  HARMLESS[k] = true
end

-- The largest size lutra takes (sizes and ids are int32 in places).
local MAX_SIZE = 2 ^ 31 - 1

local function nonempty_object(v) return type(v) == "table" and not json.is_array(v) and next(v) ~= nil end
local function empty_or_null(v) return is_null(v) or (type(v) == "table" and next(v) == nil) end

-- The value a key must hold when it is present (nil: fine; else what lutra needs).
local function must_be(want, what)
  return function(v) if v ~= want then return what end end
end
local function no_pruned_heads(v) if not empty_or_null(v) then return "{} (no pruned heads)" end end
local function no_rope_scaling(v)
  if is_null(v) then return nil end
  local kind = type(v) == "table" and (v.rope_type or v.type)
  if type(kind) == "string" then
    return string.format("null (lutra has no RoPE scaling, so rope_type %s is not supported)", show(kind))
  end
  return "null (no RoPE scaling)"
end

-- Per family: the architectures (config.json's class names) that fit it, keys lutra reads (each
-- read below with a type and a range), keys harmless for it, keys that must hold a given value,
-- and the config.json name of each of lutra's size keys (for the errors of models.config).
local FAMILY = {
  gpt2 = {
    architectures = {"GPT2LMHeadModel", "GPT2Model"},
    mapped = {n_layer = true, n_head = true, n_embd = true, n_positions = true, vocab_size = true, n_inner = true,
              layer_norm_epsilon = true, tie_word_embeddings = true, resid_pdrop = true, embd_pdrop = true,
              attn_pdrop = true, activation_function = true, n_ctx = true, initializer_range = true},
    harmless = {summary_type = true, summary_use_proj = true, summary_activation = true, summary_proj_to_labels = true,
                summary_first_dropout = true, reorder_and_upcast_attn = true},
    must = {
      scale_attn_weights = must_be(true, "true"),
      scale_attn_by_inverse_layer_idx = must_be(false, "false"),
      add_cross_attention = must_be(false, "false"),
      is_encoder_decoder = must_be(false, "false"),
      pruned_heads = no_pruned_heads,
    },
    names = {n_layer = "n_layer", n_head = "n_head", n_kv_head = "n_head", d_model = "n_embd", vocab_size = "vocab_size",
             block_size = "n_positions", ffn_hidden = "n_inner"},
  },
  llama = {
    architectures = {"LlamaForCausalLM", "LlamaModel"},
    mapped = {num_hidden_layers = true, num_attention_heads = true, num_key_value_heads = true, hidden_size = true,
              intermediate_size = true, max_position_embeddings = true, vocab_size = true, rms_norm_eps = true,
              rope_theta = true, tie_word_embeddings = true, attention_bias = true, mlp_bias = true, hidden_act = true,
              head_dim = true, initializer_range = true},
    harmless = {pretraining_tp = true}, -- only splits the matmuls (the same math)
    must = {
      rope_scaling = no_rope_scaling,
      attention_dropout = must_be(0, "0 (lutra has no dropout on attention weights)"),
      is_encoder_decoder = must_be(false, "false"),
      pruned_heads = no_pruned_heads,
    },
    names = {n_layer = "num_hidden_layers", n_head = "num_attention_heads", n_kv_head = "num_key_value_heads",
             d_model = "hidden_size", vocab_size = "vocab_size", block_size = "max_position_embeddings",
             ffn_hidden = "intermediate_size"},
  },
}
M.model_types = {"gpt2", "llama"}

-- Typed reads of a config.json table: each error names the file and the key.
local Reader = {}
Reader.__index = Reader

function Reader:bad(key, v, what)
  raise(string.format("hf: %s: %s = %s: lutra needs %s", self.path, key, show(v), what))
end

function Reader:int(key, default)
  local v = self.hc[key]
  if is_null(v) then
    if default ~= nil then return default end
    raise(string.format("hf: %s: %s is missing", self.path, key))
  end
  if type(v) ~= "number" or v ~= math.floor(v) or v < 1 then self:bad(key, v, "a positive integer") end
  if v > MAX_SIZE then self:bad(key, v, string.format("a positive integer at most %d", MAX_SIZE)) end
  return v
end

-- A finite number in [lo, hi) (hi nil: no bound; open_lo: lo itself excluded).
function Reader:num(key, default, lo, hi, what, open_lo)
  local v = self.hc[key]
  if is_null(v) then return default end
  if type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge or v < lo or (open_lo and v == lo)
      or (hi and v >= hi) then
    self:bad(key, v, what)
  end
  return v
end

function Reader:bool(key, default)
  local v = self.hc[key]
  if is_null(v) then return default end
  if type(v) ~= "boolean" then self:bad(key, v, "true or false") end
  return v
end

-- A string among `allowed` (what: how the error lists them).
function Reader:choice(key, allowed, what)
  local v = self.hc[key]
  if is_null(v) then return nil end
  for _, a in ipairs(allowed) do
    if v == a then return v end
  end
  self:bad(key, v, what)
end

local function quoted_list(list)
  local out = {}
  for i, s in ipairs(list) do out[i] = show(s) end
  if #out <= 1 then return out[1] or "" end
  return table.concat(out, ", ", 1, #out - 1) .. " or " .. out[#out]
end

-- The family of a config: its model_type, checked against architectures.
function Reader:family()
  local family = self.hc.model_type
  if is_null(family) then
    raise(string.format("hf: %s: model_type is missing (lutra knows %s)", self.path, quoted_list(M.model_types)))
  end
  local F = FAMILY[family]
  if type(family) ~= "string" or F == nil then self:bad("model_type", family, quoted_list(M.model_types)) end
  local arch = self.hc.architectures
  if is_null(arch) then return family, F end
  if not json.is_array(arch) then self:bad("architectures", arch, "a list of class names") end
  for i, name in ipairs(arch) do
    local fits = false
    for _, a in ipairs(F.architectures) do fits = fits or name == a end
    if not fits then
      raise(string.format("hf: %s: architectures[%d] = %s does not fit model_type = %s (a %s config names %s)",
        self.path, i, show(name), show(family), family, quoted_list(F.architectures)))
    end
  end
  return family, F
end

local function key_text(k) return (type(k) == "string" and k:find("^[%w_%-%.]+$")) and k or show(k) end

-- lutra's model config from a Hugging Face config table. opts: dtype, device, ignore_keys, path
-- (the file's name in errors; "config.json").
function M.config_from_hf(hc, opts)
  opts = opts or {}
  local path = opts.path or "config.json"
  if type(hc) ~= "table" or json.is_array(hc) then
    raise(string.format("hf: %s must hold a JSON object, got %s", path,
      json.is_array(hc) and "an array" or (is_null(hc) and "null" or type(hc))))
  end
  local R = setmetatable({hc = hc, path = path}, Reader)
  local family, F = R:family()
  local ignore = {}
  if type(opts.ignore_keys) == "table" then
    for _, k in ipairs(opts.ignore_keys) do ignore[k] = true end
  end
  local keys = {}
  for k in pairs(hc) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  for _, k in ipairs(keys) do
    if F.must[k] then
      local need = F.must[k](hc[k])
      if need then R:bad(k, hc[k], need) end
    elseif not (F.mapped[k] or F.harmless[k] or HARMLESS[k] or ignore[k]) then
      raise(string.format("hf: %s: unknown key '%s' for %s (lutra cannot tell whether it changes the "
        .. "model; pass ignore_keys = {\"%s\"} to load anyway)", path, key_text(k), family, key_text(k)))
    end
  end
  local cfg = {arch = family, dtype = opts.dtype or "f32", device = opts.device}
  local function prob(key, default) return R:num(key, default, 0, 1, "a probability in [0, 1)") end
  if family == "gpt2" then
    R:choice("activation_function", {"gelu_new", "gelu_pytorch_tanh"}, "\"gelu_new\" (GELU, tanh approximation)")
    cfg.n_layer, cfg.n_head = R:int("n_layer", 12), R:int("n_head", 12)
    cfg.d_model, cfg.vocab_size = R:int("n_embd", 768), R:int("vocab_size", 50257)
    cfg.block_size = R:int("n_positions", 1024)
    local n_ctx = R:int("n_ctx", cfg.block_size)
    if n_ctx ~= cfg.block_size then R:bad("n_ctx", n_ctx, "n_positions") end
    cfg.ffn_hidden = R:int("n_inner", 4 * cfg.d_model)
    cfg.norm_eps = R:num("layer_norm_epsilon", 1e-5, 0, nil, "a positive number", true)
    cfg.tie_embeddings = R:bool("tie_word_embeddings", true)
    -- lutra has one dropout (embeddings, attention and MLP outputs): resid_pdrop's
    cfg.dropout = prob("resid_pdrop", 0.1)
    prob("embd_pdrop")
    prob("attn_pdrop")
    cfg.bias = true
  else
    R:choice("hidden_act", {"silu"}, "\"silu\" (SwiGLU)")
    cfg.n_layer, cfg.n_head = R:int("num_hidden_layers", 32), R:int("num_attention_heads", 32)
    cfg.n_kv_head = R:int("num_key_value_heads", cfg.n_head)
    cfg.d_model, cfg.vocab_size = R:int("hidden_size", 4096), R:int("vocab_size", 32000)
    cfg.ffn_hidden = R:int("intermediate_size", 11008)
    cfg.block_size = R:int("max_position_embeddings", 2048)
    cfg.norm_eps = R:num("rms_norm_eps", 1e-6, 0, nil, "a positive number", true)
    cfg.rope_theta = R:num("rope_theta", 10000, 0, nil, "a positive number", true)
    cfg.tie_embeddings = R:bool("tie_word_embeddings", false)
    cfg.bias = R:bool("attention_bias", false)
    local mlp_bias = R:bool("mlp_bias", false)
    if mlp_bias ~= cfg.bias then R:bad("mlp_bias", mlp_bias, "the same as attention_bias (" .. tostring(cfg.bias) .. ")") end
    local head_dim = R:int("head_dim", false)
    if head_dim and head_dim * cfg.n_head ~= cfg.d_model then
      R:bad("head_dim", head_dim, string.format("hidden_size / num_attention_heads = %.6g", cfg.d_model / cfg.n_head))
    end
    cfg.dropout = 0
  end
  cfg.init_std = R:num("initializer_range", 0.02, 0, nil, "a number >= 0")
  return models.config(cfg, {where = "hf: " .. path, names = F.names}), family
end

local TORCH_DTYPE = {f32 = "float32", f64 = "float64", bf16 = "bfloat16", f16 = "float16"}

-- The Hugging Face family of a lutra config, or an error saying why none fits.
function M.family_of(cfg)
  if cfg.pos == "learned" and cfg.norm == "layernorm" and cfg.mlp == "gelu" then
    if not cfg.bias then raise("hf: a gpt2 model needs bias = true (GPT-2 has biases everywhere)") end
    if cfg.n_kv_head ~= cfg.n_head then raise("hf: a gpt2 model needs n_kv_head = n_head (no grouped-query attention)") end
    return "gpt2"
  elseif cfg.pos == "rope" and cfg.norm == "rmsnorm" and cfg.mlp == "swiglu" then
    return "llama"
  end
  raise(string.format("hf: no Hugging Face architecture has pos = %s, norm = %s, mlp = %s (gpt2: learned, layernorm, "
    .. "gelu; llama: rope, rmsnorm, swiglu)", tostring(cfg.pos), tostring(cfg.norm), tostring(cfg.mlp)))
end

local function special_ids(tok, hc)
  if not tok then return end
  local function first(list)
    for _, s in ipairs(list) do
      local id = tok:token_id(s)
      if id and tok:is_special(id) then return id end
    end
  end
  hc.bos_token_id = first {"<|begin_of_text|>", "<s>", "<|endoftext|>"}
  hc.eos_token_id = first {"<|end_of_text|>", "</s>", "<|endoftext|>"}
end

-- config.json's table for a lutra model config (dtype: the weights' dtype as saved).
function M.config_to_hf(cfg, tok, dtype)
  local family = M.family_of(cfg)
  local hc
  if family == "gpt2" then
    hc = {model_type = "gpt2", architectures = {"GPT2LMHeadModel"}, n_layer = cfg.n_layer, n_head = cfg.n_head,
          n_embd = cfg.d_model, n_positions = cfg.block_size, vocab_size = cfg.vocab_size,
          n_inner = cfg.ffn_hidden ~= 4 * cfg.d_model and cfg.ffn_hidden or null, activation_function = "gelu_new",
          layer_norm_epsilon = cfg.norm_eps, tie_word_embeddings = cfg.tie_embeddings, resid_pdrop = cfg.dropout,
          embd_pdrop = cfg.dropout, attn_pdrop = cfg.dropout, scale_attn_weights = true,
          scale_attn_by_inverse_layer_idx = false, reorder_and_upcast_attn = false}
  else
    hc = {model_type = "llama", architectures = {"LlamaForCausalLM"}, hidden_size = cfg.d_model,
          intermediate_size = cfg.ffn_hidden, num_hidden_layers = cfg.n_layer, num_attention_heads = cfg.n_head,
          num_key_value_heads = cfg.n_kv_head, max_position_embeddings = cfg.block_size, rms_norm_eps = cfg.norm_eps,
          rope_theta = cfg.rope_theta, vocab_size = cfg.vocab_size, tie_word_embeddings = cfg.tie_embeddings,
          attention_bias = cfg.bias, mlp_bias = cfg.bias, hidden_act = "silu", head_dim = cfg.d_model / cfg.n_head,
          rope_scaling = null, attention_dropout = 0, pretraining_tp = 1}
  end
  hc.initializer_range = cfg.init_std
  hc.torch_dtype = TORCH_DTYPE[dtype or cfg.dtype or "f32"] or "float32"
  hc.use_cache = true
  special_ids(tok, hc)
  return hc, family
end

-- ---- weights: one file or shards ------------------------------------------------------------

local INDEX = "model.safetensors.index.json"

-- {hf name = file path} of dir's weights: model.safetensors, or the files its sharded index names.
function M.weight_files(dir)
  local single = dir .. "/model.safetensors"
  if exists(single) then
    local out = {}
    for _, name in ipairs(st.read_header(single).names) do out[name] = single end
    return out
  end
  local index_path = dir .. "/" .. INDEX
  if not exists(index_path) then raise("hf: " .. dir .. " has neither model.safetensors nor " .. INDEX) end
  local index = json.read_file(index_path)
  if type(index) ~= "table" or type(index.weight_map) ~= "table" then
    raise("hf: " .. index_path .. ": weight_map is missing or not an object")
  end
  local out = {}
  for name, file in pairs(index.weight_map) do
    if type(file) ~= "string" or file:find("/", 1, true) or file:find("\\", 1, true) or file == ".." or file == "" then
      raise("hf: " .. index_path .. ": weight_map['" .. name .. "'] = " .. show(file) .. " is not a file name in " .. dir)
    end
    out[name] = dir .. "/" .. file
  end
  return out
end

-- Opens every file once; returns {path = reader} and {hf name = header entry}. A name the
-- index puts in a file that does not hold it is an error.
local function open_weights(files)
  local readers, entries = {}, {}
  local ok, err = pcall(function()
    for name, path in pairs(files) do
      if not readers[path] then readers[path] = st.open(path) end
      local e = readers[path].tensors[name]
      if e == nil then raise("hf: " .. path .. " does not hold " .. name .. " (as " .. INDEX .. " says)") end
      entries[name] = e
    end
  end)
  if not ok then
    for _, r in pairs(readers) do r:close() end
    error(err, 0)
  end
  return readers, entries
end

-- {hf name = tensor} from dir's model.safetensors or its sharded index (CPU, stored dtypes).
function M.read_weights(dir)
  local files = M.weight_files(dir)
  local readers = open_weights(files)
  local out = {}
  for name, path in pairs(files) do out[name] = readers[path]:load(name) end
  for _, r in pairs(readers) do r:close() end
  return out
end

-- Reads dir's weights into model one tensor at a time (straight into the parameter when the
-- dtypes match and no transpose is needed), after checking every name and shape; each one's
-- dtype and values as lutra.ckpt.weight_checks says (opts.allow_cast, opts.allow_nonfinite).
function M.load_weights(model, dir, opts)
  local cfg = model.cfg
  local family = M.family_of(cfg)
  local files = M.weight_files(dir)
  local readers, entries = open_weights(files)
  local ok, err = pcall(function()
    local plan = W.plan(cfg, entries, family, dir)
    local sd = model:state_dict()
    grad.no_grad(function()
      for _, p in ipairs(plan) do
        local e, key = p.entry, p.key
        local dst, r = sd[e.lt], readers[files[key]]
        local where = string.format("hf: %s: tensor '%s'", files[key], key)
        wc.dtype(r.tensors[key].dtype, dst.dtype, where, opts)
        if not e.rows and not e.t and r.tensors[key].dtype == dst.dtype and fields.is_cpu(dst) and dst:is_contiguous() then
          r:load(key, dst)
          wc.finite(dst, where, opts)
        else
          local t = r:load(key)
          wc.finite(t, where, opts)
          if e.rows then dst = dst:narrow(0, e.rows[1], e.rows[2]) end
          dst:copy_(e.t and t:t() or t)
          t:free()
        end
      end
    end)
  end)
  for _, r in pairs(readers) do r:close() end
  if not ok then error(err, 0) end
  return model
end

-- Writes {name = tensor} as model.safetensors, or as shards of at most max_shard_size bytes
-- (a tensor larger than that gets a shard of its own) with the index. Stale files of an
-- earlier save in the other layout are removed.
function M.write_weights(dir, tensors, max_shard_size)
  local names = {}
  for name in pairs(tensors) do names[#names + 1] = name end
  table.sort(names)
  local old_index = dir .. "/" .. INDEX
  if exists(old_index) then
    local ok, index = pcall(json.read_file, old_index)
    if ok and type(index) == "table" and type(index.weight_map) == "table" then
      for _, file in pairs(index.weight_map) do
        if type(file) == "string" and not file:find("/", 1, true) then os.remove(dir .. "/" .. file) end
      end
    end
    os.remove(old_index)
  end
  local meta = {format = "pt"}
  if not max_shard_size then -- replaced by a rename (lt_st_save): never removed first
    st.save(dir .. "/model.safetensors", tensors, meta)
    return {"model.safetensors"}
  end
  local shards, cur, cur_bytes, total = {}, nil, 0, 0
  for _, name in ipairs(names) do
    local t = tensors[name]
    local bytes = t:numel() * t:element_size()
    if cur == nil or (cur_bytes > 0 and cur_bytes + bytes > max_shard_size) then
      cur, cur_bytes = {}, 0
      shards[#shards + 1] = cur
    end
    cur[name] = t
    cur_bytes, total = cur_bytes + bytes, total + bytes
  end
  local weight_map, files = {}, {}
  for k, shard in ipairs(shards) do
    local file = string.format("model-%05d-of-%05d.safetensors", k, #shards)
    st.save(dir .. "/" .. file, shard, meta)
    for name in pairs(shard) do weight_map[name] = file end
    files[k] = file
  end
  os.remove(dir .. "/model.safetensors")
  json.write_file(old_index, {metadata = {total_size = total}, weight_map = weight_map}, {indent = 2})
  return files
end

-- ---- directories ----------------------------------------------------------------------------

-- load_pretrained(dir, {dtype = "f32", device =, ignore_keys =, allow_cast =, allow_nonfinite =}) -> model, tokenizer (or nil), cfg, hf config
function M.load_pretrained(dir, opts)
  opts = opts or {}
  if type(dir) ~= "string" then raise("hf.load_pretrained: expected a directory, got " .. type(dir)) end
  local config_path = dir .. "/config.json"
  if not exists(config_path) then raise("hf.load_pretrained: " .. config_path .. " not found") end
  local hc = json.read_file(config_path)
  local cfg = M.config_from_hf(hc, {dtype = opts.dtype, device = opts.device, ignore_keys = opts.ignore_keys,
                                    path = config_path})
  local model = models.build(cfg)
  M.load_weights(model, dir, opts)
  local tok
  if exists(dir .. "/tokenizer.json") then
    tok = require("lutra.tokenizer").load(dir .. "/tokenizer.json")
    if tok.vocab_size > cfg.vocab_size then
      raise(string.format("hf.load_pretrained: %s/tokenizer.json has %d tokens, more than vocab_size %d", dir,
        tok.vocab_size, cfg.vocab_size))
    end
  end
  return model, tok, cfg, hc
end

-- save_pretrained(dir, model, tok, {dtype =, max_shard_size =}) -> dir
function M.save_pretrained(dir, model, tok, opts)
  opts = opts or {}
  if type(dir) ~= "string" then raise("hf.save_pretrained: expected a directory, got " .. type(dir)) end
  local cfg = model and model.cfg
  if type(cfg) ~= "table" or cfg.pos == nil then raise("hf.save_pretrained: expected a lutra.models model") end
  local hc, family = M.config_to_hf(cfg, tok, opts.dtype)
  local r = os.execute("mkdir -p " .. sh_quote(dir))
  if r ~= 0 and r ~= true then raise("hf.save_pretrained: cannot create " .. dir) end
  local tensors = W.to_hf(cfg, model:state_dict(), family)
  if opts.dtype then
    for name, t in pairs(tensors) do tensors[name] = t:to(opts.dtype) end
  end
  M.write_weights(dir, tensors, opts.max_shard_size)
  json.write_file(dir .. "/config.json", hc, {indent = 2})
  if tok then tok:save(dir .. "/tokenizer.json") end
  return dir
end

return M
