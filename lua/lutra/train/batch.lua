-- lutra.train.batch — what the trainer does with one batch of a loader: fetch it onto the
-- model's device, count its tokens, and turn a loss into a number.
--
-- A batch handed to loss_fn is {x =, y =, x, y} (or the loader's own table when it returns
-- one). The default loss is the model's next-token loss: select(2, model:forward(x, y)).
local errors = require "lutra.errors"
local ops = require "lutra.ops"

local raise, is_tensor = errors.raise, ops.is_tensor

local M = {}

-- The loader's next batch, its tensors on `device` (the model's: loaders make CPU batches).
function M.next(loader, device)
  local a, b = loader:next()
  local batch = (type(a) == "table" and not is_tensor(a)) and a or {x = a, y = b, a, b}
  if device and device ~= "cpu" then
    local moved = {}
    for k, v in pairs(batch) do
      if is_tensor(v) and v.device ~= device then
        moved[v] = moved[v] or v:to(device) -- x and batch[1] are one tensor: one copy
        batch[k] = moved[v]
      end
    end
  end
  return batch
end

-- Where the model's parameters are (the first one's device; "cpu" for a model without any).
function M.device_of(params)
  local p = params[1]
  return p ~= nil and p.device or "cpu"
end

function M.default_loss(model, batch)
  local _, loss = model:forward(batch.x, batch.y)
  if loss == nil then raise("train: model:forward(x, y) returned no loss (give loss_fn for other models)") end
  local aux = type(model) == "table" and rawget(model, "aux_loss") -- a zoo model with MoE layers: its two parts
  if aux and rawget(model, "lm_loss") then return loss, {lm_loss = model.lm_loss:item(), aux_loss = aux:item()} end
  return loss
end

function M.tokens(batch)
  local x = batch.x or batch[1]
  if is_tensor(x) then return x:numel() end
  return 0
end

function M.to_number(loss)
  if type(loss) == "number" then return loss end
  return loss:item()
end

return M
