-- lutra.lora.peft — LoRA adapters on disk in PEFT's layout, the one Hugging Face's peft
-- library reads with PeftModel.from_pretrained(base, dir):
--   dir/adapter_model.safetensors   base_model.model.<HF module>.lora_A.weight (r, in)
--                                   base_model.model.<HF module>.lora_B.weight (out, r)
--                                   base_model.model.<HF module>.lora_magnitude_vector (out) (DoRA)
--                                   base_model.model.<HF parameter> (biases, modules_to_save:
--                                   lutra.lora.base_params)
--   dir/adapter_config.json         peft_type "LORA", r, lora_alpha, lora_dropout, target_modules,
--                                   use_rslora, use_dora, bias, modules_to_save, rank_pattern,
--                                   alpha_pattern, layers_to_transform, task_type "CAUSAL_LM",
--                                   fan_in_fan_out (true for GPT-2's Conv1D); read and checked by
--                                   lutra.lora.peft_config (what lutra does not implement is refused
--                                   by its field)
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
local json = require "lutra.json"
local no_grad = require("lutra.nn.grad").no_grad
local cat = require("lutra.create").cat
local linear = require "lutra.lora.linear"
local hf_names = require "lutra.lora.hf_names"
local apply = require("lutra.lora.apply").apply
local weight_checks = require "lutra.ckpt.weight_checks"
local peft_config = require "lutra.lora.peft_config"
local base_params = require "lutra.lora.base_params"

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


-- Every Hugging Face module name of the model's Linears (wrapped or not), for target_modules.
local function all_linear_names(model)
  local Linear = require "lutra.nn.linear"
  local out = {}
  for name, m in model:named_modules() do
    if getmetatable(m) == Linear or linear.is_lora(m) then
      for _, h in ipairs(hf_names.hf_names(model, name)) do out[#out + 1] = h[1] end
    end
  end
  return out
end

local function layer_of(hf) return tonumber(hf:match("%.h%.(%d+)%.") or hf:match("%.layers%.(%d+)%.")) end
local function escape(name) return (name:gsub("%.", "\\.")) end

-- target_modules (and layers_to_transform) that select exactly the adapted modules under peft's
-- rules: a list of short names when they cover the same modules, with layers_to_transform when
-- only some layers; else a regex peft full-matches against each module name.
local function targets_of(model, adapted)
  local set, shorts, short_list = {}, {}, {}
  for _, hf in ipairs(adapted) do
    set[hf] = true
    local s = short_name(hf)
    if not shorts[s] then
      shorts[s] = true
      short_list[#short_list + 1] = s
    end
  end
  table.sort(short_list)
  local covered, layers, in_layers = {}, {}, true
  for _, hf in ipairs(adapted) do
    local i = layer_of(hf)
    if i == nil then in_layers = false else layers[i] = true end
  end
  local exact, by_layer = true, in_layers
  for _, hf in ipairs(all_linear_names(model)) do
    if shorts[short_name(hf)] then
      covered[#covered + 1] = hf
      if not set[hf] then
        exact = false
        local i = layer_of(hf)
        if i == nil or layers[i] then by_layer = false end
      end
    end
  end
  if exact then return json.array(short_list) end
  if by_layer then
    local list = {}
    for i in pairs(layers) do list[#list + 1] = i end
    table.sort(list)
    return json.array(short_list), json.array(list), family(model) == "gpt2" and "h" or "layers"
  end
  local esc = {}
  for i, hf in ipairs(adapted) do esc[i] = escape(hf) end
  table.sort(esc)
  return "(" .. table.concat(esc, "|") .. ")"
end

-- Writes dir/adapter_model.safetensors and dir/adapter_config.json. Returns dir.
function M.save(dir, model, opts)
  opts = opts or {}
  local layers = linear.layers(model)
  if #layers == 0 then raise("lora.save: the model has no LoRA layers") end
  local first = layers[1][2]
  local dora = rawget(first, "lora_magnitude") ~= nil
  local tensors, names, modules = {}, {}, {}
  for _, l in ipairs(layers) do
    local name, m = l[1], l[2]
    if m.rslora ~= first.rslora then raise("lora.save: every layer must share rslora (PEFT's config has one use_rslora)") end
    if (rawget(m, "lora_magnitude") ~= nil) ~= dora then
      raise("lora.save: every layer must have DoRA or none (PEFT's config has one use_dora)")
    end
    if m.merged then raise("lora.save: " .. name .. " is merged (lora.unmerge first)") end
    names[#names + 1] = name
    local A, B = m.lora_A.weight:detach(), m.lora_B.weight:detach()
    local mag = dora and m.lora_magnitude:detach() or nil
    local blocks = rawget(m, "blocks")
    for _, h in ipairs(hf_names.hf_names(model, name)) do
      local ha, hb, r, alpha = A, h[2] and B:narrow(0, h[2], h[3]) or B, m.r, m.alpha
      if blocks then -- independent adapters: the block of these rows, or none
        ha = nil
        for i, b in ipairs(blocks) do
          if h[2] and b[1] == h[2] and b[2] == h[3] then
            local col
            col, r, alpha = m:block(i)
            ha, hb = A:narrow(0, col, r), hb:narrow(1, col, r)
          end
        end
        if ha == nil and #blocks > 0 and not h[2] then
          raise("lora.save: " .. name .. " has row blocks but no Hugging Face module of it is split")
        end
      end
      if ha ~= nil then
        tensors[PREFIX .. h[1] .. ".lora_A.weight"] = ha:contiguous():to("cpu")
        tensors[PREFIX .. h[1] .. ".lora_B.weight"] = hb:contiguous():to("cpu")
        if mag then
          local hm = h[2] and mag:narrow(0, h[2], h[3]) or mag
          tensors[PREFIX .. h[1] .. ".lora_magnitude_vector"] = hm:contiguous():to("cpu")
        end
        modules[#modules + 1] = {hf = h[1], r = r, alpha = alpha}
      end
    end
  end
  local extra, bias, mts = base_params.for_save(model)
  for k, t in pairs(extra) do tensors[PREFIX .. k] = t end
  -- r and lora_alpha: the most common (the first of equals); rank_pattern / alpha_pattern name each
  -- module that differs
  local function mode(field)
    local n, best = {}, nil
    for _, mod in ipairs(modules) do
      n[mod[field]] = (n[mod[field]] or 0) + 1
      if best == nil or n[mod[field]] > n[best] then best = mod[field] end
    end
    return best
  end
  local r0, a0 = mode("r"), mode("alpha")
  local rank_pattern, alpha_pattern, adapted = {}, {}, {}
  for _, mod in ipairs(modules) do
    adapted[#adapted + 1] = mod.hf
    if mod.r ~= r0 then rank_pattern[escape(mod.hf)] = mod.r end
    if mod.alpha ~= a0 then alpha_pattern[escape(mod.hf)] = mod.alpha end
  end
  local target_modules, ltt, lpat = targets_of(model, adapted)
  os.execute("mkdir -p '" .. dir .. "'")
  safetensors().save(dir .. "/adapter_model.safetensors", tensors,
    {format = "pt", lutra_modules = table.concat(names, ","), lutra_arch = tostring(family(model))})
  local conf = {
    peft_type = "LORA", task_type = "CAUSAL_LM", r = r0, lora_alpha = a0,
    lora_dropout = first.dropout_p, target_modules = target_modules, use_rslora = first.rslora, use_dora = dora,
    bias = bias, fan_in_fan_out = family(model) == "gpt2", inference_mode = true, init_lora_weights = true,
    modules_to_save = mts and json.array(mts) or json.null, base_model_name_or_path = opts.base_model or json.null,
    revision = json.null, layers_to_transform = ltt or json.null, layers_pattern = lpat or json.null,
    rank_pattern = rank_pattern, alpha_pattern = alpha_pattern,
  }
  json.write_file(dir .. "/adapter_config.json", conf, {indent = 2})
  return dir
end

local function pattern_of(name) return "^" .. name:gsub("[%^%$%(%)%%%.%[%]%*%+%-%?]", "%%%0") .. "$" end

local SUFFIX = {".lora_A.weight", ".lora_B.weight", ".lora_magnitude_vector"}

-- Reads the adapters of dir into model: into its LoRA layers, or, when it has none, after
-- wrapping the Linears the file has adapters for (with the config's r, alpha, rank_pattern,
-- alpha_pattern, rslora, DoRA, bias and modules_to_save). Returns model.
-- Each tensor must have its parameter's dtype and be finite (lutra.ckpt.weight_checks:
-- opts.allow_cast, opts.allow_nonfinite).
function M.load(dir, model, opts)
  local Linear = require "lutra.nn.linear"
  local conf = peft_config.read(dir .. "/adapter_config.json")
  local file = dir .. "/adapter_model.safetensors"
  local raw = safetensors().load(file)
  local tensors = {}
  for k, t in pairs(raw) do
    if type(k) == "string" and k ~= "__metadata__" then
      if k:sub(1, #PREFIX) ~= PREFIX then
        raise("lora.load: " .. file .. ": tensor '" .. k .. "' does not start with '" .. PREFIX .. "'")
      end
      tensors[k:sub(#PREFIX + 1)] = t
    end
  end
  local function check(key, t, param)
    local where = "lora.load: " .. file .. ": tensor '" .. PREFIX .. key .. "'"
    weight_checks.dtype(t.dtype, param.dtype, where, opts)
    weight_checks.finite(t, where, opts)
  end
  local function rank_alpha(hf)
    local where = "lora.load: " .. conf.path
    return peft_config.pattern_value(conf.rank_pattern, hf, conf.r, "rank_pattern", where),
      peft_config.pattern_value(conf.alpha_pattern, hf, conf.alpha, "alpha_pattern", where)
  end
  if #linear.layers(model) == 0 then
    local targets = {}
    for name, m in model:named_modules() do
      if getmetatable(m) == Linear then
        local any = false
        for _, h in ipairs(hf_names.hf_names(model, name)) do
          if tensors[h[1] .. ".lora_A.weight"] ~= nil then
            any = true
            rank_alpha(h[1]) -- (the config's patterns checked here, where errors name its file)
          end
        end
        if any then targets[#targets + 1] = pattern_of(name) end
      end
    end
    if #targets == 0 then raise("lora.load: " .. dir .. " has no adapter for any Linear of this model") end
    if conf.modules_to_save then base_params.resolve(model, conf.modules_to_save, "lora.load: " .. conf.path) end
    apply(model, {targets = targets, r = conf.r, alpha = conf.alpha, dropout = conf.dropout, rslora = conf.rslora,
                  rank_pattern = conf.rank_pattern, alpha_pattern = conf.alpha_pattern, dora = conf.dora,
                  bias = conf.bias, modules_to_save = conf.modules_to_save})
  elseif conf.modules_to_save or conf.bias ~= "none" then
    local cfg = rawget(model, "_lora") or {}
    rawset(model, "_lora", cfg)
    if cfg.saved == nil or #cfg.saved == 0 then base_params.setup(model, conf.bias, conf.modules_to_save, "lora.load") end
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
      local ka, kb, km = h[1] .. SUFFIX[1], h[1] .. SUFFIX[2], h[1] .. SUFFIX[3]
      local a, b, mag = tensors[ka], tensors[kb], tensors[km]
      if (a == nil) ~= (b == nil) then raise("lora.load: " .. dir .. " has no " .. PREFIX .. (a == nil and ka or kb)) end
      if a then
        if conf.dora and mag == nil then raise("lora.load: " .. file .. ": use_dora is true but there is no " .. PREFIX .. km) end
        if mag ~= nil and not conf.dora then
          raise("lora.load: " .. file .. ": tensor '" .. PREFIX .. km .. "' but " .. conf.path .. " has use_dora false")
        end
        local li = layer_of(h[1])
        if conf.layers and li ~= nil and not conf.layers[li] then
          raise(string.format("lora.load: %s: %s%s is in layer %d, not in layers_to_transform (peft leaves it out)",
            file, PREFIX, ka, li))
        end
        used[ka], used[kb] = true, true
        if mag then used[km] = true end
        check(ka, a, m.lora_A.weight)
        check(kb, b, m.lora_B.weight)
        local r, alpha = rank_alpha(h[1])
        present[#present + 1] = {h = h, a = a, b = b, mag = mag, r = r, alpha = alpha}
      end
    end
    if #present == 0 then raise("lora.load: " .. dir .. " has no adapter for " .. name .. " (" .. hs[1][1] .. ")") end
    -- one shared A (what lutra writes for a fused layer) or independent adapters (row blocks)
    local shared = #present == #hs and rawget(m, "blocks") == nil
    for i = 2, #present do
      if shared and (present[i].r ~= present[1].r or present[i].alpha ~= present[1].alpha
          or present[i].a:size(0) ~= present[1].a:size(0) or no_grad(function()
            return (present[i].a:to("f64") - present[1].a:to("f64")):abs():max():item() end) ~= 0) then
        shared = false
      end
    end
    rawset(m, "alpha", present[1].alpha)
    rawset(m, "rslora", conf.rslora)
    if shared then
      rawset(m, "r", present[1].r)
      rawset(m, "scaling", conf.rslora and m.alpha / math.sqrt(m.r) or m.alpha / m.r)
      local wa, wb = m.lora_A.weight, m.lora_B.weight
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
        blocks[i] = {p.h[2], p.h[3], r = p.r, alpha = p.alpha}
        if same then
          local _, r, alpha = m:block(i)
          same = m.blocks[i][1] == p.h[2] and m.blocks[i][2] == p.h[3] and r == p.r and alpha == p.alpha
        end
        if p.a:size(0) ~= p.r or p.a:size(1) ~= m.in_features then shape_error(name, p.h[1] .. " A", p.a, {p.r, m.in_features}) end
        if p.b:size(0) ~= p.h[3] or p.b:size(1) ~= p.r then shape_error(name, p.h[1] .. " B", p.b, {p.h[3], p.r}) end
      end
      rawset(m, "r", present[1].r)
      rawset(m, "scaling", conf.rslora and m.alpha / math.sqrt(m.r) or m.alpha / m.r)
      if not same then
        for _, b in ipairs(blocks) do
          if b.r == m.r and b.alpha == m.alpha then b.r, b.alpha = nil, nil end
        end
        m:set_blocks(blocks)
      end
      local wa, wb = m.lora_A.weight, m.lora_B.weight
      no_grad(function()
        wb:zero_()
        for i, p in ipairs(present) do
          local col, r = m:block(i)
          wa:narrow(0, col, r):copy_(p.a)
          wb:narrow(0, p.h[2], p.h[3]):narrow(1, col, r):copy_(p.b)
        end
      end)
    end
    if conf.dora then
      if rawget(m, "lora_magnitude") == nil then m:enable_dora() end
      local mag = m.lora_magnitude
      for _, p in ipairs(present) do
        check(p.h[1] .. SUFFIX[3], p.mag, mag)
        local dst = p.h[2] and mag:narrow(0, p.h[2], p.h[3]) or mag
        if p.mag:dim() ~= 1 or p.mag:size(0) ~= dst:size(0) then shape_error(name, p.h[1] .. " magnitude", p.mag, dst.shape) end
        no_grad(function() dst:copy_(p.mag) end)
      end
    elseif rawget(m, "lora_magnitude") ~= nil then
      raise("lora.load: " .. conf.path .. ": use_dora is false, and " .. name .. " has DoRA (lora.apply dora = true)")
    end
  end
  local keys = {}
  for k in pairs(tensors) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    if not used[k] and (k:find("%.lora_[AB]%.") or k:find("%.lora_magnitude_vector$")) then
      raise("lora.load: " .. dir .. ": " .. PREFIX .. k .. " matches no LoRA layer of this model")
    end
  end
  base_params.load(model, tensors, conf, used, check, "lora.load: " .. file)
  return model
end

return M
