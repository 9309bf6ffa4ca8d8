-- nn.LayerNorm(dim, {eps = 1e-5, bias = true, affine = true, dtype =, device =}):
-- normalises the last dim to zero mean and unit variance, then * weight + bias
-- (weight starts at one, bias at zero). bias = false keeps the weight only.
-- forward_add(x, residual) -> x + residual, and the norm of it (one fused kernel).
local Module = require "lutra.nn.module"
local create = require "lutra.create"
local parameter = require("lutra.nn.parameter").parameter
local F = require "lutra.functional"
local O = require "lutra.nn.options"

local LayerNorm = Module:extend("LayerNorm")

function LayerNorm:init(dim, opts)
  opts = O.check("LayerNorm", opts, {"eps", "bias", "affine", "dtype", "device"})
  self.dim = O.positive_int("LayerNorm", "dim", dim)
  self.eps = O.positive("LayerNorm", "eps", opts.eps or 1e-5)
  local fo = O.factory(opts)
  if O.boolean("LayerNorm", "affine", opts.affine, true) then
    self.weight = parameter(create.ones(dim, fo))
    if O.boolean("LayerNorm", "bias", opts.bias, true) then self.bias = parameter(create.zeros(dim, fo)) end
  end
end

-- x (..., dim) normalised over the last dim, * weight + bias.
function LayerNorm:forward(x) return (F.layer_norm(x, self.weight, self.bias, self.eps)) end

-- x + residual and its norm, in one pass: returns both (the residual stream, the normalised value).
function LayerNorm:forward_add(x, residual)
  local res, y = F.add_layer_norm(x, residual, self.weight, self.bias, self.eps)
  return res, y
end

function LayerNorm:extra_repr()
  local s = string.format("%d, eps=%g", self.dim, self.eps)
  if self.weight == nil then return s .. ", affine=false" end
  if self.bias == nil then return s .. ", bias=false" end
  return s
end

return LayerNorm
