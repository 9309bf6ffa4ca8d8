-- lutra.optim.lion — Lion (Chen et al. 2023, "Symbolic Discovery of Optimization
-- Algorithms"), as lucidrains' lion-pytorch, through the fused C step (lt_lion_step; CUDA
-- tensors step in kernels/lion.cu, bitwise as on the CPU):
--   p = p * (1 - lr * wd)                              decoupled weight decay
--   p = p - lr * sign(beta1 * m + (1 - beta1) * g)     the update
--   m = beta2 * m + (1 - beta2) * g                    the momentum, after the update
-- State per parameter: {exp_avg = m}, f32 (f64 for an f64 parameter; bf16/f16 parameters
-- keep an f32 m). Lion wants a 3-10x smaller lr than AdamW and a larger weight decay.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local create = require "lutra.create"
local common = require "lutra.optim.common"
local Optimizer = require "lutra.optim.optimizer"

local C_lion = lt.fn("lt_lion_step")

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

function kind.state_dtype(p) return p.dtype == "f64" and "f64" or "f32" end

function kind.init(p) return {exp_avg = Optimizer.keep(create.zeros_like(p, {dtype = kind.state_dtype(p)}))} end

function kind.update(p, g, st, group, lr)
  local b = group.betas
  if C_lion(p, g, st.exp_avg, lr, b[1], b[2], group.weight_decay) ~= 0 then errors.fail() end
  Optimizer.bump(p)
end

return kind
