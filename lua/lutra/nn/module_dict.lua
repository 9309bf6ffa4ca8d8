-- nn.ModuleDict — modules under string keys, in the order they were added: dict.enc or
-- dict["enc"], named by their key in parameter names ("heads.enc.weight"), as PyTorch's
-- ModuleDict.
--
--   local heads = nn.ModuleDict{{"policy", nn.Linear(64, 10)}, {"value", nn.Linear(64, 1)}}
--   heads.aux = nn.Linear(64, 3)          -- a new key, added last
--   for name, m in heads:items() do ... end  -- "policy", "value", "aux"
--   heads:contains("value")               -- true
--
-- Order: a list of {key, module} pairs keeps its order; a table key -> module (which Lua does not
-- order) is added in sorted key order, so that every run names and saves alike. A key is a
-- non-empty string without "." that does not start with "_" and is not a ModuleDict method
-- ("items", "to", "train", ...: those stay methods).
local Module = require "lutra.nn.module"
local errors = require "lutra.errors"

local raise = errors.raise

local ModuleDict = Module:extend("ModuleDict")

local function check_key(self, k)
  if type(k) ~= "string" then raise("ModuleDict: a key must be a string, got " .. type(k)) end
  if k == "" or k:find(".", 1, true) or k:sub(1, 1) == "_" then
    raise("ModuleDict: key '" .. k .. "' is not a valid name (non-empty, no '.', not starting with '_')")
  end
  if ModuleDict[k] ~= nil or k == "training" then
    raise("ModuleDict: key '" .. k .. "' is the name of a ModuleDict method or field; choose another key")
  end
  if rawget(self, k) ~= nil and not Module.is_module(rawget(self, k)) then
    raise("ModuleDict: key '" .. k .. "' is taken by a field that is not a module")
  end
end

local function put(self, k, m)
  check_key(self, k)
  if not Module.is_module(m) then raise("ModuleDict: '" .. k .. "' must be a module, got " .. type(m)) end
  Module.add(self, k, m)
end

ModuleDict.__newindex = function(self, k, v)
  if v == nil then return end
  put(self, k, v)
end

-- dict:update(modules): adds or replaces each entry of modules: a list of {key, module}
-- pairs (in its order), a table key -> module (in sorted key order) or another ModuleDict
-- (in its order). Returns dict.
function ModuleDict:update(modules)
  if modules == nil then return self end
  if type(modules) ~= "table" then
    raise("ModuleDict: expected a list of {key, module} pairs or a table key -> module, got " .. type(modules))
  end
  if getmetatable(modules) == ModuleDict then
    for k, m in modules:items() do put(self, k, m) end
    return self
  end
  if Module.is_module(modules) then raise("ModuleDict: expected a table of modules, got a module") end
  if #modules > 0 then
    for i, pair in ipairs(modules) do
      if type(pair) ~= "table" or getmetatable(pair) ~= nil or #pair ~= 2 then
        raise(string.format("ModuleDict: entry %d must be a pair {key, module}", i))
      end
      put(self, pair[1], pair[2])
    end
    for k in pairs(modules) do
      if type(k) ~= "number" then raise("ModuleDict: a list of pairs cannot also have key '" .. tostring(k) .. "'") end
    end
    return self
  end
  local keys = {}
  for k in pairs(modules) do
    if type(k) ~= "string" then raise("ModuleDict: a key must be a string, got " .. type(k)) end
    keys[#keys + 1] = k
  end
  table.sort(keys)
  for _, k in ipairs(keys) do put(self, k, modules[k]) end
  return self
end

-- ModuleDict(modules): modules as update() takes them, or nothing (an empty dict).
function ModuleDict:init(modules) self:update(modules) end

-- dict:add(key, m): as dict[key] = m; returns m.
function ModuleDict:add(k, m)
  put(self, k, m)
  return m
end

-- for key, m in dict:items() do ... end, in order.
function ModuleDict:items() return self:children() end

-- The keys, a list in order.
function ModuleDict:keys()
  local list = {}
  for k in self:children() do list[#list + 1] = k end
  return list
end

-- The modules, a list in order.
function ModuleDict:values()
  local list = {}
  for _, m in self:children() do list[#list + 1] = m end
  return list
end

-- Whether key names a module of the dict.
function ModuleDict:contains(k)
  local e = type(k) == "string" and rawget(self, "_by_key")[k]
  return e ~= nil and e ~= false and rawget(self, k) ~= nil
end

-- The number of modules (Lua's # does not see them: they are under string keys).
function ModuleDict:len() return #self:keys() end

-- Removes key's module and returns it (nil when there is none).
function ModuleDict:pop(k)
  if not self:contains(k) then return nil end
  local m = rawget(self, k)
  local entries = rawget(self, "_entries")
  for i, e in ipairs(entries) do
    if e.key == k then
      table.remove(entries, i)
      break
    end
  end
  rawget(self, "_by_key")[k] = nil
  rawset(self, k, nil)
  return m
end

-- A ModuleDict is a container, not a layer: calling it is refused.
function ModuleDict:forward()
  raise("ModuleDict: has no forward; call its modules: dict.name(x), or for name, m in dict:items() do ... end")
end

return ModuleDict
