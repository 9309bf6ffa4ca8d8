-- lutra.lora.apply — lora.apply(model, opts): the chosen nn.Linears of a model replaced in
-- their parents by LoRALinears (lutra.lora.linear), everything else frozen. Targets are Lua
-- patterns on lutra's module names or on their Hugging Face names (lutra.lora.hf_names), or
-- "all-linear"; the options and the fused-layer rules: lutra.lora. peft's per-module options:
-- rank_pattern / alpha_pattern (lutra.lora.peft_config's matching, on Hugging Face module names),
-- layers (peft's layers_to_transform), dora (use_dora), bias and modules_to_save
-- (lutra.lora.base_params).
local Module = require "lutra.nn.module"
local Linear = require "lutra.nn.linear"
local errors = require "lutra.errors"
local O = require "lutra.nn.options"
local linear = require "lutra.lora.linear"
local hf_names = require "lutra.lora.hf_names"
local peft_config = require "lutra.lora.peft_config"
local base_params = require "lutra.lora.base_params"

local raise = errors.raise
local LoRALinear, is_lora = linear.LoRALinear, linear.is_lora

local M = {}

-- ---- options ---------------------------------------------------------------------------------------

local function check_opts(opts)
  opts = O.check("lora.apply", opts, {"targets", "r", "alpha", "dropout", "rslora", "freeze", "split_fused", "dora",
                                      "bias", "modules_to_save", "rank_pattern", "alpha_pattern", "layers"})
  local o = {}
  o.r = O.positive_int("lora.apply", "r", opts.r or 8)
  o.alpha = O.positive("lora.apply", "alpha", opts.alpha or 16)
  o.dropout = O.probability("lora.apply", "dropout", opts.dropout or 0)
  if o.dropout >= 1 then raise("lora.apply: dropout must be below 1, got " .. o.dropout) end
  o.rslora = O.boolean("lora.apply", "rslora", opts.rslora, false)
  o.freeze = O.boolean("lora.apply", "freeze", opts.freeze, true)
  o.split_fused = O.boolean("lora.apply", "split_fused", opts.split_fused, false)
  o.dora = O.boolean("lora.apply", "dora", opts.dora, false)
  o.bias = opts.bias or "none"
  if o.bias ~= "none" and o.bias ~= "all" and o.bias ~= "lora_only" then
    raise("lora.apply: bias must be \"none\", \"all\" or \"lora_only\", got " .. tostring(o.bias))
  end
  if opts.modules_to_save ~= nil then
    if type(opts.modules_to_save) ~= "table" then raise("lora.apply: modules_to_save must be a list of module names") end
    if #opts.modules_to_save > 0 then o.modules_to_save = opts.modules_to_save end
  end
  for _, key in ipairs {"rank_pattern", "alpha_pattern"} do
    local p = opts[key]
    if p ~= nil and type(p) ~= "table" then raise("lora.apply: " .. key .. " must be a table {pattern = number}") end
    -- (lora.load passes lutra.lora.peft_config's lists as they are)
    o[key] = (p and p[1] and p[1].lua) and p or peft_config.patterns(p, key)
  end
  if opts.layers ~= nil then
    if type(opts.layers) ~= "table" then raise("lora.apply: layers must be a list of layer indices") end
    local set = {}
    for k, v in pairs(opts.layers) do
      if type(k) == "number" then
        if type(v) ~= "number" or v ~= math.floor(v) or v < 0 then raise("lora.apply: layers must be a list of layer indices >= 0") end
        set[v] = true
      else
        set[k] = v -- a set already
      end
    end
    o.layers = set
  end
  local t = opts.targets or "all-linear"
  if type(t) == "string" and t ~= "all-linear" then t = {t} end
  if t ~= "all-linear" then
    if type(t) ~= "table" or #t == 0 then
      raise("lora.apply: targets must be \"all-linear\" or a list of Lua patterns on module names, got " .. type(t))
    end
    for _, p in ipairs(t) do
      if type(p) ~= "string" then raise("lora.apply: each target must be a Lua pattern (string), got " .. type(p)) end
      local ok, err = pcall(string.find, "", p)
      if not ok then raise("lora.apply: bad target pattern '" .. p .. "': " .. tostring(err)) end
    end
  end
  o.targets = t
  return o
end

-- The Linear modules of model as a list of {name =, module =, parent =, key =}, in traversal order.
local function linears(model)
  local found = {}
  Module._walk(model, "", function(mod, prefix)
    for _, e in ipairs(mod._entries) do
      local c = rawget(mod, e.key)
      if e.kind == "module" and c ~= nil and (getmetatable(c) == Linear or is_lora(c)) then
        found[#found + 1] = {name = prefix .. e.name, module = c, parent = mod, key = e.key}
      end
    end
  end, {})
  return found
end

local function selected(name, targets)
  if targets == "all-linear" then return not name:find("^lm_head$") and not name:find("%.lm_head$") end
  for _, p in ipairs(targets) do
    if name:find(p) then return true end
  end
  return false
end

-- Wraps the chosen Linears of model (in place) and freezes everything else. Returns model and
-- the list of wrapped module names.
function M.apply(model, opts)
  if not Module.is_module(model) then raise("lora.apply: expected a module, got " .. type(model)) end
  local o = check_opts(opts)
  local all = linears(model)
  local chosen, hits = {}, {}
  -- a Linear is chosen by its lutra name, or by its Hugging Face module names (PEFT's
  -- target_modules: "q_proj", "c_attn"); a fused layer of which only some parts are named
  -- (or every part with split_fused) gets independent adapters on those row blocks
  local function choose(l)
    if o.layers then
      local i = tonumber(l.name:match("^blocks%.(%d+)%."))
      if i == nil or not o.layers[i] then return false end
    end
    if selected(l.name, o.targets) then
      if o.targets ~= "all-linear" then
        for _, p in ipairs(o.targets) do
          if l.name:find(p) then hits[p] = true end
        end
      end
      local hs = o.split_fused and hf_names.hf_names(model, l.name) or {}
      if #hs > 1 then return true, hs end
      return true, nil
    end
    if o.targets == "all-linear" then return false end
    local hs, parts = hf_names.hf_names(model, l.name), {}
    for _, h in ipairs(hs) do
      for _, p in ipairs(o.targets) do
        if h[1]:find(p) then
          hits[p] = true
          parts[#parts + 1] = h
          break
        end
      end
    end
    if #parts == 0 then return false end
    if #hs == 1 then return true, nil end
    return true, parts
  end
  for _, l in ipairs(all) do
    local sel, parts = choose(l)
    if sel and is_lora(l.module) then raise("lora.apply: '" .. l.name .. "' already has an adapter") end
    if sel then
      l.parts = parts
      chosen[#chosen + 1] = l
    end
  end
  if o.targets ~= "all-linear" then
    for _, p in ipairs(o.targets) do
      if not hits[p] then
        local names = {}
        for _, l in ipairs(all) do names[#names + 1] = l.name end
        raise(string.format("lora.apply: target '%s' matches no Linear module (they are: %s)", p,
          table.concat(names, ", ")))
      end
    end
  end
  if #chosen == 0 then raise("lora.apply: no Linear module to wrap") end
  if o.freeze then model:freeze() end
  local names = {}
  local function rank_alpha(hf)
    return peft_config.pattern_value(o.rank_pattern, hf, o.r, "rank_pattern", "lora.apply"),
      peft_config.pattern_value(o.alpha_pattern, hf, o.alpha, "alpha_pattern", "lora.apply")
  end
  for _, l in ipairs(chosen) do
    local parts = l.parts or hf_names.hf_names(model, l.name)
    local blocks, same = {}, true
    for i, h in ipairs(parts) do
      local r, a = rank_alpha(h[1])
      blocks[i] = {h[2], h[3], r = r, alpha = a}
      same = same and r == blocks[1].r and a == blocks[1].alpha
    end
    local lo = {r = blocks[1].r, alpha = blocks[1].alpha, dropout = o.dropout, rslora = o.rslora}
    local wrapped = LoRALinear(l.module, lo)
    if l.parts or (#parts > 1 and not same) then
      for _, b in ipairs(blocks) do
        if b[1] == nil then raise("lora.apply: '" .. l.name .. "' has no row blocks to give their own r and alpha") end
        if same then b.r, b.alpha = nil, nil end -- the layer's (the blocks compare equal to {first, rows})
      end
      wrapped:set_blocks(blocks)
    end
    if o.dora then wrapped:enable_dora() end
    if type(l.key) == "string" then
      l.parent[l.key] = wrapped -- same entry, same declaration order
    else
      rawset(l.parent, l.key, wrapped) -- a ModuleList slot
    end
    names[#names + 1] = l.name
  end
  local cfg = {r = o.r, alpha = o.alpha, dropout = o.dropout, rslora = o.rslora, targets = o.targets, modules = names,
               dora = o.dora}
  rawset(model, "_lora", cfg)
  base_params.setup(model, o.bias, o.modules_to_save, "lora.apply")
  return model, names
end

return M
