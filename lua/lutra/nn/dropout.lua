-- nn.Dropout(p = 0.1): in training, zeroes each element with probability p and scales
-- the rest by 1/(1-p), with a mask drawn from lutra's generator (lutra.manual_seed
-- makes it reproducible); in eval mode (m:eval()), or with p = 0, the identity.
local Module = require "lutra.nn.module"
local create = require "lutra.create"
local ops = require "lutra.ops"
local O = require "lutra.nn.options"

local Dropout = Module:extend("Dropout")

function Dropout:init(p)
  self.p = O.probability("Dropout", "p", p == nil and 0.1 or p)
end

-- In training, zeroes each element with probability p and scales the rest by 1 / (1 - p);
-- in eval mode (module:eval()) or with p = 0, x itself.
function Dropout:forward(x)
  local p = self.p
  if not self.training or p == 0 then return x end
  if p == 1 then return x * 0 end
  local mask = create.bernoulli_(create.empty_like(x), 1 - p) -- 1 where kept, in x's dtype
  ops.mul_(mask, 1 / (1 - p))
  return x * mask
end

function Dropout:extra_repr() return string.format("p=%g", self.p) end

return Dropout
