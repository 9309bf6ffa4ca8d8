-- lutra.lora.peft — LoRA adapters on disk in PEFT's layout, the one Hugging Face's peft
-- library reads with PeftModel.from_pretrained(base, dir):
--   dir/adapter_model.safetensors   base_model.model.<HF module>.lora_A.weight (r, in)
--                                   base_model.model.<HF module>.lora_B.weight (out, r)
--   dir/adapter_config.json         peft_type "LORA", r, lora_alpha, lora_dropout,
--                                   target_modules, use_rslora, bias "none", task_type
--                                   "CAUSAL_LM", fan_in_fan_out (true for GPT-2's Conv1D)
-- Module names: lutra.lora.hf_names.
-- lutra's fused qkv with one adapter pair (lora.apply's default) is written as q_proj, k_proj
-- and v_proj with the same lora_A and the matching rows of lora_B: the same update exactly.
-- Independent adapters (PEFT's own q/k/v, or only some of them, e.g. target_modules q_proj
-- and v_proj) are row blocks of the fused layer (LoRALinear:set_blocks; lora.apply with
-- targets {"q_proj", "v_proj"} or split_fused = true makes them), written and read block by
-- block. load reads either: one shared A when every part is there with equal lora_A, blocks
-- otherwise.
-- The safetensors metadata records lutra's module names and format.
local errors = require "lutra.errors"
local no_grad = require("lutra.nn.grad").no_grad
local cat = require("lutra.create").cat
local linear = require "lutra.lora.linear"
local hf_names = require "lutra.lora.hf_names"
local apply = require("lutra.lora.apply").apply
local weight_checks = require "lutra.ckpt.weight_checks"

local raise = errors.raise
local family = hf_names.family

local M = {}

local PREFIX = "base_model.model."

local function safetensors()
  local ok, st = pcall(require, "lutra.ckpt.safetensors")
  if not ok then raise("lora.save/load: lutra.ckpt.safetensors is not available (" .. tostring(st) .. ")") end
  return st
end

local function short_name(hf) return hf:match("([^.]+)$") end

