-- lutra.train — the training loop.
--
--   local result = lutra.train{model = model, data = train_loader, config = cfg}
--   -- optional: optimizer = opt, loss_fn = function(model, batch) -> loss [, {name = number}],
--   --           val_data = loader, tokenizer = tok (for samples), log = function(record),
--   --           until_step = n (stop after step n, saving a checkpoint when run_dir is set: the
--   --           schedule still spans config.steps), resume = path | "auto" | "fresh", quiet = true
--
-- The loop is a Trainer object with named steps: new (setup: lutra.train.setup), resume
-- (lutra.train.resume), open_outputs, then per step evaluate, sample, train_step
-- (lutra.train.step), log_step, save; finish builds the result. One step: grad_accum
-- micro-batches, each loss scaled by 1 / grad_accum before backward, then the gradient is
-- clipped to grad_clip (global norm; 0: no clipping, the norm is still measured) and the
-- optimizer steps at the schedule's lr for that step. The default loss is the model's
-- next-token loss: select(2, model:forward(x, y)). A batch handed to loss_fn is
-- {x =, y =, x, y} (or the loader's own table when it returns one). loss_fn's extra metrics are
-- logged with the step: a number (or one-element tensor) is averaged over the step's micro-batches
-- and the data-parallel ranks; {value, reduce = "sum"} is summed there instead (a count: the
-- step's total over the global batch); every rank gives the same names (lutra/train/extras.lua).
-- Under tensor parallel, model(x, y) gives this rank's vocab columns of the logits
-- (lutra.dist.tp.gather_logits: all of them) and tp rank 0's extras are logged; under pipeline
-- parallel loss_fn runs on the last stage, once a pipeline micro-batch, with a model whose
-- model(x, y) gives the logits and loss of the activation the stages computed from x. Under a
-- layout a record has comm_wait_ms (the step's time blocked in collectives and waits on them:
-- lutra.dist.comm.blocked_seconds), and a logged one of many ranks rank_step_ms, rank_comm_wait_ms and rank_peak_mem_mb:
-- each rank's step_ms, comm_wait_ms and peak_mem_mb, over the world in rank order. Every rank
-- ends a step at the same collective, so their step times agree: a straggler is the rank that
-- waits least (the others wait for it).
--
-- Config keys (any missing one takes the default in DEFAULTS below): steps, grad_accum,
-- grad_clip, lr, min_lr, warmup, schedule ("cosine", "linear", "constant", "wsd"),
-- optimizer ("adamw", "sgd", "lion", "adafactor", "lamb"), weight_decay, betas, eps, eval_every, eval_iters,
-- sample_every, sample_tokens, sample_prompt, temperature, top_k, top_p, log_every (metrics
-- records and the progress line), print_every (plain progress lines when stdout is not a
-- terminal; 0: steps / 50),
-- run_dir (config.json and checkpoints go there, each run's metrics.jsonl, train.log and samples.txt to
-- run_dir/runs/ID, `latest` the newest: lutra.train.runs; "" for none), ckpt_every,
-- ckpt_keep, ckpt_async (the state is copied, then compressed and written in the background), resume ("" none, "auto" the latest checkpoint of run_dir, or a path),
-- precision ("fp32", "bf16", "fp16": lutra/train/precision.lua), loss_scale and growth_interval
-- (fp16), parallel (a layout: lutra/dist/mesh.lua), nonfinite ("stop", "skip", "rollback": what a
-- step whose loss or gradient norm is nan or inf does, lutra/train/nonfinite.lua),
-- nonfinite_max_skips, nonfinite_max_rollbacks, log_tensorboard (TensorBoard's event file in the
-- run's directory: every scalar of the records, the config and samples as text: lutra.train.tb_sink),
-- histogram_every (0: none; N: histograms of the weights and gradients every N steps), profile ("" off;
-- "N-M" profiles steps N to M, "N" the N steps after step 1: trace.json in the run's directory and a
-- table, lutra/train/profile.lua).
--
-- Each step runs inside lutra.tidy: activations, gradients and temporaries are freed when
-- it ends (the optimizer's state and the parameters are kept), so memory stays flat.
-- Ctrl-C (when the C core's interrupt flag is available) ends the run after the current
-- step, saving a checkpoint when run_dir is set; a second Ctrl-C interrupts at once.
-- Resume restores weights, optimizer state, step (the schedule is a function of it), the
-- RNG and both loaders' positions: a resumed run continues bitwise like a straight one.
local errors = require "lutra.errors"
local create = require "lutra.create"
local sharded = require "lutra.ckpt"
local progress = require "lutra.train.progress"
local outputs = require "lutra.train.outputs"
local interrupt = require "lutra.train.interrupt"
local generate = require "lutra.generate"
local fault = require "lutra.train.fault"
local precision = require "lutra.train.precision" -- config.precision: fp32, bf16, fp16 (mixed precision)
local setup = require "lutra.train.setup"
local step_mod = require "lutra.train.step"
local resume_mod = require "lutra.train.resume"
local batch_mod = require "lutra.train.batch"
local nonfinite = require "lutra.train.nonfinite"
local memory = require "lutra.memory"
local mfu = require "lutra.train.mfu"
local timing = require "lutra.train.timing"
local train_profile = require "lutra.train.profile"

local raise = errors.raise
local now = interrupt.now

local M = {}

M.DEFAULTS = {
  steps = 1000, grad_accum = 1, grad_clip = 1.0, lr = 1e-3, min_lr = 1e-4, warmup = 100, schedule = "cosine",
  decay_frac = 0.2, optimizer = "adamw", weight_decay = 0.1, betas = {0.9, 0.95}, eps = 1e-8, momentum = 0.9,
  eval_every = 250, eval_iters = 20, sample_every = 0, sample_tokens = 200, sample_prompt = "", temperature = 0.8,
  top_k = 0, top_p = 0.95, log_every = 1, print_every = 0, run_dir = "", ckpt_every = 0, ckpt_keep = 2, resume = "",
  ckpt_async = true, nonfinite = "stop", nonfinite_max_skips = 10, nonfinite_max_rollbacks = 3, profile = "",
  log_tensorboard = true, histogram_every = 0,
}

local Trainer = {}
Trainer.__index = Trainer
M.Trainer = Trainer

local function check_args(args)
  if type(args) ~= "table" then raise("train: expected a table {model =, data =, config =}") end
  local model, data = args.model, args.data
  if type(model) ~= "table" or type(model.parameters) ~= "function" then
    raise("train: model = must be a module (with parameters())")
  end
  if type(data) ~= "table" or type(data.next) ~= "function" then raise("train: data = must be a loader with :next()") end
end

-- Setup: precision, the layout, optimizer, val loader, schedule, where outputs go.
function Trainer.new(args)
  check_args(args)
  local cfg = args.config or {}
  local get = setup.getter(cfg, M.DEFAULTS)
  setup.check_ranges(get)
  local self = setmetatable({args = args, cfg = cfg, model = args.model, data = args.data, get = get,
                             params = setup.params_of(args.model), step = 0, tokens = 0}, Trainer)
  self.prec = precision.new(get) -- mixed precision: the forward under autocast (precision.lua)
  self.nonfinite = nonfinite.new(get) -- a step whose loss or gradient norm is nan or inf (nonfinite.lua)
  self.loss_fn = self.prec:wrap(args.loss_fn or batch_mod.default_loss)
  self.grad_accum = get "grad_accum"
  if type(self.grad_accum) ~= "number" or self.grad_accum < 1 then raise("train: grad_accum must be >= 1") end
  setup.parallel(self, args, cfg)
  self.opt = self.opt or args.optimizer or setup.optimizer(self.model, get)
  self.device = batch_mod.device_of(self.params) -- batches follow the model (recipes put it on the GPU: lt.device())
  self.val = setup.val_loader(self, args.val_data)
  -- the lr of each step: schedule =, else the given optimizer's own schedule, else the config's
  self.sched = args.schedule or (args.optimizer and args.optimizer.schedule) or setup.schedule(get, cfg)
  self.cfg_plain = type(cfg.plain) == "function" and cfg:plain() or setup.plain_copy(cfg)
  self.total = get "steps"
  local run_dir = get "run_dir"
  if run_dir == "" then run_dir = nil end
  local main_rank = self.mesh == nil or self.mesh.rank == 0
  -- every rank writes its shard of a checkpoint; rank 0 alone logs, writes metrics and samples
  self.ckpt_root = run_dir and run_dir .. "/ckpt" or nil
  self.run_dir = main_rank and run_dir or nil
  self.quiet = args.quiet or not main_rank
  self.bar = progress.new{total = self.total, out = args.out or io.stdout, tty = args.tty}
  return self
end

-- A line of the run's output (rank 0, unless quiet).
function Trainer:say(s)
  if not self.quiet then self.bar:print(s) end
  if self.out then self.out:line(s) end
end

-- Restores the checkpoint of args.resume or config.resume, when there is one.
function Trainer:resume()
  local path, why = resume_mod.resume(self, self.args.resume or self.get "resume")
  if path then
    self.resumed_from = path -- what nonfinite = "rollback" goes back to before the run saves one
    self:say(string.format("resumed from %s at step %d", path, self.step))
  elseif why then
    self:say("resume=auto: " .. why .. "; starting from step 1")
  end
end

-- The run's files (lutra.train.outputs): config.json, tokenizer.json, and runs/ID with the
-- metrics, train.log, samples and TensorBoard's events (rank 0, with a run_dir).
function Trainer:open_outputs()
  self.out = outputs.open(self)
  if self.out then self:say(string.format("run %s: %s", self.run_id, self.run_path)) end
end

-- One record to the run's files (metrics.jsonl, the events) and to args.log.
function Trainer:record(r)
  if self.out then self.out:record(r) end
  if self.args.log then self.args.log(r) end
end

-- The val loss now: recorded, printed, and the best kept.
function Trainer:evaluate()
  local get = self.get
  local v = self.par and step_mod.evaluate_parallel(self.par, self.val, get "eval_iters", self.loss_fn, self.device)
    or step_mod.evaluate(self.model, self.val, get "eval_iters", self.loss_fn, self.device)
  self.last_val = v
  if self.best_val == nil or v < self.best_val then self.best_val = v end
  self.val_losses[#self.val_losses + 1] = {step = self.step, loss = v}
  self:record{step = self.step, val_loss = v}
  self:say(string.format("step %d: val loss %.4f", self.step, v))
end

-- A sample of the model's text, printed and appended to the run's samples.txt.
function Trainer:sample()
  local tok, get = self.args.tokenizer, self.get
  if not tok then return end
  local rng = create.get_rng_state() -- sampling draws must not move the training stream
  local ok, text = pcall(generate.text, self.model, tok, get "sample_prompt",
    {max_new_tokens = get "sample_tokens", temperature = get "temperature", top_k = get "top_k", top_p = get "top_p"})
  create.set_rng_state(rng)
  if not ok then return self:say("sample failed: " .. tostring(text)) end
  self:say(string.format("---- sample at step %d ----\n%s\n----", self.step, text))
  if self.out then
    local saved, err = self.out:sample(self.step, text)
    if not saved then self:say("sample not saved: " .. tostring(err)) end
  end
end

-- Saves a checkpoint of this step (every rank takes part); returns its directory.
function Trainer:save()
  return resume_mod.save(self)
end

-- One optimizer step at the schedule's lr; returns the step's metrics record, the time, and the
-- nonfinite event when its loss or gradient norm was nan or inf (the step was not taken).
function Trainer:train_step()
  local lr = self.sched(self.step)
  local t0 = now()
  local waited = self.par and step_mod.blocked_seconds() -- time blocked in collectives, under a layout
  local loss, tokens, norm, extras, event = (self.par and step_mod.parallel or step_mod.single)(self, lr)
  local dt = now() - t0
  self.train_seconds = self.train_seconds + dt
  self.step = self.step + 1
  self.tokens = self.tokens + tokens
  self.losses[#self.losses + 1] = loss
  self.last_loss = loss
  fault.after_step(self.step, self.mesh and self.mesh.rank or 0)
  if interrupt.pending() then self.interrupted = true end
  local t = now()
  local r = {step = self.step, loss = loss, lr = lr, grad_norm = norm, tokens = self.tokens, step_ms = dt * 1000,
             tokens_per_s = (self.tokens - self.tok_window) / math.max(t - self.t_window, 1e-9),
             peak_mem_mb = memory.memory_stats(self.device).peak / 2 ^ 20} -- this rank's device, the process's peak
  if self.mfu then r.mfu = r.tokens_per_s * self.mfu.flops_per_token / self.mfu.peak end
  if waited then r.comm_wait_ms = (step_mod.blocked_seconds() - waited) * 1000 end
  step_mod.per_rank(self, r, event) -- rank_step_ms, rank_comm_wait_ms, rank_peak_mem_mb: logged steps, many ranks
  if extras then
    for name, v in pairs(extras) do r[name] = v end
  end
  local rate = (self.tokens - self.tok_start) / math.max(t - self.t_start, 1e-9)
  r.eta = (self.total - self.step) * tokens / math.max(rate, 1e-9)
  return r, t, event
end

-- The step's record to the metrics and the progress line, every log_every steps.
function Trainer:log_step(r, t)
  local step, total = self.step, self.total
  if step % self.log_every == 0 or step == total or self.interrupted or r.nonfinite then
    self:record(r)
    local plain = step % self.print_every == 0 or step == total or self.interrupted
    if not self.quiet and (self.bar.tty or plain) then self.bar:update(r) end
    if plain and self.out then self.out:line(self.bar:format(r)) end
    self.t_window, self.tok_window = t, self.tokens
  end
end

-- The counters of the loop, and when progress lines are printed.
function Trainer:start_clock()
  local get = self.get
  self.log_every = get "log_every"
  -- plain lines (not a terminal): every print_every steps, by default about 50 lines a run
  local print_every = get "print_every"
  if print_every == 0 then print_every = math.max(1, math.floor(self.total / 50)) end
  self.print_every = math.max(print_every, self.log_every)
  self.losses, self.val_losses = {}, {}
  self.t_start, self.tok_start = now(), self.tokens
  self.t_window, self.tok_window = self.t_start, self.tokens
  self.interrupted = false
  self.train_seconds = 0 -- in training steps only (not evaluation, samples, checkpoints)
  self.stop_at = self.args.until_step or self.total -- stop (and save) there, as an interrupt would
  self.mfu = mfu.of_run(self) -- model FLOPs utilisation's figures (lutra.train.mfu), or nil
  self.timing = timing.new() -- seconds per phase (lutra.train.timing), printed at the end
  self.profiler = train_profile.for_run(self) -- config.profile (lutra.train.profile)
end

-- Evaluate, sample, step, log, save, until config.steps (or until_step, or Ctrl-C).
function Trainer:loop()
  local get = self.get
  local eval_every, sample_every, ckpt_every = get "eval_every", get "sample_every", get "ckpt_every"
  while true do
    local done = self.step >= self.total
    local t0 = now()
    if self.val and eval_every > 0 and (self.step % eval_every == 0 or done) then
      self:evaluate()
      self.timing:add("evaluation", now() - t0)
    end
    local t1 = now()
    if sample_every > 0 and not self.par and self.step > 0 and (self.step % sample_every == 0 or done) then
      self:sample()
      self.timing:add("samples", now() - t1)
    end
    if done then break end
    self.profiler:before_step(self.step + 1)
    local r, t, event = self:train_step()
    self.profiler:after_step(self.step)
    -- a nan or inf: config.nonfinite stops the run (raises), skips the step or rolls back
    local outcome = event and self.nonfinite:handle(self, r, event)
    if not event then self.nonfinite:passed() end
    if outcome ~= "rolled_back" then
      self:log_step(r, t)
      local stopping = self.interrupted or (self.step >= self.stop_at and self.step < self.total)
      if self.ckpt_root and ((ckpt_every > 0 and self.step % ckpt_every == 0) or stopping) then
        local t2 = now()
        self.checkpoint = self:save()
        self.timing:add("checkpoint", now() - t2)
      end
      if stopping then break end -- before the next evaluation: a resumed run does that one
    elseif self.interrupted then
      break
    end
  end
end

-- The loop under Ctrl-C handling; the metrics file and progress line are closed either way.
function Trainer:run()
  self:start_clock()
  local armed = not self.args.no_interrupt and interrupt.arm()
  local ok, err = errors.pcall(self.loop, self) -- a post-mortem opens where the error was raised
  if armed then interrupt.disarm() end
  self.profiler:finish(ok)
  self.bar:finish()
  if not ok then
    if self.out then
      self.out:line("error: " .. tostring(err))
      self.out:close()
    end
    pcall(sharded.wait) -- a save in flight is committed (or fails) before the error goes on
    error(err, 0)
  end
  if self.interrupted then self:say(string.format("interrupted: stopped after step %d", self.step)) end
  return self:finish()
end

-- The result table; the last checkpoint (when ckpt_every does not divide steps) is saved and
-- every save is committed before it returns.
function Trainer:finish()
  local elapsed = now() - self.t_start
  local result = {step = self.step, loss = self.last_loss, val_loss = self.last_val, best_val = self.best_val,
                  losses = self.losses, val_losses = self.val_losses, interrupted = self.interrupted,
                  seconds = elapsed, tokens = self.tokens, train_seconds = self.train_seconds, optimizer = self.opt,
                  tokens_per_s = (self.tokens - self.tok_start) / math.max(self.train_seconds, 1e-9)}
  result.checkpoint = self.checkpoint
  result.nonfinite_skips, result.rollbacks = self.nonfinite.skips, self.nonfinite.rollbacks
  result.parallel = self.par -- the layout's model, optimizer and groups (nil on one process)
  local ckpt_every = self.get "ckpt_every"
  if self.ckpt_root and ckpt_every > 0 and self.step == self.total and self.step % ckpt_every ~= 0 then
    result.checkpoint = self:save()
  end
  -- an asynchronous save still writing: the run ends when it is committed (errors raise here)
  sharded.wait()
  self.timing:add("checkpoint", now() - elapsed - self.t_start) -- the last save and the wait
  local total = now() - self.t_start
  result.time_split = self.timing:split(total)
  if not self.quiet and self.step > 0 then
    for _, line in ipairs(self.timing:lines(total)) do self:say(line) end
  end
  if self.out then self.out:close() end
  return result
end

function M.train(args)
  local trainer = Trainer.new(args)
  trainer:resume()
  trainer:open_outputs()
  return trainer:run()
end

-- Exposed for recipes and tests.
M.evaluate = step_mod.evaluate
M.clip_grad_norm = step_mod.clip_grad_norm
M.nonfinite = nonfinite -- nonfinite.check/describe for loops of their own (recipes/dpo.lua)

return setmetatable(M, {__call = function(_, args) return M.train(args) end})
