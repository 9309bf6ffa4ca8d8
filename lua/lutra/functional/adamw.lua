-- lutra.functional.adamw — F.adamw_step, one fused AdamW update of a tensor and its moments, in
-- place (lt_adamw_step, host/ops/adamw.c). The optimizer object is lutra/optim/adamw.lua.
--
--   F.adamw_step(param, grad, m, v, {lr=, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, step=})
--       -> param (m, v updated too); step >= 1 and lr are required
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local S = require "lutra.autograd.state"
local C = lt.C

local M = {}

local fail, raise = errors.fail, errors.raise

function M.adamw_step(param, grad, m, v, opts)
  opts = opts or {}
  if type(opts.step) ~= "number" or opts.step < 1 then raise("adamw_step: opts.step (>= 1) is required") end
  if type(opts.lr) ~= "number" then raise("adamw_step: opts.lr is required") end
  local rc = C.lt_adamw_step(param, grad, m, v, opts.lr, opts.beta1 or 0.9, opts.beta2 or 0.999, opts.eps or 1e-8,
    opts.weight_decay or 0.01, opts.step)
  if rc ~= 0 then fail() end
  S.bump(param) -- an optimizer update: graphs that saved param see it changed
  S.bump(m)
  S.bump(v)
  return param
end

return M
