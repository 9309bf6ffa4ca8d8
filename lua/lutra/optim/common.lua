-- lutra.optim.common — setting checks shared by the optimizer kinds.
local errors = require "lutra.errors"

local M = {}

local raise = errors.raise

function M.number(g, who, key, lo, hi, hi_open)
  local v = g[key]
  if type(v) ~= "number" or v ~= v then raise(string.format("%s: %s must be a number, got %s", who, key, tostring(v))) end
  if lo and v < lo then raise(string.format("%s: %s must be >= %g, got %g", who, key, lo, v)) end
  if hi and (v > hi or (hi_open and v == hi)) then
    raise(string.format("%s: %s must be %s %g, got %g", who, key, hi_open and "<" or "<=", hi, v))
  end
  return v
end

-- betas = {beta1, beta2}, each in [0, 1).
function M.betas(g, who)
  local b = g.betas
  if type(b) ~= "table" or #b ~= 2 or type(b[1]) ~= "number" or type(b[2]) ~= "number" then
    raise(string.format("%s: betas must be a list of two numbers {beta1, beta2}, got %s", who, tostring(b)))
  end
  for i = 1, 2 do
    if not (b[i] >= 0 and b[i] < 1) then raise(string.format("%s: betas[%d] must be in [0, 1), got %g", who, i, b[i])) end
  end
end

-- The names a kind accepts, for error messages.
function M.known(kind)
  local names = {}
  for k in pairs(kind.defaults) do names[#names + 1] = k end
  for k in pairs(kind.optional) do names[#names + 1] = k end
  names[#names + 1] = "schedule"
  names[#names + 1] = "no_decay"
  names[#names + 1] = "master_weights"
  table.sort(names)
  return table.concat(names, ", ")
end

return M
