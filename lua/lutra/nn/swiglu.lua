-- nn.SwiGLU{d_model =, hidden =, bias = false, dropout = 0, dtype =, device =}: the
-- Llama feed-forward layer, drop(proj(silu(gate(x)) * up(x))) (Hugging Face's
-- gate_proj, up_proj, down_proj). hidden defaults to 8/3 d_model rounded up to a
-- multiple of 32, which keeps the parameter count of a 4x GELU MLP.
local Module = require "lutra.nn.module"
local O = require "lutra.nn.options"
local Linear = require "lutra.nn.linear"
local Dropout = require "lutra.nn.dropout"

local SwiGLU = Module:extend("SwiGLU")

-- Llama's hidden width for d_model: 8/3 d_model rounded up to a multiple of 32.
function SwiGLU.default_hidden(d_model) return math.ceil(8 * d_model / 3 / 32) * 32 end

function SwiGLU:init(cfg)
  cfg = O.check("SwiGLU", cfg, {"d_model", "hidden", "bias", "dropout", "dtype", "device"})
  local C = O.positive_int("SwiGLU", "d_model", cfg.d_model)
  local hidden = O.positive_int("SwiGLU", "hidden", cfg.hidden or SwiGLU.default_hidden(C))
  local lin = {bias = O.boolean("SwiGLU", "bias", cfg.bias, false), dtype = cfg.dtype, device = cfg.device}
  self.gate = Linear(C, hidden, lin)
  self.up = Linear(C, hidden, lin)
  self.proj = Linear(hidden, C, lin)
  self.drop = Dropout(cfg.dropout or 0)
end

-- x (..., d_model) -> drop(proj(silu(gate(x)) * up(x))) (..., d_model).
function SwiGLU:forward(x) return self.drop(self.proj(self.gate(x):silu() * self.up(x))) end

function SwiGLU:extra_repr()
  return string.format("%d -> %d -> %d", self.proj.out_features, self.proj.in_features, self.proj.out_features)
end

return SwiGLU