-- Writes dir/adapter_model.safetensors and dir/adapter_config.json. Returns dir.
function M.save(dir, model, opts)
  local json = require "lutra.json"
  opts = opts or {}
  local layers = linear.layers(model)
  if #layers == 0 then raise("lora.save: the model has no LoRA layers") end
  local first = layers[1][2]
  local tensors, short, short_list, names = {}, {}, {}, {}
  for _, l in ipairs(layers) do
    local name, m = l[1], l[2]
    if m.r ~= first.r or m.alpha ~= first.alpha or m.rslora ~= first.rslora then
      raise("lora.save: every layer must share r, alpha and rslora (PEFT's config has one of each)")
    end
    names[#names + 1] = name
    local A, B = m.lora_A.weight:detach(), m.lora_B.weight:detach()
    local blocks = rawget(m, "blocks")
    for _, h in ipairs(hf_names.hf_names(model, name)) do
      local ha, hb = A, h[2] and B:narrow(0, h[2], h[3]) or B
      if blocks then -- independent adapters: the block of these rows, or none
        ha = nil
        for i, b in ipairs(blocks) do
          if h[2] and b[1] == h[2] and b[2] == h[3] then
            ha, hb = A:narrow(0, (i - 1) * m.r, m.r), hb:narrow(1, (i - 1) * m.r, m.r)
          end
        end
        if ha == nil and #blocks > 0 and not h[2] then
          raise("lora.save: " .. name .. " has row blocks but no Hugging Face module of it is split")
        end
      end
      if ha ~= nil then
        tensors[PREFIX .. h[1] .. ".lora_A.weight"] = ha:contiguous():to("cpu")
        tensors[PREFIX .. h[1] .. ".lora_B.weight"] = hb:contiguous():to("cpu")
        local s = short_name(h[1])
        if not short[s] then
          short[s] = true
          short_list[#short_list + 1] = s
        end
      end
    end
  end
  table.sort(short_list)
  os.execute("mkdir -p '" .. dir .. "'")
  safetensors().save(dir .. "/adapter_model.safetensors", tensors,
    {format = "pt", lutra_modules = table.concat(names, ","), lutra_arch = tostring(family(model))})
  local conf = {
    peft_type = "LORA", task_type = "CAUSAL_LM", r = first.r, lora_alpha = first.alpha,
    lora_dropout = first.dropout_p, target_modules = json.array(short_list), use_rslora = first.rslora,
    bias = "none", fan_in_fan_out = family(model) == "gpt2", inference_mode = true, init_lora_weights = true,
    modules_to_save = json.null, base_model_name_or_path = opts.base_model or json.null,
    revision = json.null, layers_to_transform = json.null, layers_pattern = json.null, rank_pattern = {},
    alpha_pattern = {},
  }
  json.write_file(dir .. "/adapter_config.json", conf, {indent = 2})
  return dir
end

local function pattern_of(name) return "^" .. name:gsub("[%^%$%(%)%%%.%[%]%*%+%-%?]", "%%%0") .. "$" end

-- Reads the adapters of dir into model: into its LoRA layers, or, when it has none, after
-- wrapping the Linears the file has adapters for (with the file's r, alpha, rslora). Returns model.
-- Each adapter weight must have its LoRA weight's dtype and be finite (lutra.ckpt.weight_checks:
-- opts.allow_cast, opts.allow_nonfinite).
function M.load(dir, model, opts)
  local json = require "lutra.json"
  local Linear = require "lutra.nn.linear"
  local conf = json.read_file(dir .. "/adapter_config.json")
  if conf.peft_type ~= "LORA" then raise("lora.load: " .. dir .. ": peft_type is " .. tostring(conf.peft_type)) end
  local file = dir .. "/adapter_model.safetensors"
  local tensors = safetensors().load(file)
  local function check(key, t, param)
    local where = "lora.load: " .. file .. ": tensor '" .. key .. "'"
    weight_checks.dtype(t.dtype, param.dtype, where, opts)
    weight_checks.finite(t, where, opts)
  end
  local function get(key) return tensors[key] end
  if #linear.layers(model) == 0 then
    local targets = {}
    for name, m in model:named_modules() do
      if getmetatable(m) == Linear then
        local any = false
        for _, h in ipairs(hf_names.hf_names(model, name)) do any = any or get(PREFIX .. h[1] .. ".lora_A.weight") ~= nil end
        if any then targets[#targets + 1] = pattern_of(name) end
      end
    end
    if #targets == 0 then raise("lora.load: " .. dir .. " has no adapter for any Linear of this model") end
    local drop = type(conf.lora_dropout) == "number" and conf.lora_dropout or 0
    apply(model, {targets = targets, r = conf.r, alpha = conf.lora_alpha, dropout = drop,
                       rslora = conf.use_rslora == true})
  end
  local used = {}
  local function shape_error(name, what, t, want)
    raise(string.format("lora.load: %s: shapes in the file: %s [%s]; the model's [%s]", name, what,
      table.concat(t.shape, ", "), table.concat(want, ", ")))
  end
  for _, l in ipairs(linear.layers(model)) do
    local name, m = l[1], l[2]
    if m.merged then raise("lora.load: " .. name .. " is merged (lora.unmerge first)") end
    local hs, present = hf_names.hf_names(model, name), {}
    for _, h in ipairs(hs) do
      local ka, kb = PREFIX .. h[1] .. ".lora_A.weight", PREFIX .. h[1] .. ".lora_B.weight"
      local a, b = get(ka), get(kb)
      if (a == nil) ~= (b == nil) then raise("lora.load: " .. dir .. " has no " .. (a == nil and ka or kb)) end
      if a then
        used[ka], used[kb] = true, true
        check(ka, a, m.lora_A.weight)
        check(kb, b, m.lora_B.weight)
        present[#present + 1] = {h = h, a = a, b = b}
      end
    end
    if #present == 0 then raise("lora.load: " .. dir .. " has no adapter for " .. name .. " (" .. hs[1][1] .. ")") end
    -- one shared A (what lutra writes for a fused layer) or independent adapters (row blocks)
    local shared = #present == #hs and rawget(m, "blocks") == nil
    for i = 2, #present do
      if shared and no_grad(function() return (present[i].a:to("f64") - present[1].a:to("f64")):abs():max():item() end) ~= 0 then
        shared = false
      end
    end
    local wa, wb = m.lora_A.weight, m.lora_B.weight
    if shared then
      local A = present[1].a
      local Bs = {}
      for i, p in ipairs(present) do Bs[i] = p.b end
      local B = #Bs == 1 and Bs[1] or cat(Bs, 0)
      if A:size(0) ~= wa:size(0) or A:size(1) ~= wa:size(1) then shape_error(name, "A", A, wa.shape) end
      if B:size(0) ~= wb:size(0) or B:size(1) ~= wb:size(1) then shape_error(name, "B", B, wb.shape) end
      no_grad(function()
        wa:copy_(A)
        wb:copy_(B)
      end)
    else
      local blocks, same = {}, rawget(m, "blocks") ~= nil and #m.blocks == #present
      for i, p in ipairs(present) do
        blocks[i] = {p.h[2], p.h[3]}
        same = same and m.blocks[i][1] == p.h[2] and m.blocks[i][2] == p.h[3]
        if p.a:size(0) ~= m.r or p.a:size(1) ~= m.in_features then shape_error(name, p.h[1] .. " A", p.a, {m.r, m.in_features}) end
        if p.b:size(0) ~= p.h[3] or p.b:size(1) ~= m.r then shape_error(name, p.h[1] .. " B", p.b, {p.h[3], m.r}) end
      end
      if not same then m:set_blocks(blocks) end
      wa, wb = m.lora_A.weight, m.lora_B.weight
      no_grad(function()
        wb:zero_()
        for i, p in ipairs(present) do
          wa:narrow(0, (i - 1) * m.r, m.r):copy_(p.a)
          wb:narrow(0, p.h[2], p.h[3]):narrow(1, (i - 1) * m.r, m.r):copy_(p.b)
        end
      end)
    end
    local scaling = conf.use_rslora and conf.lora_alpha / math.sqrt(conf.r) or conf.lora_alpha / conf.r
    rawset(m, "scaling", scaling)
    rawset(m, "alpha", conf.lora_alpha)
    rawset(m, "rslora", conf.use_rslora == true)
  end
  for k in pairs(tensors) do
    if type(k) == "string" and k:find("lora_") and not used[k] then
      raise("lora.load: " .. dir .. ": " .. k .. " matches no LoRA layer of this model")
    end
  end
  return model
end

return M
