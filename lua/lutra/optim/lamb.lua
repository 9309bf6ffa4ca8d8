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
local group_step = require "lutra.optim.group_step"

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

-- One step of a param group (lutra.optim.group_step): one lt_lamb_step_multi per batch.
function kind.update_group(items, group, lr)
  group_step.run(kind, items, group, lr, function(b, step)
    local n = #b
    local params, grads = ffi.new("lt_tensor*[?]", n), ffi.new("lt_tensor*[?]", n)
    local ms, vs = ffi.new("lt_tensor*[?]", n), ffi.new("lt_tensor*[?]", n)
    for i, it in ipairs(b) do
      params[i - 1], grads[i - 1], ms[i - 1], vs[i - 1] = it.work, it.work_grad, it.st.exp_avg, it.st.exp_avg_sq
    end
    return C_lamb_multi(n, params, grads, ms, vs, lr, group.betas[1], group.betas[2], group.eps, group.weight_decay, step)
  end)
end

return kind
