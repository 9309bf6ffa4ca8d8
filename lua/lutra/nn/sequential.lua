-- nn.Sequential(m1, m2, ...) or nn.Sequential{m1, m2, ...}: modules called in order, each on
-- the output of the one before: seq(x) = m_n(...m_2(m_1(x))). It is an nn.ModuleList with a
-- forward: seq[1] is the first module (Lua indexing is 1-based), named "0" in parameter names
-- as PyTorch names it ("0.weight", "head.2.bias"), seq:append(m) adds one at the end, and
-- ipairs and # work.
--
--   local mlp = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
--   local y = mlp(x)                    -- x (..., 8) -> (..., 8)
--   mlp:append(nn.Dropout(0.1))
local Module = require "lutra.nn.module"
local errors = require "lutra.errors"

local Sequential = Module.ModuleList:extend("Sequential")

-- Sequential(m1, m2, ...) or Sequential{m1, m2, ...} (a plain list): the modules in order.
function Sequential:init(...)
  local list, n = {...}, select("#", ...)
  local first = ...
  if n == 1 and type(first) == "table" and getmetatable(first) == nil then list, n = first, #first end
  for i = 1, n do
    if not Module.is_module(list[i]) then
      errors.raise(string.format("Sequential: module %d must be a module, got %s", i, type(list[i])))
    end
  end
  Sequential.super.init(self, list)
end

-- x -> the last module's output; the first module gets every argument, the next ones the
-- output of the one before. An empty Sequential returns its input.
function Sequential:forward(x, ...)
  local n = #self
  if n == 0 then return x end
  local y = self[1](x, ...)
  for i = 2, n do y = self[i](y) end
  return y
end

return Sequential
