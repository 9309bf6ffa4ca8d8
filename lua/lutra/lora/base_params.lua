-- lutra.lora.base_params — the base model's own tensors that a peft adapter carries besides the
-- LoRA weights, as peft 0.21 trains and saves them:
--   bias = "all"        every bias of the model trains and is saved (norm biases too);
--   bias = "lora_only"  the biases of the adapted layers train and are saved (of a fused layer
--                       adapted on some row blocks, those rows alone);
--   modules_to_save     whole modules (lm_head, embed_tokens/wte, ...) train as copies of the base's
--                       (peft's ModulesToSaveWrapper: lora.disable runs the originals) and are saved.
-- peft writes them under their Hugging Face parameter names ("<module>.base_layer.bias" for an
-- adapted layer). With tied embeddings, saving one of wte/lm_head unties them, as peft does (its
-- copy is a new tensor; the other keeps the base's): cfg.tie_embeddings becomes false.
local errors = require "lutra.errors"
local grad = require "lutra.nn.grad"
local create = require "lutra.create"
local hf_names = require "lutra.lora.hf_names"
local linear = require "lutra.lora.linear"

local raise = errors.raise

local M = {}

local function split(name) return name:match("^(.*)%.([^.]+)$") end

-- Hugging Face parameter name -> {lt = lutra parameter name, rows = {first, n} or nil, t = transposed}
-- and lutra parameter name -> list of those (the map of lutra.hf.weights; the tied lm_head added).
function M.param_map(model)
  local cache = rawget(model, "_peft_params")
  if cache then return cache end
  local fam = hf_names.family(model)
  local by_hf, by_lt = {}, {}
  local function add(e)
    by_hf[e.hf] = e
    by_lt[e.lt] = by_lt[e.lt] or {}
    table.insert(by_lt[e.lt], e)
  end
  local ok, W = pcall(require, "lutra.hf.weights")
  if fam and ok and type(W) == "table" and W.entries then
    for _, e in ipairs(W.entries(model.cfg, fam)) do add({hf = e.hf, lt = e.lt, rows = e.rows, t = e.t}) end
  end
  if not by_hf["lm_head.weight"] then add({hf = "lm_head.weight", lt = "lm_head.weight"}) end
  for name in pairs(model:state_dict()) do
    if not by_lt[name] then add({hf = name, lt = name}) end
  end
  cache = {by_hf = by_hf, by_lt = by_lt}
  rawset(model, "_peft_params", cache)
  return cache
end

local function modules_by_name(model)
  local out = {}
  for name, m in model:named_modules() do out[name] = m end
  return out
end

-- Unties wte and lm_head when one of them is about to get its own tensor.
local function untie(model)
  if model.lm_head and model.wte and rawequal(model.lm_head.weight, model.wte.weight) then
    local copy = grad.no_grad(function() return model.wte.weight:detach():clone() end)
    rawset(model.lm_head, "weight", copy)
    if type(model.cfg) == "table" then model.cfg.tie_embeddings = false end
    rawset(model, "_peft_params", nil)
  end
end

-- The lutra modules that peft's modules_to_save names (a module matches a name when its Hugging
-- Face module name is that name or ends with "." .. name, or its lutra name does): list of names.
function M.resolve(model, names, who)
  local map, mods = M.param_map(model), modules_by_name(model)
  local found, seen = {}, {}
  for _, want in ipairs(names) do
    if type(want) ~= "string" then raise(who .. ": modules_to_save must be a list of module names") end
    local hit = false
    local lts = {}
    for lt in pairs(map.by_lt) do lts[#lts + 1] = lt end
    table.sort(lts) -- (errors name the first, the same each run)
    for _, lt in ipairs(lts) do
      local entries = map.by_lt[lt]
      local mod_lt = split(lt)
      for _, e in ipairs(entries) do
        local mod_hf = split(e.hf)
        if mod_hf and (mod_hf == want or mod_hf:sub(-#want - 1) == "." .. want or mod_lt == want) then
          if e.rows then
            raise(string.format("%s: modules_to_save '%s' is part of lutra's fused '%s' (lutra saves whole modules)",
              who, want, mod_lt))
          end
          hit = true
          if not seen[mod_lt] then
            seen[mod_lt] = true
            found[#found + 1] = mod_lt
          end
        end
      end
    end
    if not hit then raise(string.format("%s: modules_to_save '%s' matches no module of this model", who, want)) end
  end
  table.sort(found)
  for _, n in ipairs(found) do
    if linear.is_lora(mods[n]) then
      raise(string.format("%s: '%s' has a LoRA adapter and is in modules_to_save (peft refuses both too)", who, n))
    end
  end
  return found
end

-- Sets the trainable biases and the modules_to_save copies of a model lora.apply has wrapped.
-- bias: "none", "all", "lora_only"; mts: list of module names (or nil). Records model._lora.bias,
-- .modules_to_save (the names as given) and .saved ({module, key, original} for lora.disable).
function M.setup(model, bias, mts, who)
  local cfg = rawget(model, "_lora")
  cfg.bias, cfg.modules_to_save, cfg.saved = bias, mts, cfg.saved or {}
  if bias == "all" then
    for name, p in model:named_parameters() do
      if name:match("%.bias$") then grad.set_requires_grad(p, true) end
    end
  elseif bias == "lora_only" then
    for _, l in ipairs(linear.layers(model)) do
      local m = l[2]
      if m.bias ~= nil then
        grad.set_requires_grad(m.bias, true)
        -- a fused layer adapted on some row blocks (peft: some of q_proj, k_proj, v_proj): only
        -- those rows' biases train (their gradient elsewhere is zero), as only theirs are saved
        m.bias:register_hook(function(g)
          local blocks = rawget(m, "blocks")
          if blocks == nil then return nil end
          return grad.no_grad(function()
            local rows = create.zeros(g:size(0), {dtype = g.dtype, device = g.device})
            for _, b in ipairs(blocks) do rows:narrow(0, b[1], b[2]):fill_(1) end
            return g * rows
          end)
        end)
      end
    end
  end
  if mts then
    local mods = modules_by_name(model)
    for _, name in ipairs(M.resolve(model, mts, who)) do
      local mod = mods[name]
      if name == "lm_head" or name == "wte" then untie(model) end
      for _, key in ipairs {"weight", "bias"} do
        local t = rawget(mod, key)
        if t ~= nil then
          local copy = grad.no_grad(function() return t:detach():clone() end)
          rawset(mod, key, copy)
          grad.set_requires_grad(copy, true)
          table.insert(cfg.saved, {module = mod, key = key, original = t})
        end
      end
    end
    rawset(model, "_peft_params", nil)
  end
end

-- fn() with the modules_to_save originals in place (lora.disable).
function M.with_originals(model, fn)
  local cfg = rawget(model, "_lora")
  local saved = cfg and cfg.saved or {}
  local copies = {}
  for i, s in ipairs(saved) do
    copies[i] = rawget(s.module, s.key)
    rawset(s.module, s.key, s.original)
  end
  local res = {errors.pcall(fn)}
  for i, s in ipairs(saved) do rawset(s.module, s.key, copies[i]) end
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

-- The tensors to save: {key without "base_model.model." = tensor (cpu, contiguous)}, and the config's
-- bias and modules_to_save (Hugging Face module names).
function M.for_save(model)
  local cfg = rawget(model, "_lora") or {}
  local bias, out, mts = cfg.bias or "none", {}, nil
  local map = M.param_map(model)
  local wrapped = {}
  for _, l in ipairs(linear.layers(model)) do wrapped[l[1]] = l[2] end
  local sd = model:state_dict()
  local function adapted(mod, e) -- peft wraps this Hugging Face module (its bias is base_layer.bias)
    local m = wrapped[mod]
    if m == nil or not e.rows or rawget(m, "blocks") == nil then return m ~= nil end
    for _, b in ipairs(m.blocks) do
      if b[1] == e.rows[1] and b[2] == e.rows[2] then return true end
    end
    return false
  end
  local function put(lt_param, only_rows)
    local t = sd[lt_param]
    local mod = split(lt_param)
    for _, e in ipairs(map.by_lt[lt_param] or {{hf = lt_param}}) do
      local keep = true
      if only_rows and e.rows then
        keep = false
        for _, b in ipairs(only_rows) do keep = keep or (b[1] == e.rows[1] and b[2] == e.rows[2]) end
      end
      if keep then
        local v = t:detach()
        if e.rows then v = v:narrow(0, e.rows[1], e.rows[2]) end
        if e.t then v = v:t() end
        local hf_mod, leaf = split(e.hf)
        local key = adapted(mod, e) and hf_mod .. ".base_layer." .. leaf or e.hf
        out[key] = v:contiguous():to("cpu")
      end
    end
  end
  if bias == "all" then
    for name in pairs(sd) do
      if name:match("%.bias$") then put(name) end
    end
  elseif bias == "lora_only" then
    for name, m in pairs(wrapped) do
      if m.bias ~= nil then put(name .. ".bias", rawget(m, "blocks")) end
    end
  end
  if cfg.modules_to_save then
    mts = {}
    local seen = {}
    for _, s in ipairs(cfg.saved or {}) do
      for name, mod in model:named_modules() do
        if rawequal(mod, s.module) then
          put(name .. "." .. s.key)
          local hf = (map.by_lt[name .. "." .. s.key] or {{hf = name .. "." .. s.key}})[1].hf
          local short = split(hf):match("([^.]+)$")
          if not seen[short] then
            seen[short] = true
            mts[#mts + 1] = short
          end
        end
      end
    end
    table.sort(mts)
  end
  return out, bias, mts
end

-- Loads the base tensors of an adapter file (keys without the prefix: {key = tensor}) into model.
-- conf: lutra.lora.peft_config's. check(key, t, param) checks dtype and values; used[key] is set
-- for each key taken. A tensor the config does not explain is an error naming it.
function M.load(model, tensors, conf, used, check, where)
  local map = M.param_map(model)
  local wrapped = {}
  for _, l in ipairs(linear.layers(model)) do wrapped[l[1]] = true end
  local saved = {}
  for _, s in ipairs((rawget(model, "_lora") or {}).saved or {}) do saved[s.module] = true end
  local mods = modules_by_name(model)
  local keys = {}
  for key in pairs(tensors) do keys[#keys + 1] = key end
  table.sort(keys)
  for _, key in ipairs(keys) do
    local t = tensors[key]
    if not used[key] then
      local hf = key:gsub("%.base_layer%.", ".")
      local e = map.by_hf[hf]
      if e == nil then raise(string.format("%s: tensor '%s' names no parameter of this model", where, key)) end
      local mod_lt = split(e.lt)
      local is_bias = e.lt:match("%.bias$") ~= nil
      local ok = saved[mods[mod_lt]] or (is_bias and (conf.bias == "all" or conf.bias == "lora_only" and wrapped[mod_lt]))
      if not ok then
        raise(string.format("%s: tensor '%s' is neither an adapter weight nor explained by bias = \"%s\" or "
          .. "modules_to_save", where, key, conf.bias))
      end
      local param = rawget(mods[mod_lt], e.lt:match("([^.]+)$"))
      check(key, t, param)
      local dst = param
      if e.rows then dst = dst:narrow(0, e.rows[1], e.rows[2]) end
      local src = e.t and t:t() or t
      if src:numel() ~= dst:numel() or src:dim() ~= dst:dim() then
        raise(string.format("%s: tensor '%s' has shape [%s]; the model's is [%s]", where, key,
          table.concat(t.shape, ", "), table.concat(e.t and {dst:size(1), dst:size(0)} or dst.shape, ", ")))
      end
      for d = 0, src:dim() - 1 do
        if src:size(d) ~= dst:size(d) then
          raise(string.format("%s: tensor '%s' has shape [%s]; the model's is [%s]", where, key,
            table.concat(t.shape, ", "), table.concat(e.t and {dst:size(1), dst:size(0)} or dst.shape, ", ")))
        end
      end
      grad.no_grad(function() dst:copy_(src) end)
      used[key] = true
    end
  end
end

return M
