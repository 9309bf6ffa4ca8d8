-- lutra.lora.apply — lora.apply(model, opts): the chosen nn.Linears of a model replaced in
-- their parents by LoRALinears (lutra.lora.linear), everything else frozen. Targets are Lua
-- patterns on lutra's module names or on their Hugging Face names (lutra.lora.hf_names), or
-- "all-linear"; the options and the fused-layer rules: lutra.lora.
local Module = require "lutra.nn.module"
local Linear = require "lutra.nn.linear"
local errors = require "lutra.errors"
local O = require "lutra.nn.options"
local linear = require "lutra.lora.linear"
local hf_names = require "lutra.lora.hf_names"

local raise = errors.raise
local LoRALinear, is_lora = linear.LoRALinear, linear.is_lora

local M = {}

-- ---- options ---------------------------------------------------------------------------------------

local function check_opts(opts)
  opts = O.check("lora.apply", opts, {"targets", "r", "alpha", "dropout", "rslora", "freeze", "split_fused"})
  local o = {}
  o.r = O.positive_int("lora.apply", "r", opts.r or 8)
  o.alpha = O.positive("lora.apply", "alpha", opts.alpha or 16)
  o.dropout = O.probability("lora.apply", "dropout", opts.dropout or 0)
  if o.dropout >= 1 then raise("lora.apply: dropout must be below 1, got " .. o.dropout) end
  o.rslora = O.boolean("lora.apply", "rslora", opts.rslora, false)
  o.freeze = O.boolean("lora.apply", "freeze", opts.freeze, true)
  o.split_fused = O.boolean("lora.apply", "split_fused", opts.split_fused, false)
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
  for _, l in ipairs(chosen) do
    local wrapped = LoRALinear(l.module, o)
    if l.parts then
      local blocks = {}
      for i, h in ipairs(l.parts) do blocks[i] = {h[2], h[3]} end
      wrapped:set_blocks(blocks)
    end
    if type(l.key) == "string" then
      l.parent[l.key] = wrapped -- same entry, same declaration order
    else
      rawset(l.parent, l.key, wrapped) -- a ModuleList slot
    end
    names[#names + 1] = l.name
  end
  local cfg = {r = o.r, alpha = o.alpha, dropout = o.dropout, rslora = o.rslora, targets = o.targets, modules = names}
  rawset(model, "_lora", cfg)
  return model, names
end

return M
