-- lutra.optim.lion — Lion (Chen et al. 2023, "Symbolic Discovery of Optimization
-- Algorithms"), as lucidrains' lion-pytorch:
--   p = p * (1 - lr * wd)                              decoupled weight decay
--   p = p - lr * sign(beta1 * m + (1 - beta1) * g)     the update
--   m = beta2 * m + (1 - beta2) * g                    the momentum, after the update
-- State per parameter: {exp_avg = m}, in the parameter's dtype. Lion wants a 3-10x
-- smaller lr than AdamW and a larger weight decay.
local ops = require "lutra.ops"
local common = require "lutra.optim.common"
local create = require "lutra.create"
local Optimizer = require "lutra.optim.optimizer"

local add, mul, sub, gt, lt_ = ops.add, ops.mul, ops.sub, ops.gt, ops.lt

local kind = {
  name = "lion",
  title = "Lion",
  defaults = {lr = 1e-4, betas = {0.9, 0.99}, weight_decay = 0},
  optional = {},
  fields = {exp_avg = "tensor"},
  required = {exp_avg = true},
}
kind.known = common.known(kind)

function kind.check(g, who)
  common.number(g, who, "lr", 0)
  common.betas(g, who)
  common.number(g, who, "weight_decay", 0)
end

function kind.state_dtype(p) return p.dtype end

function kind.init(p) return {exp_avg = Optimizer.keep(create.zeros_like(p))} end

-- Temporaries are freed by the step's lutra.tidy scope.
function kind.update(p, g, st, group, lr)
  local b1, b2, m = group.betas[1], group.betas[2], st.exp_avg
  if group.weight_decay ~= 0 then mul(p, 1 - lr * group.weight_decay, p) end
  local c = add(mul(m, b1), mul(g, 1 - b1))
  local dt = p.dtype
  local sign = sub(gt(c, 0):to(dt), lt_(c, 0):to(dt)) -- sign(c), 0 at 0
  add(p, mul(sign, -lr), p)
  mul(m, b2, m)
  add(m, mul(g, 1 - b2), m)
end

return kind
