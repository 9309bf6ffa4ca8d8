-- nn.RMSNorm(dim, {eps = 1e-6, affine = true, dtype =, device =}):
-- x / sqrt(mean(x^2) + eps) * weight over the last dim (weight starts at one).
-- forward_add(x, residual) -> x + residual, and the norm of it (one fused kernel).
local Module = require "lutra.nn.module"
local create = require "lutra.create"
local parameter = require("lutra.nn.parameter").parameter
local F = require "lutra.functional"
local O = require "lutra.nn.options"

local RMSNorm = Module:extend("RMSNorm")

function RMSNorm:init(dim, opts)
  opts = O.check("RMSNorm", opts, {"eps", "affine", "dtype", "device"})
  self.dim = O.positive_int("RMSNorm", "dim", dim)
  self.eps = O.positive("RMSNorm", "eps", opts.eps or 1e-6)
  if O.boolean("RMSNorm", "affine", opts.affine, true) then self.weight = parameter(create.ones(dim, O.factory(opts))) end
end

-- x (..., dim) / rms over the last dim, * weight.
function RMSNorm:forward(x) return (F.rms_norm(x, self.weight, self.eps)) end

-- x + residual and its norm, in one pass: returns both (the residual stream, the normalised value).
function RMSNorm:forward_add(x, residual)
  local res, y = F.add_rms_norm(x, residual, self.weight, self.eps)
  return res, y
end

function RMSNorm:extra_repr()
  return string.format("%d, eps=%g%s", self.dim, self.eps, self.weight == nil and ", affine=false" or "")
end

return RMSNorm
