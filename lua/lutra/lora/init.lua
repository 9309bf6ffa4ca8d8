-- lutra.lora — low-rank adapters (Hu et al. 2021, LoRA) on a model's Linear layers.
--
--   local lora = require "lutra.lora"
--   lora.apply(model, {targets = "all-linear", r = 8, alpha = 16, dropout = 0.05, rslora = false})
--   -- peft's options too: dora = true, bias = "all" | "lora_only", modules_to_save = {"lm_head"},
--   -- rank_pattern / alpha_pattern = {[peft key regex] = n}, layers = {0, 1} (layers_to_transform)
--   print(lora.summary(model))   -- "trainable params: 73,728 || all params: ... || trainable%: 3.41"
--   local opt = lt.optim.AdamW(lora.param_groups(model), {lr = 1e-3})   -- the adapters only
--   ... train ...
--   lora.save("runs/adapter", model)          -- PEFT's adapter_model.safetensors + adapter_config.json
--   lora.load("runs/adapter", model)          -- into the base model (wraps what the file covers) or a wrapped one
--   lora.merge(model) / lora.unmerge(model)   -- W += s B A, and back
--   lora.disable(model, fn, ...)              -- fn(...) with the adapters off (the base model)
--
-- apply replaces each chosen nn.Linear in its parent by a LoRALinear that holds the base
-- layer's own weight and bias tensors (frozen; state_dict names unchanged, so
-- "blocks.0.attn.qkv.weight" stays where it was) and two bias-free Linears, lora_A (r, in)
-- drawn kaiming-uniform(a = sqrt(5)) as PEFT does, and lora_B (out, r) zeros, so that the
-- wrapped model starts equal to the base. forward(x) = base(x) + s * B(A(dropout(x))), with
-- s = alpha / r, or alpha / sqrt(r) with rsLoRA (Kalajdzievski 2023). Every other parameter
-- of the model is frozen (requires_grad false): lora.trainable(model) lists the adapters
-- alone, lora.count / lora.summary count their entries (model:num_parameters{trainable =
-- true} too, but for the zeros that row-block adapters hold fixed).
--
-- targets: "all-linear" (every Linear but the output head lm_head, PEFT's rule), or a list of
-- Lua patterns matched against dotted module names ("attn%.qkv$", "mlp%.") and against the
-- Hugging Face module names of lutra.lora.peft ("q_proj", "c_attn"): PEFT's target_modules
-- work as they are. A pattern that matches no Linear is an error that lists the Linears.
-- In lutra's models q, k and v come from one fused Linear (attn.qkv). Chosen by its lutra
-- name (or all-linear), it gets one adapter pair (one A shared by q, k, v; B stacked):
-- exported to PEFT as q_proj, k_proj and v_proj with the same lora_A, exactly the same
-- update. Chosen by HF names ({"q_proj", "v_proj"}), or with split_fused = true, it gets
-- independent adapters on those row blocks (LoRALinear:set_blocks), as PEFT has them.
local Module = require "lutra.nn.module"
local Linear = require "lutra.nn.linear"
local errors = require "lutra.errors"
local grad = require "lutra.nn.grad"
local linear = require "lutra.lora.linear"
local hf_names = require "lutra.lora.hf_names"

local raise = errors.raise

local M = {}

-- The layer (lutra.lora.linear), lora.apply (lutra.lora.apply), the Hugging Face names of a
-- model's modules (lutra.lora.hf_names).
M.LoRALinear, M.is_lora, M.layers = linear.LoRALinear, linear.is_lora, linear.layers
M.apply = require("lutra.lora.apply").apply
M.owner_attention = hf_names.owner_attention
local is_lora = linear.is_lora

-- ---- the public functions ---------------------------------------------------------------------------

local function need_layers(model, who)
  if not Module.is_module(model) then raise(who .. ": expected a module, got " .. type(model)) end
  local ls = M.layers(model)
  if #ls == 0 then raise(who .. ": the model has no LoRA layers (lora.apply first)") end
  return ls
end

-- The parameters that require grad, as a list of {name, tensor} (for optim: see param_groups).
function M.trainable(model)
  local out = {}
  for name, p in model:named_parameters() do
    if p.requires_grad then out[#out + 1] = {name, p} end
  end
  return out
end

-- Optimizer groups over the trainable parameters alone: optim.AdamW(lora.param_groups(model), opts).
-- (optim.AdamW(model) would list the frozen parameters too: they have no gradient, so they are
-- skipped and get no state, but lora.param_groups keeps the optimizer's view to the adapters.)
function M.param_groups(model, opts)
  local tr = M.trainable(model)
  if #tr == 0 then raise("lora.param_groups: the model has no trainable parameters") end
  opts = opts or {}
  return require("lutra.optim").param_groups(tr, {weight_decay = opts.weight_decay, no_decay = opts.no_decay})
end

-- Counts: trainable (entries of tensors that require grad, less the masked zeros of block
-- adapters), total (each tensor once), and the analytic count: the sum over wrapped layers of
-- r * (in + out), or r * (in + rows) per block.
function M.count(model)
  local trainable, total, analytic = 0, 0, 0
  for _, p in ipairs(model:parameters()) do
    total = total + p:numel()
    if p.requires_grad then trainable = trainable + p:numel() end
  end
  for _, l in ipairs(M.layers(model)) do
    local m = l[2]
    analytic = analytic + m:adapter_size()
    local mask = rawget(m, "_mask")
    if mask and m.lora_B.weight.requires_grad then -- B's entries held at zero do not train
      local held = mask:numel()
      for i, b in ipairs(m.blocks) do
        local _, r = m:block(i)
        held = held - b[2] * r
      end
      trainable = trainable - held
    end
  end
  return trainable, total, analytic
end

local function commas(n)
  local s = string.format("%d", n)
  local out = s:reverse():gsub("(%d%d%d)", "%1,"):reverse()
  return (out:gsub("^,", ""))
end

-- PEFT's print_trainable_parameters line.
function M.summary(model)
  local trainable, total = M.count(model)
  return string.format("trainable params: %s || all params: %s || trainable%%: %.4f", commas(trainable),
    commas(total), 100 * trainable / total)
end

-- W += s B A in every wrapped layer (with DoRA: W = m (W + s B A) / ||W + s B A|| by rows) (forward then skips the adapter path). Returns model.
function M.merge(model)
  for _, l in ipairs(need_layers(model, "lora.merge")) do
    local m = l[2]
    if not m.merged then
      m:merge_weight()
      rawset(m, "merged", true)
    end
  end
  return model
end

-- W -= s B A: back to the base weight (within rounding) and the adapter path on.
function M.unmerge(model)
  for _, l in ipairs(need_layers(model, "lora.unmerge")) do
    local m = l[2]
    if m.merged then
      m:unmerge_weight()
      rawset(m, "merged", false)
    end
  end
  return model
end

-- fn(...) with every adapter off: the base model's outputs (a merged model is refused: its
-- weights hold the adapters). Returns fn's results; the adapters are back on after, errors too.
function M.disable(model, fn, ...)
  local ls = need_layers(model, "lora.disable")
  if type(fn) ~= "function" then raise("lora.disable: expected a function to run, got " .. type(fn)) end
  local before = {}
  for i, l in ipairs(ls) do
    if l[2].merged then raise("lora.disable: '" .. l[1] .. "' is merged (lora.unmerge first)") end
    before[i] = l[2].disabled
    rawset(l[2], "disabled", true)
  end
  local args = {n = select("#", ...), ...}
  -- modules_to_save copies (lutra.lora.base_params): the originals run, as in peft
  local res = {pcall(require("lutra.lora.base_params").with_originals, model,
    function() return fn(unpack(args, 1, args.n)) end)}
  for i, l in ipairs(ls) do rawset(l[2], "disabled", before[i]) end
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

-- Replaces every LoRALinear by a plain Linear holding the merged weight (trainable again:
-- the model is an ordinary model after). Returns model.
function M.merge_and_unload(model)
  M.merge(model)
  for _, m in ipairs(model:modules()) do
    for _, e in ipairs(m._entries) do
      local c = rawget(m, e.key)
      if e.kind == "module" and is_lora(c) then
        local lin
        if c.unloaded then
          lin = c:unloaded() -- a tensor-parallel layer (lutra.lora.tp): the plain parallel layer
        else
          lin = Linear(c.in_features, c.out_features, {bias = c.bias ~= nil, dtype = c.weight.dtype,
                                                       device = c.weight.device})
          lin.weight = c.weight
          if c.bias ~= nil then lin.bias = c.bias end
        end
        if type(e.key) == "string" then m[e.key] = lin else rawset(m, e.key, lin) end
      end
    end
  end
  rawset(model, "_lora", nil)
  return model
end

-- Adapters on disk (PEFT's layout): lutra/lora/peft.lua.
-- A tensor-parallel model (lutra.lora.tp_peft) saves its gathered adapters (a collective over its
-- tp group) and loads into its pieces.
local function tensor_parallel(model)
  if not Module.is_module(model) then return false end
  for _, l in ipairs(M.layers(model)) do
    if rawget(l[2], "group") ~= nil then return true, l[1] end
  end
  return false
end
function M.save(dir, model, opts)
  if tensor_parallel(model) then return require("lutra.lora.tp_peft").save(dir, model, opts) end
  return require("lutra.lora.peft").save(dir, model, opts)
end
function M.load(dir, model, opts)
  if tensor_parallel(model) then return require("lutra.lora.tp_peft").load(dir, model, opts) end
  return require("lutra.lora.peft").load(dir, model, opts)
end

return M
