-- lutra.models — the model zoo, built from config tables.
--
--   local models = require "lutra.models"
--   local model = models.build{arch = "llama", n_layer = 4, n_head = 4, n_kv_head = 2, d_model = 128,
--                              vocab_size = 4096, block_size = 256}
--   local logits, loss = model(idx, targets)        -- idx, targets (B, T) i64
--
-- Keys (each arch fills in the ones not given; lutra/models/gpt2.lua, llama.lua):
--   arch          "gpt2" | "llama" | "moe" (Llama's blocks with mixture-of-experts MLPs, as Mixtral)
--   n_layer, n_head, d_model, vocab_size, block_size   sizes (positive integers)
--   n_kv_head     key/value heads (divides n_head): GQA, or MQA with 1; default n_head
--   ffn_hidden    the MLP's hidden width (gpt2: 4 d_model; llama: 8/3 d_model rounded up to 32)
--   dropout       probability, on embeddings, attention and MLP outputs
--   bias          biases in linear layers and LayerNorms
--   norm_eps      the norms' epsilon
--   rope_theta    RoPE's base (used when pos = "rope")
--   rope_scaling  nil, or RoPE's frequency scaling as Hugging Face names it: {rope_type = "linear" |
--                 "dynamic" | "llama3" | "yarn" | "longrope", factor =, ...} (lutra/models/rope.lua)
--   head_dim      the width of one attention head (default d_model / n_head)
--   qk_norm       an RMSNorm over each query and key head before RoPE (Qwen3)
--   qkv_bias, out_bias, mlp_bias   biases of the q/k/v projection, the attention output and
--                 the MLP's Linear layers (each, when nil, is bias: M.biases)
--   sliding_window   a query sees only the sliding_window latest keys (itself included), in the
--                 layers that layer_types names "sliding_attention" (every layer without layer_types)
--   layer_types   one of "full_attention" | "sliding_attention" per layer
--   pos           "learned" | "rope";  norm "layernorm" | "rmsnorm";  mlp "gelu" | "swiglu"
--   tie_embeddings   lm_head uses wte.weight
--   init_std      the std of the initial weights (0.02)
--   dtype, device    where the parameters live ("f32", "cpu" by default)
-- Mixture of experts (nn.MoE; arch "moe" sets n_experts = 8, top_k = 2; n_experts on any arch
-- replaces its MLPs): n_experts, top_k (<= n_experts), capacity_factor (nil: dropless),
-- n_shared_experts, shared_expert_hidden (the shared experts' width; default n_shared_experts *
-- ffn_hidden), shared_expert_gate (a sigmoid gate on the shared output, Qwen2-MoE's),
-- norm_topk_prob, aux_loss_coef (0.01), z_loss_coef (0). Each expert is the
-- arch's MLP ("swiglu" or "gelu") of width ffn_hidden. With targets, in training mode, the loss
-- the model returns is the cross-entropy plus the sum of the layers' aux losses (model.lm_loss and
-- model.aux_loss hold the two parts, for logging).
-- Every key applies to every arch (pos, norm, mlp and tie_embeddings are what make an
-- arch), so a config can switch arch alone. An unknown key or a bad value is an error
-- that names the key. Sizes are at most 2^31 - 1, and a config whose parameters would not
-- fit in the memory of its device is refused before anything is allocated, naming the keys
-- of the largest part and the bytes it would need (lutra/models/size.lua says how the
-- device's memory is found).
local errors = require "lutra.errors"
local dtype = require "lutra.dtype"
local size = require "lutra.models.size"
local lt = require "lutra.ffi"
local Transformer = require "lutra.models.transformer"
local SwiGLU = require "lutra.nn.swiglu"

local raise = errors.raise

local M = {}

local rope = require "lutra.models.rope"

M.archs = {gpt2 = require "lutra.models.gpt2", llama = require "lutra.models.llama", moe = require "lutra.models.moe"}
M.Transformer = Transformer

local MAX_SIZE = 2 ^ 31 - 1
local function posint(v) return type(v) == "number" and v == math.floor(v) and v >= 1 and v < 2 ^ 53 end
local function posnum(v) return type(v) == "number" and v > 0 and v < math.huge end
local function choice(...)
  local set, list = {}, {...}
  for _, c in ipairs(list) do set[c] = true end
  return function(v) return set[v] == true end, "one of \"" .. table.concat(list, "\", \"") .. "\""
end

local CHECKS = {
  n_layer = {posint, "a positive integer"}, n_head = {posint, "a positive integer"},
  n_kv_head = {posint, "a positive integer"}, d_model = {posint, "a positive integer"},
  vocab_size = {posint, "a positive integer"}, block_size = {posint, "a positive integer"},
  ffn_hidden = {posint, "a positive integer"},
  dropout = {function(v) return type(v) == "number" and v >= 0 and v < 1 end, "a number in [0, 1)"},
  bias = {function(v) return type(v) == "boolean" end, "true or false"},
  tie_embeddings = {function(v) return type(v) == "boolean" end, "true or false"},
  norm_eps = {posnum, "a positive number"}, rope_theta = {posnum, "a positive number"},
  init_std = {function(v) return type(v) == "number" and v >= 0 and v < math.huge end, "a number >= 0"},
  head_dim = {posint, "a positive integer"}, sliding_window = {posint, "a positive integer"},
  qk_norm = {function(v) return type(v) == "boolean" end, "true or false"},
  qkv_bias = {function(v) return type(v) == "boolean" end, "true or false"},
  out_bias = {function(v) return type(v) == "boolean" end, "true or false"},
  mlp_bias = {function(v) return type(v) == "boolean" end, "true or false"},
  rope_scaling = {function(v) return type(v) == "table" end, "a table {rope_type =, factor =, ...}"},
  layer_types = {function(v)
    if type(v) ~= "table" then return false end
    for i, t in ipairs(v) do
      if t ~= "full_attention" and t ~= "sliding_attention" then return false end
    end
    return next(v) == nil or #v > 0
  end, "a list of \"full_attention\" or \"sliding_attention\", one per layer"},
  n_experts = {posint, "a positive integer"}, top_k = {posint, "a positive integer"},
  capacity_factor = {posnum, "a positive number"},
  n_shared_experts = {function(v) return v == 0 or posint(v) end, "an integer >= 0"},
  shared_expert_hidden = {posint, "a positive integer"},
  shared_expert_gate = {function(v) return type(v) == "boolean" end, "true or false"},
  norm_topk_prob = {function(v) return type(v) == "boolean" end, "true or false"},
  aux_loss_coef = {function(v) return type(v) == "number" and v >= 0 and v < math.huge end, "a number >= 0"},
  z_loss_coef = {function(v) return type(v) == "number" and v >= 0 and v < math.huge end, "a number >= 0"},
  pos = {choice("learned", "rope")}, norm = {choice("layernorm", "rmsnorm")}, mlp = {choice("gelu", "swiglu")},
  dtype = {function(v) return v == "f32" or v == "f64" or v == "bf16" or v == "f16" end,
           "a floating-point dtype (\"f32\", \"f64\", \"bf16\", \"f16\")"},
  device = {function(v) return pcall(dtype.device_id, v) and v ~= nil end, "\"cpu\", \"cuda\" or \"cuda:k\""},
}
M.keys = {"arch"}
for k in pairs(CHECKS) do M.keys[#M.keys + 1] = k end
table.sort(M.keys)

-- the keys of the MoE layers besides n_experts
M.moe_keys = {"top_k", "capacity_factor", "n_shared_experts", "shared_expert_hidden", "shared_expert_gate",
              "norm_topk_prob", "aux_loss_coef", "z_loss_coef"}

-- Keys a recipe's config writes as 0 for "the default" (recipes/pretrain.lua): n_kv_head (as
-- many as n_head), the mixture-of-experts sizes (none, or the arch's) and capacity (dropless).
local ZERO_IS_DEFAULT = {n_kv_head = true, n_experts = true, top_k = true, capacity_factor = true,
                         n_shared_experts = true}

-- recipe_keys(saved) -> the model config keys of a recipe's saved config.model: the known keys
-- but `device` (where it ran), a 0 that means the default left out.
function M.recipe_keys(saved)
  local known, cfg = {}, {}
  for _, k in ipairs(M.keys) do known[k] = true end
  for k, v in pairs(saved) do
    if known[k] and k ~= "device" and not (ZERO_IS_DEFAULT[k] and v == 0) then cfg[k] = v end
  end
  return cfg
end

local function nearest(key)
  local best, best_d = nil, math.huge
  local dist = require("lutra.config").edit_distance
  for _, k in ipairs(M.keys) do
    local d = dist(key, k)
    if d < best_d then best, best_d = k, d end
  end
  if best and best_d <= math.max(2, #key / 3) then return best end
end

local function show(v) return type(v) == "string" and string.format("%q", v) or tostring(v) end

-- Refuses a config whose parameters would not fit in its device's memory, naming the keys of
-- the largest part (key: the name a key is shown by).
local function check_memory(out, where, key)
  local parts, total = size.parameters(out)
  local dt = out.dtype or "f32"
  local elem = lt.C.lt_dtype_size(dtype.id(dt))
  local have = size.device_bytes(out.device)
  if have == nil or total * elem <= have then return end
  table.sort(parts, function(a, b) return a.count > b.count end)
  local big = parts[1]
  local named = {}
  for i, k in ipairs(big.keys) do named[i] = string.format("%s = %d", key(k), out[k]) end
  raise(string.format("%s: the parameters would need %s (%.4g parameters in %s), more than the %s of memory on %s; "
    .. "most are in %s (%s)", where, size.human(total * elem), total, dt, size.human(have),
    out.device == nil and "cpu" or tostring(out.device), big.what, table.concat(named, ", ")))
end

-- The complete config: cfg's keys over the arch's defaults, checked. Errors name the key.
-- how (for a config read from a file): where = what errors start with ("models.build"), names
-- = {lutra key = the file's name for it}.
function M.config(cfg, how)
  how = how or {}
  local where, names = how.where or "models.build", how.names or {}
  local function key(k) return names[k] or k end
  if type(cfg) ~= "table" then raise("models.build: expected a config table, got " .. type(cfg)) end
  local names = {}
  for name in pairs(M.archs) do names[#names + 1] = name end
  table.sort(names)
  local arch = M.archs[cfg.arch]
  if arch == nil then
    raise(string.format("models.build: arch must be one of %s; got %s", table.concat(names, ", "), show(cfg.arch)))
  end
  local out = {arch = cfg.arch}
  for k, v in pairs(cfg) do
    if k ~= "arch" then
      local check = CHECKS[k]
      if check == nil then
        local near = type(k) == "string" and nearest(k)
        raise(string.format("models.build: unknown key '%s'%s", tostring(k),
          near and (" (did you mean '" .. near .. "'?)") or ""))
      end
      if not check[1](v) then raise(string.format("%s: %s must be %s, got %s", where, key(k), check[2], show(v))) end
      if check[1] == posint and v > MAX_SIZE then
        raise(string.format("%s: %s must be at most %d, got %s", where, key(k), MAX_SIZE, show(v)))
      end
      out[k] = v
    end
  end
  for k, v in pairs(arch.defaults) do
    if out[k] == nil then out[k] = v end
  end
  out.n_kv_head = out.n_kv_head or out.n_head
  if out.ffn_hidden == nil then
    out.ffn_hidden = out.mlp == "swiglu" and SwiGLU.default_hidden(out.d_model) or 4 * out.d_model
  end
  if out.n_experts == nil then
    for _, k in ipairs(M.moe_keys) do
      if out[k] ~= nil then raise(string.format("%s: %s applies to mixture-of-experts layers: set %s too (or arch = "
        .. "\"moe\")", where, key(k), key("n_experts"))) end
    end
  else
    out.top_k = out.top_k or math.min(2, out.n_experts)
    if (out.shared_expert_hidden ~= nil or out.shared_expert_gate) and (out.n_shared_experts or 0) == 0 then
      raise(string.format("%s: %s and %s apply to shared experts: set %s >= 1", where, key("shared_expert_hidden"),
        key("shared_expert_gate"), key("n_shared_experts")))
    end
    if out.top_k > out.n_experts then
      raise(string.format("%s: %s (%d) must be at most %s (%d)", where, key("top_k"), out.top_k, key("n_experts"),
        out.n_experts))
    end
  end
  if out.layer_types ~= nil and #out.layer_types ~= out.n_layer then
    raise(string.format("%s: %s lists %d layers, %s is %d", where, key("layer_types"), #out.layer_types,
      key("n_layer"), out.n_layer))
  end
  if out.layer_types ~= nil and out.sliding_window == nil then
    for _, t in ipairs(out.layer_types) do
      if t == "sliding_attention" then
        raise(string.format("%s: %s names sliding_attention layers without a %s", where, key("layer_types"),
          key("sliding_window")))
      end
    end
  end
  if out.head_dim ~= nil then
    if out.pos == "rope" and out.head_dim % 2 ~= 0 then
      raise(string.format("%s: rope needs an even head dim; %s = %d", where, key("head_dim"), out.head_dim))
    end
  elseif out.d_model % out.n_head ~= 0 then
    raise(string.format("%s: %s %d is not a multiple of %s %d", where, key("d_model"), out.d_model, key("n_head"),
      out.n_head))
  end
  if out.n_head % out.n_kv_head ~= 0 then
    raise(string.format("%s: %s %d is not a multiple of %s %d", where, key("n_head"), out.n_head, key("n_kv_head"),
      out.n_kv_head))
  end
  if out.head_dim == nil and out.pos == "rope" and (out.d_model / out.n_head) % 2 ~= 0 then
    raise(string.format("%s: rope needs an even head dim; %s / %s = %d", where, key("d_model"), key("n_head"),
      out.d_model / out.n_head))
  end
  if out.rope_scaling ~= nil then
    out.rope_scaling = rope.check(out.rope_scaling, where .. ": " .. key("rope_scaling"))
  end
  check_memory(out, where, key)
  return out
end

-- The biases of a complete config: qkv, attention output, MLP (each key, when nil, is cfg.bias).
function M.biases(cfg)
  local function pick(v) if v == nil then return cfg.bias end return v end
  return pick(cfg.qkv_bias), pick(cfg.out_bias), pick(cfg.mlp_bias)
end

-- A new model, initialised from lutra's generator (lutra.manual_seed first for a
-- reproducible one). With a mesh (lutra.dist.init) whose tp > 1, the model comes back
-- tensor-parallel over mesh.tp (built whole with the single-process initialisation, then
-- narrowed to this rank's heads, columns, rows and vocabulary); the trainer applies the
-- rest of the layout (pipeline stages, data parallel, ZeRO).
function M.build(cfg, mesh)
  local model = Transformer(M.config(cfg))
  if mesh ~= nil and mesh.tp_size and mesh.tp_size > 1 then
    require("lutra.dist.tp").parallelize(model, mesh.tp, {sequence_parallel = mesh.options.sequence_parallel})
  end
  return model
end

return M
