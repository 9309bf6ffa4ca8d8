-- lutra.optim — optimizers, parameter groups, gradient clipping, lr schedules.
--
--   local optim = lutra.optim
--   local sched = optim.schedule.cosine{lr = 1e-3, min_lr = 1e-4, warmup = 100, total = 2000}
--   local opt = optim.AdamW(model, {betas = {0.9, 0.99}, weight_decay = 0.1, schedule = sched})
--   for step = 1, 2000 do
--     opt:zero_grad()
--     local loss = optim.accumulate(4, function(i) return model:loss(batch(i)) end)
--     local norm = optim.clip_grad_norm(model, 1.0)
--     opt:step()                                  -- lr = sched(opt.steps), then steps + 1
--   end
--   ckpt.optim = opt:state_dict() ... opt:load_state_dict(ckpt.optim)
--
-- Optimizers (torch defaults; the first argument is a module, a list of tensors or a list
-- of groups {params =, lr =, weight_decay =, ...}):
--   AdamW(params, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 1e-2})
--   SGD(params, {lr =, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false})
--   Lion(params, {lr = 1e-4, betas = {0.9, 0.99}, weight_decay = 0})
--   Adafactor(params, {lr = nil, eps = {1e-30, 1e-3}, clip_threshold = 1, decay_rate = -0.8,
--             beta1 = nil, weight_decay = 0, scale_parameter = true, relative_step = true,
--             warmup_init = false})  (transformers' Adafactor and its defaults: adafactor.lua)
--   LAMB(params, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-6, weight_decay = 0})  (lamb.lua)
--   also: schedule = (a function step -> lr), no_decay = (for a module: see groups.lua)
-- Methods: opt:step{grads =, lr =} (both optional), opt:zero_grad(set_to_none),
--   opt:get_lr(step), opt:state_dict(), opt:load_state_dict(sd); fields opt.state,
--   opt.param_groups, opt.keys, opt.steps (see optimizer.lua).
-- Helpers: param_groups(model, {weight_decay =, no_decay =}), clip_grad_norm(params,
--   max_norm, opts) -> norm, clip_grads(grads, max_norm), grad_norm(params),
--   accumulate(k, fn) -> mean loss, scale_loss(loss, k), schedule.{cosine, linear,
--   constant, wsd, make}.
local Optimizer = require "lutra.optim.optimizer"
local groups = require "lutra.optim.groups"
local clip = require "lutra.optim.clip"
local accumulate = require "lutra.optim.accumulate"

local M = {}

M.kinds = {adamw = require "lutra.optim.adamw", sgd = require "lutra.optim.sgd", lion = require "lutra.optim.lion",
           adafactor = require "lutra.optim.adafactor", lamb = require "lutra.optim.lamb"}

function M.AdamW(params, opts) return Optimizer.new(M.kinds.adamw, params, opts) end
function M.SGD(params, opts) return Optimizer.new(M.kinds.sgd, params, opts) end
function M.Lion(params, opts) return Optimizer.new(M.kinds.lion, params, opts) end
function M.Adafactor(params, opts) return Optimizer.new(M.kinds.adafactor, params, opts) end
function M.LAMB(params, opts) return Optimizer.new(M.kinds.lamb, params, opts) end

-- An optimizer by name ("adamw", "sgd", "lion", "adafactor", "lamb"), for configs.
function M.create(name, params, opts)
  local kind = type(name) == "string" and M.kinds[name:lower()]
  if not kind then
    require("lutra.errors").raise("optim.create: unknown optimizer " .. tostring(name) .. " (adamw, sgd, lion, adafactor, lamb)")
  end
  return Optimizer.new(kind, params, opts)
end

M.Optimizer = Optimizer
-- Whether x is an optimizer (optim.AdamW(...) and the others).
M.is_optimizer = function(x) return getmetatable(x) == Optimizer end
M.param_groups, M.EMBEDDING_PATTERNS = groups.param_groups, groups.EMBEDDING_PATTERNS
M.clip_grad_norm, M.clip_grads, M.grad_norm = clip.clip_grad_norm, clip.clip_grads, clip.grad_norm
M.accumulate, M.scale_loss = accumulate.accumulate, accumulate.scale_loss
M.schedule = require "lutra.optim.schedule"

return M
