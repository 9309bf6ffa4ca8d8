-- lutra.optim.group_step — the update_group of the kinds whose C step takes a whole param group
-- of f32/f64 tensors (lamb, adafactor): a group's items batched by device and step count, each
-- batch one C call, and the per-tensor path when that call refuses (its errors name the tensor).
--
--   group_step.run(kind, items, group, lr, call)
--     items: {{p =, grad =, st =}, ...} in the group's order (st.master: the f32 master copy of a
--     bf16/f16 p). call(batch, step) gets the batch's items, each with it.work (the tensor the step
--     updates: the master, p, or an f32 copy of a bf16/f16 p) and it.work_grad (the gradient in
--     its dtype), and returns the C call's status.
--   group_step.batches(items) -> list of batches (lists of items), by device and step count, in order
local Optimizer = require "lutra.optim.optimizer"

local M = {}

function M.batches(items)
  local by_key, out = {}, {}
  for _, it in ipairs(items) do
    local key = tostring(it.p.device) .. "/" .. (it.st.step + 1)
    if not by_key[key] then
      by_key[key] = {}
      out[#out + 1] = by_key[key]
    end
    local b = by_key[key]
    b[#b + 1] = it
  end
  return out
end

local function operands(it)
  local work = it.st.master or it.p
  if work.dtype ~= "f32" and work.dtype ~= "f64" then work = it.p:to("f32") end
  local g = it.grad
  if g.dtype ~= work.dtype then g = g:to(work.dtype) end
  return work, g
end

function M.run(kind, items, group, lr, call)
  for _, b in ipairs(M.batches(items)) do
    local step = b[1].st.step + 1
    for _, it in ipairs(b) do it.work, it.work_grad = operands(it) end -- alive while C holds them
    if call(b, step) == 0 then
      for _, it in ipairs(b) do
        if it.work ~= it.p then
          it.p:copy_(it.work)
          if it.work == it.st.master then Optimizer.bump(it.st.master) end
        end
        it.st.step = step
        Optimizer.bump(it.p)
      end
    else -- refused before touching anything: the per-tensor path names the culprit
      for _, it in ipairs(b) do
        if it.st.master ~= nil then
          kind.update(it.st.master, it.grad, it.st, group, lr)
          it.p:copy_(it.st.master)
          Optimizer.bump(it.p)
        else
          kind.update(it.p, it.grad, it.st, group, lr)
        end
      end
    end
  end
end

return M
