-- lutra.hf.config — config.json of a Hugging Face model (transformers 4.x and 5.x) to lutra's
-- model config and back, for the families of lutra.hf.families (gpt2, llama, qwen2, qwen3,
-- mistral; the mixture-of-experts mixtral, qwen2_moe, qwen3_moe).
--
--   C.from_hf(hc, {path =, dtype =, device =, ignore_keys =}) -> lutra config, family
--   C.to_hf(cfg, tok, dtype)                                -> config.json's table, family
--   C.family_of(cfg)                                        -> the family lutra saves cfg as
--
-- Every key is honoured, refused by name, or harmless (it does not change the computation:
-- token ids, generation settings, dtype / torch_dtype, ...). An unknown key is refused unless the
-- user lists it (--ignore-key=KEY on the command line, ignore_keys in Lua); a key that changes
-- the math is read (RoPE: rope_theta and rope_scaling of 4.x, rope_parameters of 5.x; sliding
-- windows), and what lutra cannot compute is refused with a message saying --ignore-key cannot
-- drop it. Every key lutra reads is typed (a string "16" is never converted) and errors name the
-- file and the key.
local errors = require "lutra.errors"
local json = require "lutra.json"
local models = require "lutra.models"
local Fam = require "lutra.hf.families"
local rope = require "lutra.models.rope"

local raise = errors.raise
local null = json.null

local M = {}

local is_null = json.is_null
local function show(v) return json.show(v) end
M.show = show

local MAX_SIZE = 2 ^ 31 - 1
-- what refusals of a key that changes the math add
local NOT_DROPPABLE = " (it changes the model's computation, so --ignore-key cannot drop it)"

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

-- The family of a config: its model_type, checked against architectures.
function Reader:family()
  local family = self.hc.model_type
  local known = Fam.quoted_list(Fam.model_types)
  if is_null(family) then raise(string.format("hf: %s: model_type is missing (lutra knows %s)", self.path, known)) end
  local F = Fam.FAMILY[family]
  if type(family) ~= "string" or F == nil then self:bad("model_type", family, known) end
  local arch = self.hc.architectures
  if is_null(arch) then return family, F end
  if not json.is_array(arch) then self:bad("architectures", arch, "a list of class names") end
  for i, name in ipairs(arch) do
    local fits = false
    for _, a in ipairs(F.architectures) do fits = fits or name == a end
    if not fits then
      raise(string.format("hf: %s: architectures[%d] = %s does not fit model_type = %s (a %s config names %s)",
        self.path, i, show(name), show(family), family, Fam.quoted_list(F.architectures)))
    end
  end
  return family, F
end

local function key_text(k) return (type(k) == "string" and k:find("^[%w_%-%.]+$")) and k or show(k) end

-- ---- RoPE: rope_theta / rope_scaling (4.x), rope_parameters (5.x) --------------------------------

-- The fields transformers reads for each rope_type (beside rope_type, type and rope_theta).
local ROPE_FIELDS = {
  default = {},
  linear = {factor = "number"},
  dynamic = {factor = "number", original_max_position_embeddings = "int"},
  llama3 = {factor = "number", low_freq_factor = "number", high_freq_factor = "number",
            original_max_position_embeddings = "int"},
  yarn = {factor = "number", original_max_position_embeddings = "int", attention_factor = "number",
          beta_fast = "number", beta_slow = "number", mscale = "number", mscale_all_dim = "number", truncate = "bool"},
  longrope = {short_factor = "list", long_factor = "list", factor = "number", attention_factor = "number",
              original_max_position_embeddings = "int"},
}
local ROPE_TYPES = {"default", "linear", "dynamic", "llama3", "yarn", "longrope"}

