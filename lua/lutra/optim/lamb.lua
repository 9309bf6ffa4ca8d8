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
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local create = require "lutra.create"
local common = require "lutra.optim.common"
local Optimizer = require "lutra.optim.optimizer"

local C_lamb = lt.fn("lt_lamb_step")

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

return kind
