-- lutra.nn.ModuleList — an ordered list of modules: list[1], list[2], ... in Lua (ipairs
-- and # work), named "0", "1", ... in parameter names ("blocks.0.attn.qkv.weight"), as
-- PyTorch names them, so that state dicts map one to one. Assigning a plain list of
-- modules to a module's field makes one: self.blocks = {Block(cfg), Block(cfg)}.
local errors = require "lutra.errors"

local raise = errors.raise

return function(Module, declare)
  local ModuleList = Module:extend("ModuleList")

  local function put(self, k, m)
    if not Module.is_module(m) then raise("ModuleList: element " .. k .. " must be a module, got " .. type(m)) end
    if k ~= #self + 1 and rawget(self, k) == nil then
      raise(string.format("ModuleList: cannot set element %d of a list of %d (no holes)", k, #self))
    end
    declare(self, tostring(k - 1), k, "module")
    rawset(self, k, m)
  end

  ModuleList.__newindex = function(self, k, v)
    if type(k) == "number" then return put(self, k, v) end
    rawset(self, k, v)
  end

  function ModuleList:init(list)
    if list ~= nil and type(list) ~= "table" then
      raise("ModuleList: expected a list of modules, got " .. type(list))
    end
    for i, m in ipairs(list or {}) do put(self, i, m) end
  end

  -- list:append(m): m becomes the next entry (list[#list + 1]); returns the list.
  function ModuleList:append(m)
    put(self, #self + 1, m)
    return self
  end

  -- A ModuleList is a container, not a layer: calling it is refused (loop over its entries).
  function ModuleList:forward()
    raise("ModuleList: has no forward; loop over it: for i, m in ipairs(list) do x = m(x) end")
  end

  return ModuleList
end
