-- The activation modules, for nn.Sequential and module fields: each applies one elementwise
-- function, shape (...) -> (...), and has no parameters. As in PyTorch:
--
--   nn.GELU()                       x * Phi(x), exact (t:gelu_erf())
--   nn.GELU{approximate = "tanh"}   0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (t:gelu(), GPT-2's)
--   nn.SiLU(), nn.ReLU(), nn.Tanh(), nn.Sigmoid()
--   nn.Identity()                   returns its input, unchanged (the same tensor)
local Module = require "lutra.nn.module"
local O = require "lutra.nn.options"
local errors = require "lutra.errors"

local M = {}

-- A module class `name` whose forward is x:method().
local function elementwise(name, method)
  local cls = Module:extend(name)
  function cls:forward(x) return x[method](x) end
  return cls
end

M.SiLU = elementwise("SiLU", "silu")
M.ReLU = elementwise("ReLU", "relu")
M.Tanh = elementwise("Tanh", "tanh")
M.Sigmoid = elementwise("Sigmoid", "sigmoid")

-- nn.GELU{approximate = "none" | "tanh"}: exact (the default, as PyTorch's) or the tanh form.
local GELU = Module:extend("GELU")
M.GELU = GELU

function GELU:init(opts)
  opts = O.check("GELU", opts, {"approximate"})
  local a = opts.approximate or "none"
  if a ~= "none" and a ~= "tanh" then
    errors.raise("GELU: approximate must be \"none\" or \"tanh\", got " .. tostring(a))
  end
  self.approximate = a
end

-- x (...) -> gelu(x) (...).
function GELU:forward(x)
  if self.approximate == "tanh" then return x:gelu() end
  return x:gelu_erf()
end

function GELU:extra_repr() return self.approximate == "tanh" and "approximate=tanh" or "" end

-- nn.Identity(): forward returns its argument(s) as they are (a placeholder, as PyTorch's).
local Identity = Module:extend("Identity")
M.Identity = Identity

-- Identity accepts and ignores constructor arguments, as PyTorch's does.
function Identity:init() end

-- x -> x, the same tensor (every argument is returned as given).
function Identity:forward(...) return ... end

return M
