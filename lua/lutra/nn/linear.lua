-- nn.Linear(in_features, out_features, {bias = true, dtype =, device =}):
-- y = x @ weight^T + bias, x (..., in) -> y (..., out). weight is (out, in) as in
-- PyTorch; both start uniform in +-1/sqrt(in) (PyTorch's default; the model zoo
-- re-initialises).
local Module = require "lutra.nn.module"
local create = require "lutra.create"
local parameter = require("lutra.nn.parameter").parameter
local F = require "lutra.functional"
local O = require "lutra.nn.options"

local Linear = Module:extend("Linear")

function Linear:init(n_in, n_out, opts)
  opts = O.check("Linear", opts, {"bias", "dtype", "device"})
  self.in_features = O.positive_int("Linear", "in_features", n_in)
  self.out_features = O.positive_int("Linear", "out_features", n_out)
  local bound, fo = 1 / math.sqrt(n_in), O.factory(opts)
  self.weight = parameter(create.uniform_(create.empty(n_out, n_in, fo), -bound, bound))
  if O.boolean("Linear", "bias", opts.bias, true) then
    self.bias = parameter(create.uniform_(create.empty(n_out, fo), -bound, bound))
  end
end

-- x (..., in) -> x @ weight^T + bias (..., out).
function Linear:forward(x) return F.linear(x, self.weight, self.bias) end

function Linear:extra_repr()
  return string.format("%d, %d, bias=%s", self.in_features, self.out_features, tostring(self.bias ~= nil))
end

return Linear
