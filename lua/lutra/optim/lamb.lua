-- lutra.optim.lamb — LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning",
-- Algorithm 2 with phi the identity), through the C step lt_lamb_step. torch has no LAMB: the
-- reference is tests/py/ref_optim_extra.py, the paper's update in torch ops.
--
--   local opt = lutra.optim.LAMB(model, {lr = 1e-3, betas = {0.9, 0.999}, weight_decay = 0.01})
--
-- Per step t of each parameter p (a layer's tensor), with Adam's bias-corrected moments:
--   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
--   r = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * p
--   p = p - lr * trust * r,  trust = ||p|| / ||r||, 1 when either norm is 0
-- State per parameter: {step, exp_avg, exp_avg_sq}, f32 (f64 for an f64 parameter; a bf16/f16
-- parameter is stepped through an f32 copy).
--
-- update_group steps a whole param group with lt_lamb_step_multi: one C call per device and step
-- count (on CUDA one set of four launches for all tensors), each tensor with its own trust ratio,
-- bitwise what update gives it; a refused call falls back to update, tensor by tensor, so that
-- errors name the tensor.
local ffi = require "ffi"
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local create = require "lutra.create"
local common = require "lutra.optim.common"
local Optimizer = require "lutra.optim.optimizer"

local C_lamb = lt.fn("lt_lamb_step")
local C_lamb_multi = lt.fn("lt_lamb_step_multi")

local kind = {
  name = "lamb",
  title = "LAMB",
  defaults = {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-6, weight_decay = 0},
  optional = {},
  fields = {step = "number", exp_avg = "tensor", exp_avg_sq = "tensor"},
  required = {step = true, exp_avg = true, exp_avg_sq = true},
}
kind.known = common.known(kind)

function kind.check(g, who)
  common.number(g, who, "lr", 0)
  common.betas(g, who)
  common.number(g, who, "eps", 0)
  common.number(g, who, "weight_decay", 0)
end

function kind.state_dtype(p) return p.dtype == "f64" and "f64" or "f32" end

function kind.init(p)
  local dt = kind.state_dtype(p)
  return {step = 0, exp_avg = Optimizer.keep(create.zeros_like(p, {dtype = dt})),
          exp_avg_sq = Optimizer.keep(create.zeros_like(p, {dtype = dt}))}
end

function kind.update(p, g, st, group, lr)
  local t = st.step + 1
  local work = p
  if p.dtype ~= "f32" and p.dtype ~= "f64" then work = p:to("f32") end -- bf16/f16: through f32
  if g.dtype ~= work.dtype then g = g:to(work.dtype) end
  local b = group.betas
  if C_lamb(work, g, st.exp_avg, st.exp_avg_sq, lr, b[1], b[2], group.eps, group.weight_decay, t) ~= 0 then
    errors.fail()
  end
  if work ~= p then p:copy_(work) end
  st.step = t
  Optimizer.bump(p)
end

-- The tensor a group step updates for item it (its master, p itself, or an f32 copy of a bf16/f16
-- p) and the gradient in that tensor's dtype.
local function operands(it)
  local work = it.st.master or it.p
  if work.dtype ~= "f32" and work.dtype ~= "f64" then work = it.p:to("f32") end
  local g = it.grad
  if g.dtype ~= work.dtype then g = g:to(work.dtype) end
  return work, g
end

-- One step of a param group: items = {{p =, grad =, st =}, ...} (st.master: an f32 master copy of
-- a bf16/f16 p), batched by device and step count in order.
function kind.update_group(items, group, lr)
  local buckets, order = {}, {}
  for _, it in ipairs(items) do
    local key = tostring(it.p.device) .. "/" .. (it.st.step + 1)
    if not buckets[key] then buckets[key], order[#order + 1] = {}, key end
    local b = buckets[key]
    b[#b + 1] = it
  end
  local b1, b2 = group.betas[1], group.betas[2]
  for _, key in ipairs(order) do
    local b = buckets[key]
    local n, step = #b, b[1].st.step + 1
    local params, grads = ffi.new("lt_tensor*[?]", n), ffi.new("lt_tensor*[?]", n)
    local ms, vs = ffi.new("lt_tensor*[?]", n), ffi.new("lt_tensor*[?]", n)
    for i, it in ipairs(b) do
      it.work, it.work_grad = operands(it) -- alive while C holds their pointers
      params[i - 1], grads[i - 1], ms[i - 1], vs[i - 1] = it.work, it.work_grad, it.st.exp_avg, it.st.exp_avg_sq
    end
    if C_lamb_multi(n, params, grads, ms, vs, lr, b1, b2, group.eps, group.weight_decay, step) == 0 then
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

return kind
