-- lutra.train.step — one optimizer step of the trainer (one process, or a parallel layout),
-- and the evaluation of the val loss.
--
-- One step: grad_accum micro-batches, each loss scaled by 1 / grad_accum before backward,
-- then the gradient is clipped to grad_clip (global norm; 0: no clipping, the norm is
-- still measured) and the optimizer steps at the schedule's lr for that step. Each step
-- runs inside lutra.tidy: activations, gradients and temporaries are freed when it ends
-- (the optimizer's state and the parameters are kept), so memory stays flat. A step whose loss
-- or gradient norm is nan or inf is not taken, and comes back as an event for the trainer's
-- config.nonfinite (lutra/train/nonfinite.lua).
--
--   local loss, tokens, norm, extras, nonfinite = step.single(trainer, lr)   -- or step.parallel
local errors = require "lutra.errors"
local create = require "lutra.create"
local memory = require "lutra.memory"
local ops = require "lutra.ops"
local grad = require "lutra.nn.grad"
local sharded = require "lutra.ckpt"
local batch_mod = require "lutra.train.batch"
local nonfinite = require "lutra.train.nonfinite"
local fault = require "lutra.train.fault"
local extras_mod = require "lutra.train.extras"

local raise, is_tensor = errors.raise, ops.is_tensor
local tidy = memory.tidy
local next_batch, to_number = batch_mod.next, batch_mod.to_number
local finite = nonfinite.finite
local now = require("lutra.train.interrupt").now

local M = {}

-- The global gradient norm, after clipping to max_norm (> 0) as torch's clip_grad_norm_.
function M.clip_grad_norm(params, max_norm)
  local ok, optim = pcall(require, "lutra.optim")
  if ok and type(optim) == "table" and optim.clip_grad_norm then
    return optim.clip_grad_norm(params, max_norm > 0 and max_norm or math.huge)
  end
  return grad.no_grad(function()
    local sq = 0
    for _, p in ipairs(params) do
      local g = p.grad
      if g ~= nil then sq = sq + (g:float() * g:float()):sum():item() end
    end
    local norm = math.sqrt(sq)
    if max_norm > 0 then
      local coef = max_norm / (norm + 1e-6)
      if coef < 1 then
        for _, p in ipairs(params) do
          if p.grad ~= nil then p.grad:mul_(coef) end
        end
      end
    end
    return norm
  end)
end

-- loss_fn, or one whose loss is nan once when LUTRA_FAULT=nan:S[@R] names this step and rank
-- (lutra/train/fault.lua: how the tests make a step go bad).
local function faulty(run, loss_fn)
  if not fault.nan_at(run.step + 1, run.mesh and run.mesh.rank or 0) then return loss_fn end
  local fired = false
  return function(model, batch)
    local loss, extra = loss_fn(model, batch)
    if not fired then
      fired = true
      loss = loss * (0 / 0)
    end
    return loss, extra
  end
end

-- Forward and backward of the k micro-batches; returns the loss sum, the tokens and loss_fn's
-- extra metrics over them (lutra.train.extras: means, or sums where declared; nil when none).
local function accumulate(run, k)
  local loss_sum, tokens, acc = 0, 0, extras_mod.new()
  local loss_fn = faulty(run, run.loss_fn)
  local timing = run.timing
  for _ = 1, k do
    local t0 = now()
    local batch = next_batch(run.data, run.device)
    local t1 = now()
    tokens = tokens + batch_mod.tokens(batch)
    local loss, extra = loss_fn(run.model, batch) -- called by its name: a traceback says 'loss_fn'
    local t2 = now()
    timing:add("data", t1 - t0)
    timing:add("forward", t2 - t1)
    if not is_tensor(loss) and type(loss) ~= "table" then
      raise("train: the loss must be a tensor, got " .. type(loss))
    end
    loss_sum = loss_sum + to_number(loss)
    if k > 1 then loss = loss * (1 / k) end
    loss = run.prec:scale(loss) -- fp16: times the loss scale (else loss itself)
    run.prec:backward(loss) -- loss:backward(), under the forward's autocast (bf16, fp16)
    timing:add("backward", now() - t2)
    extras_mod.add(acc, extra, 1 / k)
  end
  return loss_sum, tokens, extras_mod.values(acc)
end

-- Drops the gradients (set_to_none) and frees their memory: tensors made by backward are not
-- in the step's tidy scope, and would otherwise wait for the GC.
local function free_grads(params)
  for _, p in ipairs(params) do
    local g = p.grad
    if g ~= nil then
      p.grad = nil
      g:free()
    end
  end
end

-- One step on one process: mean loss, tokens, gradient norm, precision's report, and the
-- nonfinite event (nil when the loss and the norm are finite).
function M.single(run, lr)
  local k, params = run.grad_accum, run.params
  local loss_sum, tokens, extras, event
  local norm = tidy(function()
    run.opt:zero_grad()
    loss_sum, tokens, extras = accumulate(run, k)
    local n, take
    local t_opt = now()
    if finite(loss_sum) then
      -- fp32/bf16: clip_grad_norm, step; fp16: unscale + clip, no step when a gradient is inf/nan
      n, take = run.prec:clip_grads(params, run.get "grad_clip", M.clip_grad_norm)
    else
      n, take = run.prec:measured(M.clip_grad_norm(params, 0)), false
    end
    event = nonfinite.event(run, loss_sum / k, n)
    sharded.fence() -- a background save has copied the weights before they change
    if take and not event then run.opt:step{lr = lr} end
    run.timing:add("optimizer", now() - t_opt)
    if run.grads_hook then run.grads_hook() end -- the step's gradients, before they are dropped
    free_grads(params)
    return n, run.opt.state -- the optimizer's state outlives the scope
  end)
  return loss_sum / k, tokens, norm, run.prec:report(extras), event
end

-- One step of a parallel layout (config.parallel): lutra.dist.parallelize does the
-- communication; the losses are global means, the same on every rank.
function M.parallel(run, lr)
  local k, par = run.grad_accum, run.par
  local tokens = 0
  local loss_sum, norm, event, extras = 0, 0, nil, nil
  tidy(function()
    par:zero_grad()
    local batches, timing = {}, run.timing
    for i = 1, k do
      local t0 = now()
      batches[i] = next_batch(run.data, run.device)
      timing:add("data", now() - t0)
      tokens = tokens + batch_mod.tokens(batches[i])
    end
    -- fp16: losses scaled before backward, gradients unscaled + clipped after the sync,
    -- no step when one is inf/nan (fp32, bf16: prec.loss_scale is nil, nothing changes)
    local prec = run.prec
    if par.stage and prec.dtype then
      raise("train: precision = \"" .. prec.mode .. "\" with pipeline parallel is not supported yet")
    end
    local t0 = now()
    loss_sum, extras = prec:run(par.forward_backward, par, batches, faulty(run, prec:scaled(run.loss_fn)))
    local t1 = now()
    timing:add("forward_backward", t1 - t0)
    loss_sum = loss_sum / prec:factor()
    local take = true
    if not prec.loss_scale then
      norm = par:finish(run.get "grad_clip")
    elseif finite(loss_sum) then
      norm, take = prec:unscale_and_clip(par.optimizer.params, par:finish(0), run.get "grad_clip")
    else
      norm, take = prec:measured(par:finish(0)), false
    end
    timing:add("communication", now() - t1)
    -- the loss is the global mean and the norm global: every rank decides alike
    -- loss_fn's extras over the dp ranks (and from the last pipeline stage): after finish(), with
    -- no reduction in flight (an error here, names that differ, leaves nothing pending)
    extras = extras_mod.values(par:reduce_extras(extras))
    event = nonfinite.event(run, loss_sum / k, norm)
    sharded.fence() -- a background save has copied the weights before they change
    local t2 = now()
    if take and not event then par.optimizer:step{lr = lr} end
    timing:add("optimizer", now() - t2)
    par:after_step()
    if run.grads_hook then run.grads_hook() end
    par:zero_grad()
    return par.optimizer.state
  end)
  -- tokens of the global batch: every dp rank took its own rows (tp and pp ranks share them)
  return loss_sum / k, tokens * run.mesh.dp_size, norm, run.prec:report(extras), event
end

-- Whether the record of the step just taken is logged: every log_every steps, the last step, a
-- step with a nan or inf (an event). The same on every rank (an interrupt, which may reach the
-- ranks at different steps, also logs its step, without what per_rank adds).
function M.logged(run, event)
  return run.step % run.log_every == 0 or run.step == run.total or event ~= nil
end

-- Seconds this process has spent blocked in collectives (lutra.dist.comm; loaded under a layout).
function M.blocked_seconds() return require("lutra.dist.comm").blocked_seconds() end

-- Under a layout of more than one rank, on logged steps: every rank's step time, time blocked on
-- the reduction and peak device memory into the record r, as rank_step_ms, rank_comm_wait_ms and
-- rank_peak_mem_mb, lists over the world in world rank order (rank 0 first), from one all_gather
-- of three numbers a rank. One process: nothing.
function M.per_rank(run, r, event)
  local mesh = run.mesh
  if mesh == nil or mesh.size == 1 or not M.logged(run, event) then return end
  local mine = create.tensor({r.step_ms, r.comm_wait_ms or 0, r.peak_mem_mb}, {dtype = "f64"})
  local all = mesh.world:all_gather(nil, mine)
  local v = all:view(-1):tolist()
  mine:free()
  all:free()
  local ms, wait, mb = {}, {}, {}
  for i = 1, mesh.size do ms[i], wait[i], mb[i] = v[3 * i - 2], v[3 * i - 1], v[3 * i] end
  r.rank_step_ms, r.rank_comm_wait_ms, r.rank_peak_mem_mb = ms, wait, mb
end

-- The mean over n batches of f(batch) in eval mode (the model's train mode comes back after).
local function mean_in_eval_mode(model, n, f)
  if type(model.eval) == "function" then model:eval() end
  local sum = 0
  local ok, err = errors.pcall(function()
    for _ = 1, n do sum = sum + f() end
  end)
  if type(model.train) == "function" then model:train() end
  if not ok then error(err, 0) end
  return sum / n
end

-- The mean loss over n batches of the val loader (no grad, eval mode).
function M.evaluate(model, val, n, loss_fn, device)
  return mean_in_eval_mode(model, n, function()
    return grad.no_grad(tidy, function() return to_number(loss_fn(model, next_batch(val, device))) end)
  end)
end

-- The mean loss over n batches of the val loader under a parallel layout.
function M.evaluate_parallel(par, val, n, loss_fn, device)
  return mean_in_eval_mode(par.model, n, function() return par:eval_loss(next_batch(val, device), loss_fn) end)
end

return M
