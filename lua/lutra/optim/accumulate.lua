-- lutra.optim.accumulate — gradient accumulation over k micro-batches.
--
-- Gradients add up across backward calls, so a step over k micro-batches is:
--   opt:zero_grad()
--   for i = 1, k do (loss_i / k):backward() end      -- the mean over the k micro-batches
--   opt:step()
-- accumulate(k, fn) runs exactly that middle loop: fn(i) returns micro-batch i's loss
-- (a scalar tensor, a mean over its tokens); it returns the mean loss as a number.
-- With micro-batches of equal size the gradient is the full batch's.
local errors = require "lutra.errors"
local ops = require "lutra.ops"

local M = {}

local raise = errors.raise

-- loss / k: what each micro-batch backpropagates.
function M.scale_loss(loss, k)
  if type(k) ~= "number" or k < 1 or k ~= math.floor(k) then
    raise("scale_loss: k must be an integer >= 1, got " .. tostring(k))
  end
  if k == 1 then return loss end
  return ops.div(loss, k)
end

function M.accumulate(k, fn)
  if type(k) ~= "number" or k < 1 or k ~= math.floor(k) then
    raise("accumulate: k must be an integer >= 1, got " .. tostring(k))
  end
  if type(fn) ~= "function" then raise("accumulate: expected a function(i) -> loss, got " .. type(fn)) end
  local sum = 0
  for i = 1, k do
    local loss = fn(i)
    if not ops.is_tensor(loss) then raise(string.format("accumulate: micro-batch %d returned %s, not a loss tensor", i, type(loss))) end
    M.scale_loss(loss, k):backward()
    sum = sum + loss:item()
  end
  return sum / k
end

return M
