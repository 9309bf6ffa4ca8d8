-- lutra.hf.weights — Hugging Face weight names and layouts for gpt2 and the llama-like families
-- (llama, qwen2, qwen3, mistral: one naming), both ways.
--
-- One table of entries per family says where every HF tensor comes from in lutra's state
-- dict (lutra.models.Transformer's names):
--   gpt2  transformer.wte.weight (V, C) = wte.weight; transformer.wpe.weight (P, C) = wpe.weight;
--         transformer.h.{i}.ln_1/ln_2.{weight,bias}, transformer.ln_f.*;
--         attn.c_attn.weight (C, 3C) = blocks.{i}.attn.qkv.weight^T (GPT-2's Conv1D stores
--         (in, out), nn.Linear (out, in)), attn.c_proj, mlp.c_fc, mlp.c_proj likewise;
--         lm_head.weight only when untied.
--   llama model.embed_tokens.weight, model.layers.{i}.input_layernorm.weight (ln_1),
--         self_attn.{q,k,v}_proj = the [q heads | k heads | v heads] row blocks of
--         attn.qkv (HF's q/k rows are already in the rotate-half order lutra's RoPE uses),
--         self_attn.o_proj = attn.proj, post_attention_layernorm (ln_2),
--         mlp.gate_proj/up_proj/down_proj = mlp.gate/up/proj, model.norm (ln_f), lm_head;
--         biases where the config has them (q/k/v: qkv_bias, o: out_bias, MLP: mlp_bias);
--         self_attn.q_norm/k_norm.weight (D) = attn.q_norm/k_norm.weight (qk_norm: qwen3).
--   MoE   (mixtral, qwen2_moe, qwen3_moe: the layout save_pretrained of transformers 5 writes and
--         the Hub holds, one tensor per expert) the router mlp.gate.weight (E, C) = mlp.router.weight;
--         expert j's mlp.experts.{j}.gate_proj/up_proj (F, C), down_proj (C, F) = row block j of the
--         stacked mlp.w_gate, w_up (E, F, C), w_down (E, C, F) viewed (E F, C), (E C, F);
--         mixtral: block_sparse_moe.gate and block_sparse_moe.experts.{j}.w1/w3/w2; qwen2_moe:
--         mlp.shared_expert.gate_proj/up_proj/down_proj = mlp.shared.gate/up/proj,
--         mlp.shared_expert_gate.weight (1, C) = mlp.shared_gate.weight.
--
--   W.to_hf(cfg, sd, family)    -> {hf_name = tensor} (views; transposes not yet contiguous)
--   W.plan(cfg, shapes, family, src) -> {{entry =, key = name in the file}, ...}; every problem
--                                  (missing, unexpected, wrong shape) in one error naming the HF tensor
--   W.from_hf(cfg, tensors, family, src) -> lutra state dict (fused qkv concatenated)
--   W.linear_modules(cfg, family) -> {["blocks.0.attn.qkv"] = {{hf = "model.layers.0.self_attn.q_proj",
--                                  rows = {0, 512}}, ...}, ...} (for exporting adapters)
local errors = require "lutra.errors"
local create = require "lutra.create"

local raise = errors.raise

local M = {}

-- The entries for cfg: {hf =, lt =, shape = HF shape, t = transposed, rows = {start, len},
-- view = the 2-d shape rows index (a stacked expert tensor, lt_shape its own shape)}.
function M.entries(cfg, family)
  local C, V, F, L = cfg.d_model, cfg.vocab_size, cfg.ffn_hidden, cfg.n_layer
  local H, Hkv = cfg.n_head, cfg.n_kv_head or cfg.n_head
  local D = cfg.head_dim or C / H
  local function pick(v) if v == nil then return cfg.bias end return v end
  local qkv_bias, out_bias, mlp_bias = pick(cfg.qkv_bias), pick(cfg.out_bias), pick(cfg.mlp_bias)
  local list = {}
  local function add(hf, lt, shape, extra)
    local e = {hf = hf, lt = lt, shape = shape}
    for k, v in pairs(extra or {}) do e[k] = v end
    list[#list + 1] = e
  end
  if family == "gpt2" then
    add("transformer.wte.weight", "wte.weight", {V, C})
    add("transformer.wpe.weight", "wpe.weight", {cfg.block_size, C})
    for i = 0, L - 1 do
      local h, p = "transformer.h." .. i .. ".", "blocks." .. i .. "."
      add(h .. "ln_1.weight", p .. "ln_1.weight", {C})
      add(h .. "ln_1.bias", p .. "ln_1.bias", {C})
      add(h .. "attn.c_attn.weight", p .. "attn.qkv.weight", {C, 3 * C}, {t = true})
      add(h .. "attn.c_attn.bias", p .. "attn.qkv.bias", {3 * C})
      add(h .. "attn.c_proj.weight", p .. "attn.proj.weight", {C, C}, {t = true})
      add(h .. "attn.c_proj.bias", p .. "attn.proj.bias", {C})
      add(h .. "ln_2.weight", p .. "ln_2.weight", {C})
      add(h .. "ln_2.bias", p .. "ln_2.bias", {C})
      add(h .. "mlp.c_fc.weight", p .. "mlp.fc.weight", {C, F}, {t = true})
      add(h .. "mlp.c_fc.bias", p .. "mlp.fc.bias", {F})
      add(h .. "mlp.c_proj.weight", p .. "mlp.proj.weight", {F, C}, {t = true})
      add(h .. "mlp.c_proj.bias", p .. "mlp.proj.bias", {C})
    end
    add("transformer.ln_f.weight", "ln_f.weight", {C})
    add("transformer.ln_f.bias", "ln_f.bias", {C})
  else
    add("model.embed_tokens.weight", "wte.weight", {V, C})
    for i = 0, L - 1 do
      local h, p = "model.layers." .. i .. ".", "blocks." .. i .. "."
      add(h .. "input_layernorm.weight", p .. "ln_1.weight", {C})
      add(h .. "self_attn.q_proj.weight", p .. "attn.qkv.weight", {H * D, C}, {rows = {0, H * D}})
      add(h .. "self_attn.k_proj.weight", p .. "attn.qkv.weight", {Hkv * D, C}, {rows = {H * D, Hkv * D}})
      add(h .. "self_attn.v_proj.weight", p .. "attn.qkv.weight", {Hkv * D, C}, {rows = {(H + Hkv) * D, Hkv * D}})
      if qkv_bias then
        add(h .. "self_attn.q_proj.bias", p .. "attn.qkv.bias", {H * D}, {rows = {0, H * D}})
        add(h .. "self_attn.k_proj.bias", p .. "attn.qkv.bias", {Hkv * D}, {rows = {H * D, Hkv * D}})
        add(h .. "self_attn.v_proj.bias", p .. "attn.qkv.bias", {Hkv * D}, {rows = {(H + Hkv) * D, Hkv * D}})
      end
      add(h .. "self_attn.o_proj.weight", p .. "attn.proj.weight", {C, H * D})
      if out_bias then add(h .. "self_attn.o_proj.bias", p .. "attn.proj.bias", {C}) end
      if cfg.qk_norm then
        add(h .. "self_attn.q_norm.weight", p .. "attn.q_norm.weight", {D})
        add(h .. "self_attn.k_norm.weight", p .. "attn.k_norm.weight", {D})
      end
      add(h .. "post_attention_layernorm.weight", p .. "ln_2.weight", {C})
      if cfg.n_experts then
        M.moe_entries(cfg, family, h, p, add)
      else
      add(h .. "mlp.gate_proj.weight", p .. "mlp.gate.weight", {F, C})
      add(h .. "mlp.up_proj.weight", p .. "mlp.up.weight", {F, C})
      add(h .. "mlp.down_proj.weight", p .. "mlp.proj.weight", {C, F})
      if mlp_bias then
        add(h .. "mlp.gate_proj.bias", p .. "mlp.gate.bias", {F})
        add(h .. "mlp.up_proj.bias", p .. "mlp.up.bias", {F})
        add(h .. "mlp.down_proj.bias", p .. "mlp.proj.bias", {C})
      end
      end
    end
    add("model.norm.weight", "ln_f.weight", {C})
  end
  if not cfg.tie_embeddings then add("lm_head.weight", "lm_head.weight", {V, C}) end
  return list
end

-- The entries of one MoE layer: h the HF layer prefix, p lutra's block prefix.
function M.moe_entries(cfg, family, h, p, add)
  local C, F, E = cfg.d_model, cfg.ffn_hidden, cfg.n_experts
  local m = h .. (family == "mixtral" and "block_sparse_moe." or "mlp.")
  local gate, up, down = "gate_proj", "up_proj", "down_proj"
  if family == "mixtral" then gate, up, down = "w1", "w3", "w2" end
  add(m .. "gate.weight", p .. "mlp.router.weight", {E, C})
  for j = 0, E - 1 do
    local x = m .. "experts." .. j .. "."
    add(x .. gate .. ".weight", p .. "mlp.w_gate", {F, C}, {rows = {j * F, F}, view = {E * F, C}, lt_shape = {E, F, C}})
    add(x .. up .. ".weight", p .. "mlp.w_up", {F, C}, {rows = {j * F, F}, view = {E * F, C}, lt_shape = {E, F, C}})
    add(x .. down .. ".weight", p .. "mlp.w_down", {C, F}, {rows = {j * C, C}, view = {E * C, F}, lt_shape = {E, C, F}})
  end
  if (cfg.n_shared_experts or 0) > 0 then -- qwen2_moe (lutra.hf.families admits no other)
    local S = cfg.shared_expert_hidden or cfg.n_shared_experts * F
    add(m .. "shared_expert.gate_proj.weight", p .. "mlp.shared.gate.weight", {S, C})
    add(m .. "shared_expert.up_proj.weight", p .. "mlp.shared.up.weight", {S, C})
    add(m .. "shared_expert.down_proj.weight", p .. "mlp.shared.proj.weight", {C, S})
    add(m .. "shared_expert_gate.weight", p .. "mlp.shared_gate.weight", {1, C})
  end
end

-- The Linear layers under HF's module names (for adapters, e.g. PEFT's): lutra module name ->
-- list of {hf = HF module name, rows = {start, len} (a block of the fused qkv) or nil,
-- conv1d = true where HF stores the weight transposed (GPT-2's Conv1D)}.
function M.linear_modules(cfg, family)
  local out = {}
  for _, e in ipairs(M.entries(cfg, family)) do
    if #e.shape == 2 and e.lt ~= "wte.weight" and e.lt ~= "wpe.weight" and not e.view then
      local lt_mod, hf_mod = e.lt:gsub("%.weight$", ""), e.hf:gsub("%.weight$", "")
      out[lt_mod] = out[lt_mod] or {}
      table.insert(out[lt_mod], {hf = hf_mod, rows = e.rows, conv1d = e.t or nil})
    end
  end
  return out
end

-- Tensors that HF checkpoints may carry and that hold no weights: GPT-2's causal-mask
-- buffers, llama's RoPE frequencies, a tied lm_head.
local function ignorable(name, family, cfg)
  if family == "gpt2" and (name:match("^transformer%.h%.%d+%.attn%.bias$") or name:match("%.attn%.masked_bias$")) then
    return true
  end
  if family ~= "gpt2" and name:match("%.rotary_emb%.inv_freq$") then return true end
  return cfg.tie_embeddings and name == "lm_head.weight"
end

local function shape_str(s) return "[" .. table.concat(s, ", ") .. "]" end

function M.to_hf(cfg, sd, family)
  local out = {}
  for _, e in ipairs(M.entries(cfg, family)) do
    local t = sd[e.lt]
    if t == nil then raise("hf: the model has no '" .. e.lt .. "' (for " .. e.hf .. ")") end
    t = t:detach()
    if e.view then t = t:reshape(e.view[1], e.view[2]) end
    if e.rows then t = t:narrow(0, e.rows[1], e.rows[2]) end
    if e.t then t = t:t() end
    out[e.hf] = t
  end
  return out
end

-- GPT-2 files converted from GPT2Model name tensors without "transformer.".
local function canonical(name, family)
  if family == "gpt2" and (name:match("^h%.%d+%.") or name:match("^wte%.") or name:match("^wpe%.") or
      name:match("^ln_f%.")) then
    return "transformer." .. name
  end
  return name
end

-- Checks the file's names and shapes ({name = {shape = {...}}}, tensors or read_header
-- entries) against cfg's entries. Returns the plan, a list of {entry =, key = the name in
-- the file}; raises listing every missing, misshapen and unexpected tensor.
function M.plan(cfg, shapes, family, source)
  local key_of = {}
  for name in pairs(shapes) do key_of[canonical(name, family)] = name end
  local problems, used, plan = {}, {}, {}
  for _, e in ipairs(M.entries(cfg, family)) do
    local key = key_of[e.hf]
    used[e.hf] = true
    local shape = key and shapes[key].shape
    if key == nil then
      problems[#problems + 1] = "missing " .. e.hf .. " " .. shape_str(e.shape)
    elseif table.concat(shape, ",") ~= table.concat(e.shape, ",") then
      problems[#problems + 1] = string.format("%s is %s in the file, %s from config.json", e.hf, shape_str(shape),
        shape_str(e.shape))
    else
      plan[#plan + 1] = {entry = e, key = key}
    end
  end
  local extra = {}
  for name in pairs(key_of) do
    if not used[name] and not ignorable(name, family, cfg) then extra[#extra + 1] = name end
  end
  table.sort(extra)
  for _, name in ipairs(extra) do problems[#problems + 1] = "unexpected " .. name end
  if #problems > 0 then
    local shown = {}
    for i = 1, math.min(#problems, 12) do shown[i] = problems[i] end
    if #problems > 12 then shown[#shown + 1] = string.format("... and %d more", #problems - 12) end
    raise(string.format("hf: %s does not hold a %s model of this config.json:\n  %s", source, family,
      table.concat(shown, "\n  ")))
  end
  return plan
end

-- lutra's state dict from {hf name = tensor} (transposes as views, fused qkv concatenated).
function M.from_hf(cfg, tensors, family, source)
  local parts, sd, shapes_of = {}, {}, {} -- parts: lutra name -> list of {row start, tensor}
  for _, p in ipairs(M.plan(cfg, tensors, family, source)) do
    local e, t = p.entry, tensors[p.key]
    if e.rows then
      parts[e.lt] = parts[e.lt] or {}
      shapes_of[e.lt] = e.lt_shape
      table.insert(parts[e.lt], {e.rows[1], t})
    else
      sd[e.lt] = e.t and t:t() or t
    end
  end
  for name, list in pairs(parts) do
    table.sort(list, function(a, b) return a[1] < b[1] end)
    local ts = {}
    for i, p in ipairs(list) do ts[i] = p[2] end
    sd[name] = create.cat(ts, 0)
    if shapes_of[name] then sd[name] = sd[name]:reshape(unpack(shapes_of[name])) end
  end
  if cfg.tie_embeddings then sd["lm_head.weight"] = sd["wte.weight"] end
  return sd
end

return M
