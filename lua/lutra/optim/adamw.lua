-- lutra.optim.adamw — AdamW (Loshchilov & Hutter), torch.optim.AdamW's arithmetic,
-- through the fused C step (lt_adamw_step: one pass over param, grad, m and v).
--
--   local opt = lutra.optim.AdamW(model, {lr = 1e-3, betas = {0.9, 0.99}, weight_decay = 0.1})
--
-- Per step, with t the parameter's own step count (bias correction):
--   p = p * (1 - lr * wd); m = lerp(m, g, 1 - beta1); v = beta2 * v + (1 - beta2) * g^2
--   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
-- State per parameter: {step = t, exp_avg = m, exp_avg_sq = v}; m and v are f32 (f64
-- for an f64 parameter), also for bf16/f16 parameters, whose grad may be f32.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local create = require "lutra.create"
local common = require "lutra.optim.common"
local Optimizer = require "lutra.optim.optimizer"

local C_adamw = lt.fn("lt_adamw_step")

local kind = {
  name = "adamw",
  title = "AdamW",
  defaults = {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 1e-2},
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
  local step = st.step + 1
  local b = group.betas
  if C_adamw(p, g, st.exp_avg, st.exp_avg_sq, lr, b[1], b[2], group.eps, group.weight_decay, step) ~= 0 then
    errors.fail()
  end
  st.step = step
  Optimizer.bump(p)
end

return kind
