-- lutra.functional.masked_fill — F.masked_fill(x, mask, value, out): x with value where mask
-- (bool, broadcast to x's shape) is true, as PyTorch's; value is a number or a 0-d tensor. It is
-- ops.where(mask, value, x), whose backward gives x the gradient with the masked places zeroed.
local errors = require "lutra.errors"
local ops = require "lutra.ops"
local U = require "lutra.functional.util"
local shape_of = require("lutra.autograd.util").shape_of

local M = {}

local raise, need = errors.raise, U.need

function M.masked_fill(x, mask, value, out)
  need("masked_fill", "x", x)
  need("masked_fill", "mask", mask)
  if mask.dtype ~= "bool" then raise("masked_fill: mask must be a bool tensor, got " .. mask.dtype) end
  if type(value) ~= "number" and not (ops.is_tensor(value) and value.ndim == 0) then
    raise("masked_fill: value must be a number or a 0-d tensor, got " .. type(value))
  end
  local xs, ms = shape_of(x), shape_of(mask)
  local ok = #ms <= #xs
  for k = 1, #ms do
    local m, s = ms[#ms - k + 1], xs[#xs - k + 1]
    ok = ok and (m == s or m == 1)
  end
  if not ok then
    raise(string.format("masked_fill: mask of shape [%s] does not broadcast to x's [%s]", table.concat(ms, ","),
      table.concat(xs, ",")))
  end
  return ops.where(mask, value, x, out)
end

return M
