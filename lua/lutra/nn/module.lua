-- lutra.nn.Module — the base of every layer and model: a Lua table that holds its
-- parameters, buffers and submodules under names, in the order they were declared.
--
--   local lt = require "lutra"
--   local nn = lt.nn
--   local Gate = nn.Module:extend("Gate")
--   function Gate:init(d)                       -- the constructor: Gate(d) calls it
--     self.fc = nn.Linear(d, d)                 -- a module field: a submodule
--     self.scale = lt.parameter(lt.ones(d))     -- a declared parameter (requires grad)
--     self:param("shift", lt.zeros(d))          -- the same, by name
--     self:buffer("steps", lt.zeros(1))         -- a buffer: saved and moved, not trained
--     self.d = d                                -- anything else: a plain field
--   end
--   function Gate:forward(x)
--     local y = self.fc(x):sigmoid() * self.scale + self.shift
--     self.last = y:detach()                    -- a tensor set outside init: a plain field
--     return y
--   end
--   local g = Gate(8); local y = g(x)           -- calling a module calls forward
--
-- Parameters are declared, as in PyTorch: a field is a parameter only when it is given a
-- tensor marked by lt.parameter(t) (lutra/nn/parameter.lua), or through self:param(name, t);
-- a buffer only through self:buffer(name, t, persistent). A module (or a plain list of
-- modules, made into an nn.ModuleList) given to a new field is a submodule. Any other
-- tensor on a module is a plain field: not in parameters() or state_dict(), saved nowhere,
-- not moved or converted by to(), its autograd history kept (self.aux = loss keeps the
-- loss's gradient). A parameter must be a floating-point leaf tensor.
--
-- Transition (one release): an unmarked tensor given to a new field inside init() (the
-- constructor, and whatever it calls) is an error that says what to write, because until
-- now that declared a parameter: self.scale = lt.parameter(t), self:param("scale", t),
-- self:buffer("scale", t), or rawset(self, "scale", t) for a plain field. Outside init the
-- same assignment is a plain field, silently.
--
-- Later assignments to a declared field replace its value and keep its kind: a new tensor
-- for a parameter is that parameter (`lm_head.weight = wte.weight` ties two layers: one
-- tensor, one parameter). Names starting with "_" are never declared, nor fields set with
-- rawset.
--
-- Traversal is pre-order, as PyTorch's: a module's own parameters (in declaration
-- order), then each submodule's. Names are dotted paths: "blocks.0.attn.qkv.weight".
-- parameters() and named_parameters() list each tensor once (the first name of a
-- tied tensor); state_dict() has every name. The rest: train/eval, apply, modules,
-- named_modules, freeze/unfreeze, zero_grad, to, num_parameters, state_dict and
-- load_state_dict (lutra/nn/state_dict.lua), and tostring(m), a tree with parameter
-- counts (lutra/nn/summary.lua).
local ops = require "lutra.ops"
local errors = require "lutra.errors"
local dtype = require "lutra.dtype"
local fields = require "lutra.tensor.fields"
local grad = require "lutra.nn.grad"
local traverse = require "lutra.nn.traverse"
local state = require "lutra.nn.state_dict"
local parameter = require "lutra.nn.parameter"

local raise, is_tensor = errors.raise, ops.is_tensor

local Module = {__name = "Module"}

-- Whether v is a module (an instance of nn.Module or a subclass).
local function is_module(v) return type(v) == "table" and rawget(v, "_entries") ~= nil end

-- Entries: {name =, key =, kind = "param" | "module" | "buffer"}, in declaration order;
-- key is the raw table key of the value (the name, or a number in a ModuleList).
local function declare(self, name, key, kind, persistent)
  local entries, by_key = rawget(self, "_entries"), rawget(self, "_by_key")
  local e = by_key[key]
  if e then
    if e.kind ~= kind then
      raise(string.format("%s: '%s' is a %s, cannot assign a %s to it", self.__name, name, e.kind, kind))
    end
  else
    e = {name = name, key = key, kind = kind}
    entries[#entries + 1] = e
    by_key[key] = e
  end
  e.persistent = kind ~= "buffer" or persistent ~= false
end

local function check_param(self, name, t)
  parameter.check(string.format("%s: parameter '%s'", self.__name, name), t)
  if not grad.requires_grad(t) and not rawget(self, "_frozen") then grad.set_requires_grad(t, true) end
  parameter.mark(t)
end

-- The transition error: a tensor given to a new field in init() used to declare a parameter.
local function implicit_param_error(self, k)
  raise(string.format("%s: field '%s' is given a tensor in init(); parameters are declared now, a tensor "
    .. "assigned to a field no longer becomes one. Write self.%s = lt.parameter(t) or self:param(\"%s\", t) for a "
    .. "parameter, self:buffer(\"%s\", t) for a buffer, or rawset(self, \"%s\", t) for a plain field (not saved, "
    .. "not moved by to())", self.__name, k, k, k, k, k))
end

-- The kind of value v: "param" (a tensor), "module", or nil (anything else).
local function value_kind(v)
  if is_tensor(v) then return "param" end
  if is_module(v) then return "module" end
end

-- What assigning v to a field k that holds nil means (the metatable's __newindex).
local function assign(self, k, v)
  if type(k) == "string" and k:sub(1, 1) ~= "_" and v ~= nil then
    if type(v) == "table" and getmetatable(v) == nil and #v > 0 and is_module(v[1]) then v = Module.ModuleList(v) end
    local e = rawget(self, "_by_key")[k]
    if e ~= nil then -- a declared field, emptied before: its kind holds
      local kind = value_kind(v)
      if kind == "param" and e.kind == "buffer" then
        kind = "buffer"
      elseif kind ~= e.kind then
        raise(string.format("%s: '%s' is a %s, cannot assign a %s to it", self.__name, k, e.kind, kind or type(v)))
      end
      if kind == "param" then check_param(self, k, v) end
    elseif is_tensor(v) then
      if parameter.is_parameter(v) then
        check_param(self, k, v)
        declare(self, k, k, "param")
      elseif rawget(self, "_in_init") then
        implicit_param_error(self, k)
      end -- else a plain field
    elseif is_module(v) then
      declare(self, k, k, "module")
    end
  end
  rawset(self, k, v)
end

-- ---- classes -----------------------------------------------------------------------------------

local function construct(cls, ...)
  local self = setmetatable({_entries = {}, _by_key = {}, training = true, _in_init = true}, cls)
  self:init(...)
  rawset(self, "_in_init", nil)
  return self
end

-- A subclass: Sub = Base:extend("Sub"); Sub(...) makes one and calls Sub.init(self, ...).
-- Sub.super is Base (Sub.super.init(self, ...) runs the parent's constructor).
function Module.extend(parent, name)
  if type(name) ~= "string" then raise("Module:extend: expected a class name, got " .. type(name)) end
  local cls = {__name = name, super = parent}
  cls.__index = cls
  cls.__newindex = parent.__newindex
  cls.__call = function(self, ...) return self:forward(...) end
  cls.__tostring = function(self) return require("lutra.nn.summary").tree(self) end
  return setmetatable(cls, {__index = parent, __call = construct, __tostring = function() return "class " .. name end})
end

function Module:init() end

function Module:forward()
  raise(self.__name .. ": forward is not defined (define " .. self.__name .. ":forward(...))")
end

-- One line describing this module's own settings, shown in the tree: "64, 32".
function Module:extra_repr() return "" end

-- ---- declaring ---------------------------------------------------------------------------------

-- self:param(name, t): declares tensor t as the parameter `name` (a floating-point leaf); returns t.
function Module:param(name, t)
  if type(name) ~= "string" then raise(self.__name .. ":param: the name must be a string") end
  if not is_tensor(t) then raise(self.__name .. ":param: '" .. name .. "' must be a tensor, got " .. type(t)) end
  check_param(self, name, t)
  declare(self, name, name, "param")
  rawset(self, name, t)
  return t
end

-- self:add(name, m): declares module m as the submodule `name`; returns m.
function Module:add(name, m)
  if type(name) ~= "string" then
    raise(self.__name .. ":add: the name must be a string (add(name, module) names a child"
      .. (is_module(name) and "; to add to a ModuleList, use list:append(module)" or "") .. ")")
  end
  if not is_module(m) then raise(self.__name .. ":add: '" .. name .. "' must be a module, got " .. type(m)) end
  declare(self, name, name, "module")
  rawset(self, name, m)
  return m
end

-- A tensor saved with the state (persistent ~= false) and moved by to(), never trained.
function Module:buffer(name, t, persistent)
  if type(name) ~= "string" then raise(self.__name .. ":buffer: the name must be a string") end
  if t ~= nil and not is_tensor(t) then raise(self.__name .. ":buffer: '" .. name .. "' must be a tensor or nil") end
  declare(self, name, name, "buffer", persistent)
  rawset(self, name, t)
  return t
end

-- ---- traversal ---------------------------------------------------------------------------------

local walk, collect = traverse.walk, traverse.collect
Module._walk, Module._collect = walk, collect

local function pairs_iter(names, values)
  local i = 0
  return function()
    i = i + 1
    if names[i] ~= nil then return names[i], values[i] end
  end
end

-- The parameters as a list, each tensor once, in traversal order.
function Module:parameters()
  local _, ts = collect(self, "param")
  return ts
end

-- for name, p in m:named_parameters() do ... end (each tensor once, first name).
function Module:named_parameters()
  return pairs_iter(collect(self, "param"))
end

-- The buffers (self:buffer's tensors), a list in traversal order.
function Module:buffers()
  local _, ts = collect(self, "buffer")
  return ts
end

-- for name, b in m:named_buffers() do ... end.
function Module:named_buffers() return pairs_iter(collect(self, "buffer")) end

-- Every module (self first), each once.
function Module:modules()
  local list = {}
  walk(self, "", function(mod) list[#list + 1] = mod end, {})
  return list
end

-- for name, mod in m:named_modules() do ... end; self is named "".
function Module:named_modules()
  local names, mods = {}, {}
  walk(self, "", function(mod, prefix)
    names[#names + 1] = prefix:sub(1, -2)
    mods[#mods + 1] = mod
  end, {})
  return pairs_iter(names, mods)
end

-- for name, mod in m:children() do ... end: the direct submodules.
function Module:children()
  local names, mods = {}, {}
  for _, e in ipairs(self._entries) do
    local c = rawget(self, e.key)
    if e.kind == "module" and c ~= nil then
      names[#names + 1], mods[#mods + 1] = e.name, c
    end
  end
  return pairs_iter(names, mods)
end

-- Calls fn(module) on every submodule, then on self (PyTorch's order). Returns self.
function Module:apply(fn)
  local mods = self:modules()
  for i = #mods, 1, -1 do fn(mods[i]) end
  return self
end

-- Training mode on (mode nil or true) or off for self and every submodule (Dropout reads it).
-- Returns self.
function Module:train(mode)
  if mode == nil then mode = true end
  for _, m in ipairs(self:modules()) do rawset(m, "training", mode and true or false) end
  return self
end

-- m:train(false): evaluation mode. Returns self.
function Module:eval() return self:train(false) end

-- requires_grad off (freeze) or on (unfreeze) for every parameter, or only those whose
-- name matches the Lua pattern `pattern`. Returns self.
local function set_trainable(self, flag, pattern)
  if pattern ~= nil and type(pattern) ~= "string" then raise("freeze: the pattern must be a string") end
  local names, ts = collect(self, "param")
  for i, t in ipairs(ts) do
    if pattern == nil or names[i]:find(pattern) then grad.set_requires_grad(t, flag) end
  end
  if pattern == nil then
    for _, m in ipairs(self:modules()) do rawset(m, "_frozen", not flag or nil) end
  end
  return self
end

-- m:freeze(pattern), m:unfreeze(pattern): requires_grad off / on for every parameter, or for those
-- whose name matches the Lua pattern. Returns self.
function Module:freeze(pattern) return set_trainable(self, false, pattern) end
function Module:unfreeze(pattern) return set_trainable(self, true, pattern) end

-- Drops every parameter's gradient (t.grad = nil, as PyTorch's set_to_none).
function Module:zero_grad()
  for _, t in ipairs(self:parameters()) do grad.clear_grad(t) end
  return self
end

-- The number of parameter elements, each tensor counted once; {trainable = true}
-- counts only those that require grad.
function Module:num_parameters(opts)
  local n = 0
  for _, t in ipairs(self:parameters()) do
    if not (opts and opts.trainable) or grad.requires_grad(t) then n = n + t:numel() end
  end
  return n
end

-- Moves or converts every parameter and buffer in place: m:to("f64"), m:to("cuda:0"),
-- m:to("cuda", "bf16"), m:to{dtype=, device=}. A dtype applies to floating-point
-- tensors only. Tied tensors stay tied; gradients are dropped. Plain tensor fields (neither
-- parameters nor buffers) are left as they are. Returns self.
function Module:to(a, b)
  local dev, dt
  local function take(x)
    if x == nil then return end
    if type(x) == "table" then
      dev = x.device ~= nil and dtype.device_id(x.device) or dev
      dt = x.dtype ~= nil and dtype.id(x.dtype) or dt
    else
      local kind, id = dtype.device_or_dtype(x, "Module:to")
      if kind == "device" then dev = id else dt = id end
    end
  end
  take(a)
  take(b)
  local done = {}
  local function convert(t, is_param)
    if done[t] then return done[t] end
    local want_dt = (dt ~= nil and dtype.is_float(fields.dtype_id(t))) and dt or fields.dtype_id(t)
    local want_dev = dev or fields.device_id(t)
    local n = t
    if want_dt ~= fields.dtype_id(t) or want_dev ~= fields.device_id(t) then
      n = grad.no_grad(function() return grad.detach(t):to(dtype.device_name(want_dev), dtype.name(want_dt)) end)
      if is_param then
        grad.set_requires_grad(n, grad.requires_grad(t))
        parameter.mark(n)
      end
    end
    done[t] = n
    return n
  end
  for _, m in ipairs(self:modules()) do
    for _, e in ipairs(m._entries) do
      local t = rawget(m, e.key)
      if e.kind ~= "module" and t ~= nil then rawset(m, e.key, convert(t, e.kind == "param")) end
    end
  end
  return self
end

-- ---- state -------------------------------------------------------------------------------------

-- m:state_dict() -> {name = tensor}; m:load_state_dict(sd, {strict = true}) -> {missing_keys =,
-- unexpected_keys =}: lutra/nn/state_dict.lua.
function Module:state_dict(...) return state.state_dict(self, ...) end
function Module:load_state_dict(...) return state.load_state_dict(self, ...) end

-- A short description: "Linear(32, 96, bias=true)".
function Module:repr()
  local extra = self:extra_repr()
  if extra == nil or extra == "" then return self.__name end
  return self.__name .. "(" .. extra .. ")"
end

-- Module itself is a class too: nn.Module() is an empty container to add to.
Module.__index = Module
Module.__newindex = assign
Module.__call = function(self, ...) return self:forward(...) end
Module.__tostring = function(self) return require("lutra.nn.summary").tree(self) end
setmetatable(Module, {__call = construct, __tostring = function() return "class Module" end})

Module.is_module = is_module
Module.ModuleList = require("lutra.nn.module_list")(Module, declare)

return Module