-- theta and lutra's rope_scaling (nil for default) of a RoPE family's config, as transformers 5.25
-- resolves them: rope_scaling (4.x) or rope_parameters (5.x), rope_theta inside it or beside it
-- (default 10000), rope_type or its old name type (default "default"); the pretraining length of
-- llama3 / yarn / longrope from the dict, else a top-level original_max_position_embeddings, else
-- max_position_embeddings.
function Reader:rope(block_size, default_theta)
  local hc = self.hc
  local key = "rope_parameters"
  local rp = hc.rope_parameters
  if not is_null(hc.rope_scaling) then
    if not is_null(rp) and type(rp) == "table" and next(rp) ~= nil then
      raise(string.format("hf: %s: rope_scaling (transformers 4.x) and rope_parameters (5.x) are both set: give one "
        .. "of them%s", self.path, NOT_DROPPABLE))
    end
    key, rp = "rope_scaling", hc.rope_scaling
  end
  if is_null(rp) then rp = {} end
  if type(rp) ~= "table" or json.is_array(rp) then
    self:bad(key, rp, "an object {rope_type =, rope_theta =, ...} or null" .. NOT_DROPPABLE)
  end
  local function bad_field(field, v, what)
    raise(string.format("hf: %s: %s.%s = %s: lutra needs %s%s", self.path, key, field, show(v), what, NOT_DROPPABLE))
  end
  local theta = self:num("rope_theta", default_theta or 10000, 0, nil, "a positive number", true)
  if not is_null(rp.rope_theta) then
    local v = rp.rope_theta
    if type(v) ~= "number" or not (v > 0 and v < math.huge) then bad_field("rope_theta", v, "a positive number") end
    theta = v
  end
  local kind = rp.rope_type
  if is_null(kind) then kind = rp.type end
  if is_null(kind) then kind = "default" end
  local fields = ROPE_FIELDS[kind]
  if fields == nil then
    bad_field(is_null(rp.rope_type) and "type" or "rope_type", kind,
      Fam.quoted_list(ROPE_TYPES) .. " (the RoPE scalings lutra computes)")
  end
  local partial = rp.partial_rotary_factor
  if is_null(partial) then partial = hc.partial_rotary_factor end
  if not is_null(partial) and partial ~= 1 then
    bad_field("partial_rotary_factor", partial, "1 (lutra rotates the whole head)")
  end
  local out = {rope_type = kind}
  local keys = {}
  for k in pairs(rp) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local v, want = rp[k], fields[k]
    if k == "rope_type" or k == "type" or k == "rope_theta" or k == "partial_rotary_factor" then
      if (k == "rope_type" or k == "type") and type(v) ~= "string" and not is_null(v) then
        bad_field(k, v, "a string")
      end
    elseif want == nil then
      raise(string.format("hf: %s: %s.%s: rope_type %s has no field %s (transformers would not read it; lutra "
        .. "refuses what it cannot place)%s", self.path, key, k, show(kind), k, NOT_DROPPABLE))
    elseif not is_null(v) then
      if want == "int" and (type(v) ~= "number" or v ~= math.floor(v) or v < 1 or v > MAX_SIZE) then
        bad_field(k, v, "a positive integer")
      elseif want == "number" and (type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge) then
        bad_field(k, v, "a number")
      elseif want == "bool" and type(v) ~= "boolean" then
        bad_field(k, v, "true or false")
      elseif want == "list" and not json.is_array(v) then
        bad_field(k, v, "a list of numbers")
      end
      out[k] = v
    end
  end
  if kind == "default" then return theta, nil end
  if kind == "dynamic" then
    -- transformers' dynamic NTK scales past max_position_embeddings (the dict's own length unused)
    out.original_max_position_embeddings = block_size
  elseif kind == "llama3" or kind == "yarn" or kind == "longrope" then
    local top = hc.original_max_position_embeddings
    if not is_null(top) then
      out.original_max_position_embeddings = self:int("original_max_position_embeddings") -- Phi3's place: it wins
    elseif out.original_max_position_embeddings == nil then
      out.original_max_position_embeddings = block_size
    end
    if out.factor == nil and kind ~= "llama3" then
      out.factor = block_size / out.original_max_position_embeddings
    end
  end
  return theta, rope.check(out, string.format("hf: %s: %s", self.path, key), NOT_DROPPABLE)
end

-- ---- sliding windows ---------------------------------------------------------------------------

