-- lutra.hf.families — the Hugging Face model families lutra reads and writes, and what each one's
-- config.json may hold:
--   gpt2     GPT2LMHeadModel: learned positions, LayerNorm, GELU MLP, biases everywhere
--   llama    LlamaForCausalLM (SmolLM2 too): RoPE (with its scalings), RMSNorm, SwiGLU;
--            attention_bias (q, k, v, o), mlp_bias, head_dim independent of hidden_size
--   qwen2    Qwen2ForCausalLM: llama with biases on q, k, v only; sliding windows per layer
--   qwen3    Qwen3ForCausalLM: llama with an RMSNorm per query / key head (q_norm, k_norm) before
--            RoPE; attention_bias; sliding windows per layer
--   mistral  MistralForCausalLM: llama without biases, a sliding window on every layer
--   mixtral  MixtralForCausalLM: mistral with a sparse mixture of SwiGLU experts for each MLP
--            (softmax over the experts, top-k renormalised)
--   qwen2_moe  Qwen2MoeForCausalLM: qwen2 with experts, norm_topk_prob, and a shared expert of its
--            own width whose output a sigmoid gate scales
--   qwen3_moe  Qwen3MoeForCausalLM: qwen3 with experts, norm_topk_prob, no shared expert
--   (every layer an MoE layer: decoder_sparse_step 1, no mlp_only_layers; lutra has no mixed stacks)
--
--   Fam.FAMILY[model_type]  {architectures, mapped (keys lutra reads), harmless, must (key ->
--                            function(value) -> what lutra needs, or nil), names (lutra key -> the
--                            file's), defaults (transformers' config defaults lutra relies on),
--                            moe (true: a mixture-of-experts family)}
--   Fam.family_of(cfg)      the family a lutra model config is saved as, or an error saying why none fits
local errors = require "lutra.errors"
local json = require "lutra.json"

local raise = errors.raise
local null = json.null

local M = {}

local is_null = json.is_null
local function show(v) return json.show(v, math.huge) end

