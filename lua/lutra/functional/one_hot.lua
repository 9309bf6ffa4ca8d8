-- lutra.functional.one_hot — F.one_hot(index, num_classes): index (...) i32/i64 -> (..., C) i64
-- with 1 at each index, as PyTorch's; num_classes -1 or nil takes max(index) + 1. A scatter of
-- ones into zeros (lt_scatter), not differentiable.
local errors = require "lutra.errors"
local U = require "lutra.functional.util"
local shape_of = require("lutra.autograd.util").shape_of

local M = {}

local raise, need = errors.raise, U.need

function M.one_hot(index, num_classes)
  need("one_hot", "index", index)
  if index.dtype ~= "i64" and index.dtype ~= "i32" then
    raise("one_hot: index must be i32 or i64, got " .. index.dtype)
  end
  local create = require "lutra.create"
  local n = index:numel()
  local lo = n > 0 and tonumber(index:min():item()) or 0
  local hi = n > 0 and tonumber(index:max():item()) or -1
  if lo < 0 then raise("one_hot: index value " .. lo .. " is negative") end
  if num_classes == nil or num_classes == -1 then
    if n == 0 then raise("one_hot: num_classes is needed for an empty index") end
    num_classes = hi + 1
  elseif type(num_classes) ~= "number" or num_classes % 1 ~= 0 or num_classes < 1 then
    raise("one_hot: num_classes must be a positive integer or -1, got " .. tostring(num_classes))
  elseif hi >= num_classes then
    raise(string.format("one_hot: index value %d out of range [0, %d)", hi, num_classes))
  end
  local shape = shape_of(index)
  shape[#shape + 1] = num_classes
  local out = create.zeros(shape, {dtype = "i64", device = index.device})
  local at = index:unsqueeze(-1)
  return require("lutra.functional.gather").scatter(out, -1, at, 1)
end

return M