-- sliding_window and layer_types for lutra (nil, nil: every layer sees every earlier key).
-- mistral, mixtral: sliding_window (null: none) on every layer. qwen3_moe: sliding_window on
-- every layer when use_sliding_window is true. qwen2 / qwen3 / qwen2_moe: the window applies when
-- use_sliding_window is true, to the layers layer_types names "sliding_attention" (without
-- layer_types: qwen2, qwen3 layers max_window_layers and up; qwen2_moe the even layers
-- (0-based) below max_window_layers, as transformers derives them).
function Reader:windows(family, n_layer)
  local hc = self.hc
  if family == "mistral" or family == "mixtral" then
    return not is_null(hc.sliding_window) and self:int("sliding_window") or nil, nil
  end
  local use = self:bool("use_sliding_window", false)
  -- (qwen2_moe writes sliding_window = 0 when use_sliding_window is false)
  local window
  if use or family ~= "qwen2_moe" then window = not is_null(hc.sliding_window) and self:int("sliding_window") or nil end
  if family == "qwen3_moe" then return use and window or nil, nil end
  local max_window_layers = self:num("max_window_layers", nil, 0, nil, "an integer >= 0")
  if max_window_layers and max_window_layers ~= math.floor(max_window_layers) then
    self:bad("max_window_layers", max_window_layers, "an integer >= 0")
  end
  if not use then window = nil end
  local types = hc.layer_types
  local out, any = {}, false
  if is_null(types) then
    for i = 1, n_layer do
      local sliding = window ~= nil and (i - 1) >= (max_window_layers or 28)
      if family == "qwen2_moe" then sliding = window ~= nil and i % 2 == 1 and (i - 1) < (max_window_layers or 28) end
      out[i] = sliding and "sliding_attention" or "full_attention"
      any = any or sliding
    end
  else
    if not json.is_array(types) or #types ~= n_layer then
      self:bad("layer_types", types, string.format("a list of %d entries (num_hidden_layers)", n_layer) .. NOT_DROPPABLE)
    end
    for i, t in ipairs(types) do
      if t ~= "full_attention" and t ~= "sliding_attention" then
        raise(string.format("hf: %s: layer_types[%d] = %s: lutra needs \"full_attention\" or \"sliding_attention\"%s",
          self.path, i, show(t), NOT_DROPPABLE))
      end
      if t == "sliding_attention" and window == nil then
        raise(string.format("hf: %s: layer_types[%d] = \"sliding_attention\" but %s: lutra needs a window for it%s",
          self.path, i, use and "sliding_window is null" or "use_sliding_window is false", NOT_DROPPABLE))
      end
      out[i] = t
      any = any or t == "sliding_attention"
    end
  end
  if not any then return nil, nil end
  return window, out
end

-- ---- mixtures of experts ----------------------------------------------------------------------

