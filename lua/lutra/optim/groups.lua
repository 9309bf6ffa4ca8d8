-- lutra.optim.groups — parameter groups: what an optimizer is given, made uniform, and
-- the weight-decay split built from a module's named parameters.
--
--   optim.param_groups(model, {weight_decay = 0.1})   -- or a list of {name, tensor} pairs
--   --> { {params = {...}, names = {...}},                       decayed (the optimizer's wd)
--         {params = {...}, names = {...}, weight_decay = 0} }    no decay
--
-- No decay by default for 1-D parameters (biases, norm gains) and for parameters whose
-- dotted name matches an embedding pattern (optim.EMBEDDING_PATTERNS, Lua patterns).
-- opts.no_decay overrides the rule:
--   a list of Lua patterns   1-D parameters and names matching one of them ({} is
--                            nanoGPT's and the peer's rule: decay every matrix,
--                            embeddings included)
--   function(name, p)        true for no decay, exactly
-- Groups keep the parameters' order; an empty group is left out.
local errors = require "lutra.errors"
local ops = require "lutra.ops"

local M = {}

local raise, is_tensor = errors.raise, ops.is_tensor

-- Token and position embeddings as the model zoo and Hugging Face name them.
M.EMBEDDING_PATTERNS = {"embed", "%f[%w]wte%f[%W]", "%f[%w]wpe%f[%W]", "%f[%w]tok_emb", "%f[%w]pos_emb"}

-- The (name, tensor) pairs of a module or of what named_parameters() returned: an
-- iterator function, a list of {name, tensor} (or {name =, param =}) pairs, a list of
-- names with the tensors under the same table's name keys, or a name -> tensor map
-- (taken in sorted name order).
function M.named_list(src, who)
  who = who or "param_groups"
  if type(src) == "table" and type(src.named_parameters) == "function" then src = src:named_parameters() end
  local names, params = {}, {}
  local function add(name, p)
    if type(name) ~= "string" then raise(string.format("%s: parameter names must be strings, got %s", who, type(name))) end
    if not is_tensor(p) then raise(string.format("%s: parameter '%s' is %s, not a tensor", who, name, type(p))) end
    names[#names + 1], params[#params + 1] = name, p
  end
  if type(src) == "function" then
    for name, p in src do add(name, p) end
  elseif type(src) == "table" and src[1] ~= nil then
    for _, e in ipairs(src) do
      if type(e) == "table" then
        add(e[1] or e.name, e[2] or e.param or e.tensor)
      elseif type(e) == "string" then
        add(e, src[e])
      else
        raise(string.format("%s: expected {name, tensor} pairs, got a %s entry", who, type(e)))
      end
    end
  elseif type(src) == "table" then
    local sorted = {}
    for name in pairs(src) do sorted[#sorted + 1] = name end
    table.sort(sorted, function(a, b) return tostring(a) < tostring(b) end)
    for _, name in ipairs(sorted) do add(name, src[name]) end
  else
    raise(string.format("%s: expected a module or named parameters, got %s", who, type(src)))
  end
  return names, params
end

-- The no-decay predicate for opts.no_decay (see the header).
function M.no_decay_rule(rule)
  if type(rule) == "function" then return rule end
  local patterns = rule
  if patterns == nil then patterns = M.EMBEDDING_PATTERNS end
  if type(patterns) ~= "table" then
    raise("param_groups: no_decay must be a list of name patterns or a function(name, p), got " .. type(rule))
  end
  for _, pat in ipairs(patterns) do
    if type(pat) ~= "string" then raise("param_groups: no_decay patterns must be strings, got " .. type(pat)) end
  end
  return function(name, p)
    if p.ndim < 2 then return true end
    for _, pat in ipairs(patterns) do
      if name:find(pat) then return true end
    end
    return false
  end
end

local GROUP_OPTS = {weight_decay = true, no_decay = true}

-- Two groups from named parameters: decayed, then not decayed (see the header).
function M.param_groups(src, opts)
  opts = opts or {}
  if type(opts) ~= "table" then raise("param_groups: opts must be a table, got " .. type(opts)) end
  for k in pairs(opts) do
    if not GROUP_OPTS[k] then raise("param_groups: unknown option '" .. tostring(k) .. "' (weight_decay, no_decay)") end
  end
  local names, params = M.named_list(src, "param_groups")
  local no_decay = M.no_decay_rule(opts.no_decay)
  local decay = {params = {}, names = {}, weight_decay = opts.weight_decay}
  local plain = {params = {}, names = {}, weight_decay = 0}
  -- a module's frozen parameters (requires_grad false: LoRA's base, freeze()) are left out,
  -- when some of them do train (a list of plain tensors keeps them all)
  local from_module = false
  if type(src) == "table" and type(src.named_parameters) == "function" then
    for _, p in ipairs(params) do
      if p.requires_grad then from_module = true break end
    end
  end
  for i, name in ipairs(names) do
    local g = no_decay(name, params[i]) and plain or decay
    if from_module and not params[i].requires_grad then g = nil end
    if g then
    g.params[#g.params + 1], g.names[#g.names + 1] = params[i], name
    end
  end
  local groups = {}
  if #decay.params > 0 then groups[#groups + 1] = decay end
  if #plain.params > 0 then groups[#groups + 1] = plain end
  return groups
end

-- Makes what an optimizer was given into a list of groups {params =, names = (or nil),
-- settings...}, copies (the caller's tables are not changed):
--   a module (named_parameters)      -> param_groups(module, auto)
--   a tensor, a list of tensors      -> one group
--   a list of group tables           -> those groups ({params = tensors} or
--                                       {named = module or pairs}, plus settings)
function M.normalize(who, src, auto)
  if is_tensor(src) then return {{params = {src}}} end
  if type(src) ~= "table" then raise(string.format("%s: expected parameters (tensors, groups or a module), got %s", who, type(src))) end
  if type(src.named_parameters) == "function" then return M.param_groups(src, auto) end
  if src[1] == nil then raise(who .. ": no parameters given") end
  if is_tensor(src[1]) then
    local params = {}
    for i, p in ipairs(src) do
      if not is_tensor(p) then raise(string.format("%s: parameter %d is %s, not a tensor", who, i, type(p))) end
      params[i] = p
    end
    return {{params = params}}
  end
  local groups = {}
  for gi, g in ipairs(src) do
    if type(g) ~= "table" or is_tensor(g) then
      raise(string.format("%s: group %d must be a table {params = ...}, got %s", who, gi, type(g)))
    end
    local out = {}
    for k, v in pairs(g) do
      if k ~= "params" and k ~= "named" then out[k] = v end
    end
    if g.named ~= nil then
      out.names, out.params = M.named_list(g.named, who)
    elseif is_tensor(g.params) then
      out.params = {g.params}
    elseif type(g.params) == "table" then
      out.params = {}
      for i, p in ipairs(g.params) do
        if not is_tensor(p) then raise(string.format("%s: group %d: parameter %d is %s, not a tensor", who, gi, i, type(p))) end
        out.params[i] = p
      end
      if g.names ~= nil then
        if type(g.names) ~= "table" or #g.names ~= #out.params then
          raise(string.format("%s: group %d: names must list one name per parameter", who, gi))
        end
        out.names = {unpack(g.names)}
      end
    else
      raise(string.format("%s: group %d has no params (a list of tensors, or named = ...)", who, gi))
    end
    groups[gi] = out
  end
  return groups
end

return M
