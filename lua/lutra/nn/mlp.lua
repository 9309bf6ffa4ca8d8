-- nn.MLP{d_model =, hidden = 4 * d_model, bias = true, dropout = 0, dtype =, device =}:
-- the GPT-2 feed-forward layer, drop(proj(gelu(fc(x)))), GELU with the tanh
-- approximation (as GPT-2's "gelu_new").
local Module = require "lutra.nn.module"
local O = require "lutra.nn.options"
local Linear = require "lutra.nn.linear"
local Dropout = require "lutra.nn.dropout"

local MLP = Module:extend("MLP")

function MLP:init(cfg)
  cfg = O.check("MLP", cfg, {"d_model", "hidden", "bias", "dropout", "dtype", "device"})
  local C = O.positive_int("MLP", "d_model", cfg.d_model)
  local hidden = O.positive_int("MLP", "hidden", cfg.hidden or 4 * C)
  local lin = {bias = O.boolean("MLP", "bias", cfg.bias, true), dtype = cfg.dtype, device = cfg.device}
  self.fc = Linear(C, hidden, lin)
  self.proj = Linear(hidden, C, lin)
  self.drop = Dropout(cfg.dropout or 0)
end

local release = require("lutra.nn.grad").release

-- x (..., d_model) -> drop(proj(gelu(fc(x)))) (..., d_model).
function MLP:forward(x)
  local h = self.fc(x)
  local g = h:gelu()
  release(h, x, g)
  local y = self.proj(g)
  release(g, x, y)
  return self.drop(y)
end

function MLP:extra_repr()
  return string.format("%d -> %d -> %d", self.proj.out_features, self.proj.in_features, self.proj.out_features)
end

return MLP