-- The MoE keys of cfg (every layer an MoE layer, dropless, softmax over all experts then top-k).
-- Mixtral renormalises the top-k weights; the Qwen families when norm_topk_prob. qwen2_moe adds
-- one shared expert of shared_expert_intermediate_size behind a sigmoid gate. The balance loss:
-- transformers adds router_aux_loss_coef times its load_balancing_loss_func (over all layers'
-- routers together, top_k times lutra's per-layer balance_loss) when output_router_logits, so
-- aux_loss_coef = router_aux_loss_coef * top_k / n_layer then (the same when the layers route
-- alike), else 0.
function Reader:moe(family, cfg)
  local d = Fam.FAMILY[family].defaults
  local hc = self.hc
  -- (num_experts and num_local_experts are one attribute of mixtral's and qwen3_moe's configs;
  -- transformers 5 writes qwen3_moe's as num_local_experts, the Hub's files say num_experts)
  local main, alias = "num_experts", "num_local_experts"
  if family == "mixtral" then main, alias = alias, main end
  cfg.n_experts = self:int(main, d.num_experts or d.num_local_experts)
  if family ~= "qwen2_moe" and not is_null(hc[alias]) then
    local n = self:int(alias)
    if is_null(hc[main]) then
      cfg.n_experts = n
    elseif n ~= cfg.n_experts then
      self:bad(alias, n, string.format("%s's value %d (the same setting)", main, cfg.n_experts) .. NOT_DROPPABLE)
    end
  end
  cfg.top_k = self:int("num_experts_per_tok", d.num_experts_per_tok)
  if cfg.top_k > cfg.n_experts then
    self:bad("num_experts_per_tok", cfg.top_k, string.format("at most the %d experts", cfg.n_experts) .. NOT_DROPPABLE)
  end
  if family == "mixtral" then
    cfg.norm_topk_prob = true
  else
    cfg.norm_topk_prob = self:bool("norm_topk_prob", false)
    local step = self:int("decoder_sparse_step", 1)
    if step ~= 1 then
      self:bad("decoder_sparse_step", step, "1 (every layer an MoE layer; lutra has no stacks of MoE and dense "
        .. "layers)" .. NOT_DROPPABLE)
    end
    local dense = hc.mlp_only_layers
    if not is_null(dense) and not (type(dense) == "table" and next(dense) == nil) then
      self:bad("mlp_only_layers", dense, "[] (every layer an MoE layer; lutra has no stacks of MoE and dense layers)"
        .. NOT_DROPPABLE)
    end
    self:int("intermediate_size", d.intermediate_size) -- (the dense layers' width: none here)
  end
  if family == "qwen2_moe" then
    cfg.n_shared_experts, cfg.shared_expert_gate = 1, true
    cfg.shared_expert_hidden = self:int("shared_expert_intermediate_size", d.shared_expert_intermediate_size)
  end
  local coef = self:num("router_aux_loss_coef", d.router_aux_loss_coef, 0, nil, "a number >= 0")
  cfg.aux_loss_coef = self:bool("output_router_logits", false) and coef * cfg.top_k / cfg.n_layer or 0
end

-- ---- config.json -> lutra ------------------------------------------------------------------------

-- lutra's model config from a Hugging Face config table. opts: dtype, device, ignore_keys, path
-- (the file's name in errors; "config.json").
function M.from_hf(hc, opts)
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
  elseif type(opts.ignore_keys) == "string" then -- "KEY,KEY" (--ignore-key of generate, chat, the recipes)
    for k in opts.ignore_keys:gmatch("[^,%s]+") do ignore[k] = true end
  end
  local keys = {}
  for k in pairs(hc) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  for _, k in ipairs(keys) do
    if F.must[k] then
      local need = F.must[k](hc[k])
      if need then R:bad(k, hc[k], need .. NOT_DROPPABLE) end
    elseif not (F.mapped[k] or F.harmless[k] or Fam.HARMLESS[k] or ignore[k]) then
      raise(string.format("hf: %s: unknown key '%s' for %s (lutra cannot tell whether it changes the model; if "
        .. "it does not, pass --ignore-key=%s to load anyway; ignore_keys = {\"%s\"} in Lua)", path, key_text(k),
        family, key_text(k), key_text(k)))
    end
  end
  local cfg = {arch = family == "gpt2" and "gpt2" or (F.moe and "moe" or "llama"), dtype = opts.dtype or "f32",
               device = opts.device}
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
    local d = F.defaults
    R:choice("hidden_act", {"silu"}, "\"silu\" (SwiGLU)")
    cfg.n_layer, cfg.n_head = R:int("num_hidden_layers", d.num_hidden_layers), R:int("num_attention_heads", 32)
    cfg.n_kv_head = R:int("num_key_value_heads", d.num_key_value_heads or cfg.n_head)
    cfg.d_model, cfg.vocab_size = R:int("hidden_size", 4096), R:int("vocab_size", d.vocab_size)
    cfg.ffn_hidden = R:int("intermediate_size", d.intermediate_size)
    if F.moe and family ~= "mixtral" then cfg.ffn_hidden = R:int("moe_intermediate_size", d.moe_intermediate_size) end
    cfg.block_size = R:int("max_position_embeddings", d.max_position_embeddings)
    cfg.norm_eps = R:num("rms_norm_eps", 1e-6, 0, nil, "a positive number", true)
    cfg.tie_embeddings = R:bool("tie_word_embeddings", false)
    local theta, scaling = R:rope(cfg.block_size, d.rope_theta)
    cfg.rope_theta, cfg.rope_scaling = theta, scaling
    if family == "qwen2" then
      cfg.bias, cfg.qkv_bias = false, true
    elseif family == "qwen2_moe" then
      cfg.bias, cfg.qkv_bias = false, R:bool("qkv_bias", true)
    elseif family == "mistral" or family == "mixtral" then
      cfg.bias = false
    else
      cfg.bias = R:bool("attention_bias", false)
      if family == "llama" then
        local mlp_bias = R:bool("mlp_bias", false)
        if mlp_bias ~= cfg.bias then cfg.mlp_bias = mlp_bias end
      end
    end
    local head_dim = R:int("head_dim", d.head_dim or false)
    if head_dim and head_dim * cfg.n_head ~= cfg.d_model then cfg.head_dim = head_dim end
    if not head_dim and cfg.d_model % cfg.n_head ~= 0 then
      raise(string.format("hf: %s: hidden_size %d is not a multiple of num_attention_heads %d (and head_dim is not "
        .. "given)", path, cfg.d_model, cfg.n_head))
    end
    if family == "qwen3" or family == "qwen3_moe" then cfg.qk_norm = true end
    if family ~= "llama" and cfg.bias then cfg.mlp_bias = false end -- (qwen3's attention_bias: q, k, v, o only)
    if family ~= "llama" then cfg.sliding_window, cfg.layer_types = R:windows(family, cfg.n_layer) end
    if F.moe then R:moe(family, cfg) end
    cfg.dropout = 0
  end
  cfg.init_std = R:num("initializer_range", 0.02, 0, nil, "a number >= 0")
  return models.config(cfg, {where = "hf: " .. path, names = F.names}), family
end

-- ---- lutra -> config.json ------------------------------------------------------------------------

M.family_of = Fam.family_of

local TORCH_DTYPE = {f32 = "float32", f64 = "float64", bf16 = "bfloat16", f16 = "float16"}

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

-- The MoE keys of config.json (Reader:moe's inverse).
function M.moe_to_hf(cfg, hc, family, qkv_bias)
  hc.num_experts_per_tok = cfg.top_k
  hc.output_router_logits = (cfg.aux_loss_coef or 0) > 0
  hc.router_aux_loss_coef = hc.output_router_logits and cfg.aux_loss_coef * cfg.n_layer / cfg.top_k or 0.001
  if family == "mixtral" then
    hc.num_local_experts = cfg.n_experts -- (router_jitter_noise left to its default 0.0: transformers wants a float)
    return
  end
  hc.num_experts, hc.moe_intermediate_size, hc.norm_topk_prob = cfg.n_experts, cfg.ffn_hidden, cfg.norm_topk_prob
  hc.decoder_sparse_step, hc.mlp_only_layers = 1, json.array {}
  if family == "qwen2_moe" then
    hc.qkv_bias = qkv_bias
    hc.shared_expert_intermediate_size = cfg.shared_expert_hidden or cfg.n_shared_experts * cfg.ffn_hidden
  end
end

-- config.json's table for a lutra model config (dtype: the weights' dtype as saved). RoPE goes
-- in the form both transformers 4.x and 5.x read: rope_theta and rope_scaling (5.x turns them
-- into rope_parameters).
function M.to_hf(cfg, tok, dtype)
  local family = Fam.family_of(cfg)
  local hc
  if family == "gpt2" then
    hc = {model_type = "gpt2", architectures = {"GPT2LMHeadModel"}, n_layer = cfg.n_layer, n_head = cfg.n_head,
          n_embd = cfg.d_model, n_positions = cfg.block_size, vocab_size = cfg.vocab_size,
          n_inner = cfg.ffn_hidden ~= 4 * cfg.d_model and cfg.ffn_hidden or null, activation_function = "gelu_new",
          layer_norm_epsilon = cfg.norm_eps, tie_word_embeddings = cfg.tie_embeddings, resid_pdrop = cfg.dropout,
          embd_pdrop = cfg.dropout, attn_pdrop = cfg.dropout, scale_attn_weights = true,
          scale_attn_by_inverse_layer_idx = false, reorder_and_upcast_attn = false}
  else
    local qkv_bias, out_bias, mlp_bias = models.biases(cfg)
    hc = {model_type = family, architectures = {Fam.FAMILY[family].architectures[1]}, hidden_size = cfg.d_model,
          intermediate_size = cfg.ffn_hidden, num_hidden_layers = cfg.n_layer, num_attention_heads = cfg.n_head,
          num_key_value_heads = cfg.n_kv_head, max_position_embeddings = cfg.block_size, rms_norm_eps = cfg.norm_eps,
          rope_theta = cfg.rope_theta, vocab_size = cfg.vocab_size, tie_word_embeddings = cfg.tie_embeddings,
          hidden_act = "silu", head_dim = cfg.head_dim or cfg.d_model / cfg.n_head, attention_dropout = 0}
    local scaling = null
    if cfg.rope_scaling then
      scaling = {}
      for k, v in pairs(cfg.rope_scaling) do scaling[k] = v end
      if scaling.rope_type == "dynamic" then scaling.original_max_position_embeddings = nil end
    end
    hc.rope_scaling = scaling
    if family == "llama" then
      hc.attention_bias, hc.mlp_bias, hc.pretraining_tp = qkv_bias, mlp_bias, 1
    elseif family == "qwen3" or family == "qwen3_moe" then
      hc.attention_bias = qkv_bias
    end
    if family == "mistral" or family == "mixtral" then
      hc.sliding_window = cfg.sliding_window or null
    elseif family == "qwen3_moe" then -- (every layer: lutra.hf.families refuses others)
      hc.use_sliding_window = cfg.sliding_window ~= nil
      hc.sliding_window = cfg.sliding_window or null
    elseif family == "qwen2" or family == "qwen3" or family == "qwen2_moe" then
      hc.use_sliding_window = cfg.sliding_window ~= nil
      hc.sliding_window = cfg.sliding_window or null
      hc.max_window_layers = cfg.n_layer
      local types = {}
      for i = 1, cfg.n_layer do types[i] = cfg.layer_types and cfg.layer_types[i] or "full_attention" end
      if cfg.sliding_window and cfg.layer_types == nil then
        for i = 1, cfg.n_layer do types[i] = "sliding_attention" end
      end
      hc.layer_types = types
    end
    if cfg.n_experts then M.moe_to_hf(cfg, hc, family, qkv_bias) end
  end
  hc.initializer_range = cfg.init_std
  hc.torch_dtype = TORCH_DTYPE[dtype or cfg.dtype or "f32"] or "float32"
  hc.use_cache = true
  special_ids(tok, hc)
  return hc, family
end

return M