function M.quoted_list(list)
  local out = {}
  for i, s in ipairs(list) do out[i] = show(s) end
  if #out <= 1 then return out[1] or "" end
  return table.concat(out, ", ", 1, #out - 1) .. " or " .. out[#out]
end

-- Keys of every PretrainedConfig that do not change the model's computation (dtype is
-- transformers 5's name for torch_dtype: the weights' dtype, which lutra's dtype option decides).
M.HARMLESS = {}
for k in ([[architectures torch_dtype dtype transformers_version _name_or_path name_or_path bos_token_id eos_token_id
  pad_token_id sep_token_id decoder_start_token_id use_cache initializer_range return_dict output_hidden_states
  output_attentions torchscript use_bfloat16 tf_legacy_loss is_decoder tie_encoder_decoder max_length min_length
  do_sample early_stopping num_beams num_beam_groups diversity_penalty temperature top_k top_p typical_p
  repetition_penalty length_penalty no_repeat_ngram_size encoder_no_repeat_ngram_size bad_words_ids
  num_return_sequences output_scores return_dict_in_generate forced_bos_token_id forced_eos_token_id
  remove_invalid_values exponential_decay_length_penalty suppress_tokens begin_suppress_tokens finetuning_task
  id2label label2id tokenizer_class prefix problem_type task_specific_params gradient_checkpointing
  chunk_size_feed_forward cross_attention_hidden_size model_type]]):gmatch("%S+") do
  M.HARMLESS[k] = true
end

local function must_be(want, what)
  return function(v) if v ~= want then return what end end
end
local function empty_or_null(v) return is_null(v) or (type(v) == "table" and next(v) == nil) end
local function no_pruned_heads(v) if not empty_or_null(v) then return "{} (no pruned heads)" end end

local function set(words)
  local out = {}
  for k in words:gmatch("%S+") do out[k] = true end
  return out
end

-- The keys every RoPE family reads (rope_scaling and rope_theta: transformers 4.x; rope_parameters:
-- 5.x; original_max_position_embeddings and partial_rotary_factor beside them, as Phi3 writes them).
local ROPE_KEYS = [[num_hidden_layers num_attention_heads num_key_value_heads hidden_size intermediate_size
  max_position_embeddings vocab_size rms_norm_eps rope_theta rope_scaling rope_parameters tie_word_embeddings
  hidden_act head_dim initializer_range original_max_position_embeddings partial_rotary_factor]]

local function rope_family(architectures, extra, harmless, defaults)
  return {
    architectures = architectures,
    mapped = set(ROPE_KEYS .. " " .. extra),
    harmless = harmless or {},
    must = {
      attention_dropout = must_be(0, "0 (lutra has no dropout on attention weights)"),
      is_encoder_decoder = must_be(false, "false"),
      pruned_heads = no_pruned_heads,
    },
    names = {n_experts = "num_experts", top_k = "num_experts_per_tok", ffn_hidden = "intermediate_size",
             norm_topk_prob = "norm_topk_prob", shared_expert_hidden = "shared_expert_intermediate_size",
             n_layer = "num_hidden_layers", n_head = "num_attention_heads", n_kv_head = "num_key_value_heads",
             d_model = "hidden_size", vocab_size = "vocab_size", block_size = "max_position_embeddings",
             head_dim = "head_dim", rope_scaling = "rope_parameters",
             sliding_window = "sliding_window", layer_types = "layer_types"},
    defaults = defaults,
  }
end

M.FAMILY = {
  gpt2 = {
    architectures = {"GPT2LMHeadModel", "GPT2Model"},
    mapped = set [[n_layer n_head n_embd n_positions vocab_size n_inner layer_norm_epsilon tie_word_embeddings
                   resid_pdrop embd_pdrop attn_pdrop activation_function n_ctx initializer_range]],
    harmless = set [[summary_type summary_use_proj summary_activation summary_proj_to_labels summary_first_dropout
                     reorder_and_upcast_attn]],
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
  -- pretraining_tp only splits the matmuls (the same math)
  llama = rope_family({"LlamaForCausalLM", "LlamaModel"}, "attention_bias mlp_bias", {pretraining_tp = true},
    {num_hidden_layers = 32, vocab_size = 32000, intermediate_size = 11008, max_position_embeddings = 2048}),
  qwen2 = rope_family({"Qwen2ForCausalLM", "Qwen2Model"}, "use_sliding_window sliding_window max_window_layers layer_types",
    nil, {num_hidden_layers = 32, vocab_size = 151936, intermediate_size = 22016, max_position_embeddings = 32768}),
  qwen3 = rope_family({"Qwen3ForCausalLM", "Qwen3Model"},
    "attention_bias use_sliding_window sliding_window max_window_layers layer_types", nil,
    {num_hidden_layers = 32, vocab_size = 151936, intermediate_size = 22016, max_position_embeddings = 32768,
     head_dim = 128}),
  mistral = rope_family({"MistralForCausalLM", "MistralModel"}, "sliding_window", nil,
    {num_hidden_layers = 32, num_key_value_heads = 8, vocab_size = 32000, intermediate_size = 14336,
     max_position_embeddings = 131072}),
}
-- the mixture-of-experts families: what routing and router training read (output_router_logits:
-- whether transformers adds the balance loss to the training loss)
local MOE_KEYS = "num_experts_per_tok router_aux_loss_coef output_router_logits"
local SPARSE_EVERY_LAYER = "decoder_sparse_step mlp_only_layers moe_intermediate_size num_experts norm_topk_prob"
local no_jitter = must_be(0, "0 (lutra's router has no jitter noise)")
M.FAMILY.mixtral = rope_family({"MixtralForCausalLM", "MixtralModel"},
  "sliding_window num_local_experts num_experts " .. MOE_KEYS,
  nil, {num_hidden_layers = 32, num_key_value_heads = 8, vocab_size = 32000, intermediate_size = 14336,
        max_position_embeddings = 131072, num_local_experts = 8, num_experts_per_tok = 2,
        router_aux_loss_coef = 0.001, rope_theta = 1e6})
M.FAMILY.mixtral.must.router_jitter_noise = no_jitter
M.FAMILY.mixtral.names.n_experts = "num_local_experts"
M.FAMILY.qwen2_moe = rope_family({"Qwen2MoeForCausalLM", "Qwen2MoeModel"},
  "use_sliding_window sliding_window max_window_layers layer_types qkv_bias shared_expert_intermediate_size "
  .. SPARSE_EVERY_LAYER .. " " .. MOE_KEYS, nil,
  {num_hidden_layers = 24, vocab_size = 151936, intermediate_size = 5632, max_position_embeddings = 32768,
   num_experts = 60, num_experts_per_tok = 4, moe_intermediate_size = 1408, shared_expert_intermediate_size = 5632,
   norm_topk_prob = false, router_aux_loss_coef = 0.001})
M.FAMILY.qwen3_moe = rope_family({"Qwen3MoeForCausalLM", "Qwen3MoeModel"},
  "attention_bias use_sliding_window sliding_window max_window_layers layer_types num_local_experts "
  .. SPARSE_EVERY_LAYER .. " "
  .. MOE_KEYS, nil,
  {num_hidden_layers = 24, vocab_size = 151936, intermediate_size = 6144, max_position_embeddings = 32768,
   head_dim = 128, num_experts = 128, num_experts_per_tok = 8, moe_intermediate_size = 768, norm_topk_prob = false,
   router_aux_loss_coef = 0.001})
for _, f in ipairs {"qwen2_moe", "qwen3_moe"} do M.FAMILY[f].names.ffn_hidden = "moe_intermediate_size" end
for _, f in ipairs {"mixtral", "qwen2_moe", "qwen3_moe"} do M.FAMILY[f].moe = true end
M.model_types = {"gpt2", "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"}

-- The family of a lutra MoE config: qwen3_moe (qk_norm), qwen2_moe (a gated shared expert),
-- mixtral (neither, top-k renormalised); what none of them computes is refused.
local function moe_family_of(cfg)
  local function no(why) raise("hf: this mixture-of-experts model has no Hugging Face form: " .. why) end
  if not (cfg.pos == "rope" and cfg.norm == "rmsnorm" and cfg.mlp == "swiglu") then
    no("mixtral, qwen2_moe and qwen3_moe have pos = \"rope\", norm = \"rmsnorm\", mlp = \"swiglu\" (SwiGLU experts)")
  end
  if cfg.capacity_factor ~= nil then no("capacity_factor drops tokens; Hugging Face's MoE blocks are dropless") end
  local function pick(v) if v == nil then return cfg.bias end return v end
  local qkv, out, mlp = pick(cfg.qkv_bias), pick(cfg.out_bias), pick(cfg.mlp_bias)
  local shared = (cfg.n_shared_experts or 0) > 0
  if mlp then no("mlp_bias: the experts have no biases") end
  if shared and not cfg.shared_expert_gate then
    no("shared experts without shared_expert_gate (qwen2_moe's shared expert has a sigmoid gate)")
  end
  if cfg.qk_norm then
    if shared then no("qwen3_moe (qk_norm) has no shared expert") end
    if qkv ~= out then no("qwen3_moe (qk_norm) has one bias setting for q, k, v and o (attention_bias)") end
    if cfg.layer_types ~= nil then
      for _, t in ipairs(cfg.layer_types) do
        if t ~= "sliding_attention" then no("qwen3_moe's sliding window is on every layer") end
      end
    end
    return "qwen3_moe"
  elseif shared then
    if out then no("qwen2_moe has biases on q, k, v only (out_bias)") end
    return "qwen2_moe"
  end
  if qkv or out then no("mixtral has no attention biases (qwen2_moe's need a gated shared expert)") end
  if cfg.norm_topk_prob == false then
    no("norm_topk_prob = false needs qwen2_moe (a gated shared expert) or qwen3_moe (qk_norm); mixtral renormalises")
  end
  if cfg.sliding_window ~= nil and cfg.layer_types ~= nil then
    for _, t in ipairs(cfg.layer_types) do
      if t ~= "sliding_attention" then no("mixtral's sliding window is on every layer") end
    end
  end
  return "mixtral"
end

-- The family of a lutra config, or an error saying why none fits.
function M.family_of(cfg)
  if cfg.n_experts ~= nil then return moe_family_of(cfg) end
  if cfg.pos == "learned" and cfg.norm == "layernorm" and cfg.mlp == "gelu" then
    if not cfg.bias then raise("hf: a gpt2 model needs bias = true (GPT-2 has biases everywhere)") end
    if cfg.n_kv_head ~= cfg.n_head then raise("hf: a gpt2 model needs n_kv_head = n_head (no grouped-query attention)") end
    for _, k in ipairs {"head_dim", "qk_norm", "qkv_bias", "out_bias", "mlp_bias", "sliding_window", "rope_scaling"} do
      if cfg[k] ~= nil and cfg[k] ~= false and not (k:match("_bias$") and cfg[k] == true) then
        raise("hf: a gpt2 model has no " .. k .. " (GPT-2's config cannot say it)")
      end
    end
    return "gpt2"
  elseif not (cfg.pos == "rope" and cfg.norm == "rmsnorm" and cfg.mlp == "swiglu") then
    raise(string.format("hf: no Hugging Face architecture has pos = %s, norm = %s, mlp = %s (gpt2: learned, layernorm, "
      .. "gelu; llama, qwen2, qwen3, mistral: rope, rmsnorm, swiglu)", tostring(cfg.pos), tostring(cfg.norm),
      tostring(cfg.mlp)))
  end
  local function pick(v) if v == nil then return cfg.bias end return v end
  local qkv, out, mlp = pick(cfg.qkv_bias), pick(cfg.out_bias), pick(cfg.mlp_bias)
  local every_layer = cfg.sliding_window ~= nil and cfg.layer_types == nil
  if cfg.qk_norm then
    if qkv ~= out or mlp then
      raise("hf: a qwen3 model (qk_norm) needs qkv_bias = out_bias (attention_bias) and no mlp_bias")
    end
    return "qwen3"
  elseif qkv and not out and not mlp then
    return "qwen2"
  elseif cfg.sliding_window ~= nil then
    if every_layer and not (qkv or out or mlp) then return "mistral" end
    raise("hf: sliding windows need a model that qwen2 (biases on q, k, v only), qwen3 (qk_norm) or mistral (every "
      .. "layer, no biases) describes")
  end
  if qkv ~= out then
    raise("hf: a llama model has the same bias on q, k, v and o (attention_bias); qwen2 has it on q, k, v only")
  end
  return "llama"
end

return M
