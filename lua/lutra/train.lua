-- lutra.train — the training loop.
--
--   local result = lutra.train{model = model, data = train_loader, config = cfg}
--   -- optional: optimizer = opt, loss_fn = function(model, batch) -> loss [, {name = number}],
--   --           val_data = loader, tokenizer = tok (for samples), log = function(record),
--   --           until_step = n (stop after step n, saving a checkpoint when run_dir is set: the
--   --           schedule still spans config.steps), resume = path | "auto", quiet = true
--
-- One step: grad_accum micro-batches, each loss scaled by 1 / grad_accum before backward,
-- then the gradient is clipped to grad_clip (global norm; 0: no clipping, the norm is
-- still measured) and the optimizer steps at the schedule's lr for that step. The
-- default loss is the model's next-token loss: select(2, model:forward(x, y)). A batch
-- handed to loss_fn is {x =, y =, x, y} (or the loader's own table when it returns one).
--
-- Config keys (any missing one takes the default in DEFAULTS below): steps, grad_accum,
-- grad_clip, lr, min_lr, warmup, schedule ("cosine", "linear", "constant", "wsd"),
-- optimizer ("adamw", "sgd", "lion"), weight_decay, betas, eps, eval_every, eval_iters,
-- sample_every, sample_tokens, sample_prompt, temperature, top_k, top_p, log_every (metrics
-- records and the progress line), print_every (plain progress lines when stdout is not a
-- terminal; 0: steps / 50),
-- run_dir (metrics.jsonl, config.lua and checkpoints go there; "" for none), ckpt_every,
-- ckpt_keep, ckpt_async (the state is copied, then compressed and written in the background), resume ("" none, "auto" the latest checkpoint of run_dir, or a path),
-- precision ("fp32", "bf16", "fp16": lutra/train/precision.lua), loss_scale and growth_interval
-- (fp16), parallel (a layout: lutra/dist/mesh.lua).
--
-- Each step runs inside lutra.tidy: activations, gradients and temporaries are freed when
-- it ends (the optimizer's state and the parameters are kept), so memory stays flat.
-- Ctrl-C (when the C core's interrupt flag is available) ends the run after the current
-- step, saving a checkpoint when run_dir is set; a second Ctrl-C interrupts at once.
-- Resume restores weights, optimizer state, step (the schedule is a function of it), the
-- RNG and both loaders' positions: a resumed run continues bitwise like a straight one.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local ops = require "lutra.ops"
local create = require "lutra.create"
local grad = require "lutra.nn.grad"
local schedule_mod = require "lutra.optim.schedule"
local ckpt = require "lutra.train.state" -- the earlier single-process format (still read)
local sharded = require "lutra.ckpt"
local train_state = require "lutra.ckpt.train_state"
local progress = require "lutra.train.progress"
local metrics = require "lutra.train.metrics"
local interrupt = require "lutra.train.interrupt"
local generate = require "lutra.generate"
local fault = require "lutra.train.fault"
local precision = require "lutra.train.precision" -- config.precision: fp32, bf16, fp16 (mixed precision)

local raise, is_tensor = errors.raise, ops.is_tensor
local tidy = memory.tidy

local M = {}

M.DEFAULTS = {
  steps = 1000, grad_accum = 1, grad_clip = 1.0, lr = 1e-3, min_lr = 1e-4, warmup = 100, schedule = "cosine",
  decay_frac = 0.2, optimizer = "adamw", weight_decay = 0.1, betas = {0.9, 0.95}, eps = 1e-8, momentum = 0.9,
  eval_every = 250, eval_iters = 20, sample_every = 0, sample_tokens = 200, sample_prompt = "", temperature = 0.8,
  top_k = 0, top_p = 0.95, log_every = 1, print_every = 0, run_dir = "", ckpt_every = 0, ckpt_keep = 2, resume = "",
  ckpt_async = true,
}

local now = interrupt.now

-- cfg value with a default (config tables from lutra.config are plain tables).
local function getter(cfg)
  return function(key)
    local v = cfg[key]
    if v == nil then v = M.DEFAULTS[key] end
    return v
  end
end

local function params_of(model)
  local ps = model:parameters()
  if type(ps) ~= "table" then raise("train: model:parameters() must return a list of tensors") end
  return ps
end

-- ---- optimizer, schedule, clipping ---------------------------------------------------------------

local function make_schedule(get)
  local kind = get "schedule"
  if type(kind) ~= "string" then return kind end -- a function or schedule object
  local opts = {kind = kind, lr = get "lr", warmup = get "warmup"}
  if kind ~= "constant" then
    opts.min_lr, opts.total = get "min_lr", get "steps"
    if opts.total <= opts.warmup then opts.warmup = 0 end
  end
  if kind == "wsd" then opts.decay_frac = get "decay_frac" end
  return schedule_mod.make(opts)
end

local function make_optimizer(model, get)
  local optim = require "lutra.optim"
  local name = get "optimizer"
  local no_decay = nil
  local nd = get "no_decay"
  if nd == "matrices" then no_decay = {} end -- decay every matrix, embeddings too (nanoGPT, the peer)
  -- bf16/fp16: a model built in bf16/f16 gets f32 master copies in the optimizer (f32 ones need none)
  local prec = get "precision"
  local master = (prec == "bf16" or prec == "fp16") or nil
  if name == "adamw" then
    local b = get "betas"
    return optim.AdamW(model, {lr = get "lr", betas = {b[1], b[2]}, eps = get "eps", weight_decay = get "weight_decay",
                               no_decay = no_decay, master_weights = master})
  elseif name == "lion" then
    local b = get "betas"
    return optim.Lion(model, {lr = get "lr", betas = {b[1], b[2]}, weight_decay = get "weight_decay",
                              no_decay = no_decay, master_weights = master})
  elseif name == "sgd" then
    return optim.SGD(model, {lr = get "lr", momentum = get "momentum", weight_decay = get "weight_decay",
                             no_decay = no_decay, master_weights = master})
  end
  raise("train: unknown optimizer '" .. tostring(name) .. "' (adamw, sgd, lion)")
end

-- The global gradient norm, after clipping to max_norm (> 0) as torch's clip_grad_norm_.
local function clip_grad_norm(params, max_norm)
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

-- ---- batches and losses ------------------------------------------------------------------------

-- The loader's next batch, its tensors on `device` (the model's: loaders make CPU batches).
local function next_batch(loader, device)
  local a, b = loader:next()
  local batch = (type(a) == "table" and not is_tensor(a)) and a or {x = a, y = b, a, b}
  if device and device ~= "cpu" then
    local moved = {}
    for k, v in pairs(batch) do
      if is_tensor(v) and v.device ~= device then
        moved[v] = moved[v] or v:to(device) -- x and batch[1] are one tensor: one copy
        batch[k] = moved[v]
      end
    end
  end
  return batch
end

-- Where the model's parameters are (the first one's device; "cpu" for a model without any).
local function device_of(params)
  local p = params[1]
  return p ~= nil and p.device or "cpu"
end

local function default_loss(model, batch)
  local _, loss = model:forward(batch.x, batch.y)
  if loss == nil then raise("train: model:forward(x, y) returned no loss (give loss_fn for other models)") end
  return loss
end

local function batch_tokens(batch)
  local x = batch.x or batch[1]
  if is_tensor(x) then return x:numel() end
  return 0
end

local function to_number(loss)
  if type(loss) == "number" then return loss end
  return loss:item()
end

-- The mean loss over n batches of the val loader (no grad, eval mode).
local function evaluate(model, val, n, loss_fn, device)
  if type(model.eval) == "function" then model:eval() end
  local sum = 0
  local ok, err = pcall(function()
    for _ = 1, n do
      sum = sum + grad.no_grad(tidy, function() return to_number(loss_fn(model, next_batch(val, device))) end)
    end
  end)
  if type(model.train) == "function" then model:train() end
  if not ok then error(err, 0) end
  return sum / n
end

local evaluate_parallel, plain_copy

-- ---- checkpoints ---------------------------------------------------------------------------

-- Checkpoints (lutra.ckpt: a directory of lz4 shards, one file per rank, a manifest of every
-- tensor's global shape and pieces; atomic, optionally asynchronous, resharded on load).
-- The parameters go under their global names, the optimizer's tensors as optim.<name>.<field>
-- (lutra.ckpt.train_state); the rest (RNG, loader positions, optimizer numbers, the loss
-- scale) is each rank's extra state. Every rank of a layout takes part in a save.

-- This rank's parameters as {name =, tensor =} (shards carry their lutra.dist.spec).
local function named_params(run)
  local out = {}
  for name, p in (run.par and run.par.model or run.model):named_parameters() do
    out[#out + 1] = {name = name, tensor = p}
  end
  return out
end

local function layout_of(run)
  local m = run.mesh
  if not m then return {dp = 1, tp = 1, pp = 1, zero = 0, world = 1} end
  return {dp = m.dp_size, tp = m.tp_size, pp = m.pp_size, zero = m.zero, world = m.size}
end

local function save(run)
  local dir = string.format("%s/step_%06d", run.ckpt_root, run.step)
  local tensors, optim_numbers = train_state.collect(named_params(run), run.opt)
  local extra = {optim = optim_numbers, rng = create.get_rng_state(), loader = run.data:state(),
                 val_loader = run.val and run.val:state() or nil, tokens = run.tokens, best_val = run.best_val,
                 precision = run.prec:state()} -- precision: fp16's loss scale, else nil
  sharded.save(dir, {step = run.step, layout = layout_of(run), config = run.cfg_plain, tensors = tensors,
                     extra = extra, files = run.ckpt_files},
    {world = run.mesh and run.mesh.world or nil, async = run.get "ckpt_async", keep = run.get "ckpt_keep"})
  return dir
end

-- The newest valid checkpoint under root (a damaged one is skipped, and said so), or nil.
local function latest(root)
  local path = sharded.latest(root)
  if path == nil and ckpt.latest(root) then path = ckpt.latest(root) end -- an older run's format
  return path
end

local function restore(run, path)
  if not ckpt.exists(path .. "/manifest.json") and ckpt.exists(path .. "/manifest.lua") then
    -- a checkpoint of the earlier single-process format
    if run.par then raise("train: " .. path .. " is a single-process checkpoint of the old format; resume it "
      .. "on one process (it then saves in the sharded format)") end
    local st = ckpt.load(path)
    run.model:load_state_dict(st.model)
    run.opt:load_state_dict(st.optimizer)
    create.set_rng_state(st.rng)
    run.data:set_state(st.loader)
    if run.val and st.val_loader then run.val:set_state(st.val_loader) end
    run.step, run.tokens, run.best_val = st.step, st.tokens or 0, st.best_val
    run.prec:set_state(st.precision)
    return
  end
  local r = sharded.load(path)
  -- parameters and optimizer state, resharded to this rank's pieces of the current layout
  train_state.restore(r, named_params(run), run.opt)
  -- the rank-local state: this rank's own under the same layout, else rank 0's (the loader
  -- position counts global batches, the same in every layout)
  local saved, now = r.manifest.layout or {}, layout_of(run)
  local same = saved.dp == now.dp and saved.tp == now.tp and saved.pp == now.pp and saved.zero == now.zero
    and r.manifest.world == now.world
  local x = r:extra(same and (run.mesh and run.mesh.rank or 0) or 0)
  create.set_rng_state(x.rng)
  run.data:set_state(x.loader)
  if run.val and x.val_loader then run.val:set_state(x.val_loader) end
  run.step, run.tokens, run.best_val = r.manifest.step, x.tokens or 0, x.best_val
  run.prec:set_state(x.precision)
end

-- The mean loss over n batches of the val loader under a parallel layout.
evaluate_parallel = function(par, val, n, loss_fn, device)
  local model = par.model
  if type(model.eval) == "function" then model:eval() end
  local sum = 0
  local ok, err = pcall(function()
    for _ = 1, n do sum = sum + par:eval_loss(next_batch(val, device), loss_fn) end
  end)
  if type(model.train) == "function" then model:train() end
  if not ok then error(err, 0) end
  return sum / n
end

-- ---- the loop ----------------------------------------------------------------------------

local function one_step(run, lr)
  local k, loss_fn, params = run.grad_accum, run.loss_fn, run.params
  local loss_sum, tokens, extras = 0, 0, nil
  local clip = run.get "grad_clip"
  local norm = tidy(function()
    run.opt:zero_grad()
    for _ = 1, k do
      local batch = next_batch(run.data, run.device)
      tokens = tokens + batch_tokens(batch)
      local loss, extra = loss_fn(run.model, batch)
      if not is_tensor(loss) and type(loss) ~= "table" then
        raise("train: the loss must be a tensor, got " .. type(loss))
      end
      loss_sum = loss_sum + to_number(loss)
      if k > 1 then loss = loss * (1 / k) end
      loss = run.prec:scale(loss) -- fp16: times the loss scale (else loss itself)
      run.prec:backward(loss) -- loss:backward(), under the forward's autocast (bf16, fp16)
      if type(extra) == "table" then
        extras = extras or {}
        for name, v in pairs(extra) do extras[name] = (extras[name] or 0) + to_number(v) / k end
      end
    end
    -- fp32/bf16: clip_grad_norm, step; fp16: unscale + clip, no step when a gradient is inf/nan
    local n, take = run.prec:clip_grads(params, clip, clip_grad_norm)
    sharded.fence() -- a background save has copied the weights before they change
    if take then run.opt:step{lr = lr} end
    -- Drop the gradients now (set_to_none) and free their memory: tensors made by backward
    -- are not in this tidy scope, and would otherwise wait for the GC.
    for _, p in ipairs(params) do
      local g = p.grad
      if g ~= nil then
        p.grad = nil
        g:free()
      end
    end
    return n, run.opt.state -- the optimizer's state outlives the scope
  end)
  return loss_sum / k, tokens, norm, run.prec:report(extras)
end

-- One step of a parallel layout (config.parallel): lutra.dist.parallelize does the
-- communication; the losses are global means, the same on every rank.
local function one_step_parallel(run, lr)
  local k, par = run.grad_accum, run.par
  local tokens = 0
  local loss_sum, norm = 0, 0
  tidy(function()
    par:zero_grad()
    local batches = {}
    for i = 1, k do
      batches[i] = next_batch(run.data, run.device)
      tokens = tokens + batch_tokens(batches[i])
    end
    -- fp16: losses scaled before backward, gradients unscaled + clipped after the sync,
    -- no step when one is inf/nan (fp32, bf16: prec.loss_scale is nil, nothing changes)
    local prec = run.prec
    if par.stage and prec.dtype then
      raise("train: precision = \"" .. prec.mode .. "\" with pipeline parallel is not supported yet")
    end
    loss_sum = prec:run(par.forward_backward, par, batches, prec:scaled(run.loss_fn)) / prec:factor()
    local take = true
    if prec.loss_scale then
      norm, take = prec:unscale_and_clip(par.optimizer.params, par:finish(0), run.get "grad_clip")
    else
      norm = par:finish(run.get "grad_clip")
    end
    sharded.fence() -- a background save has copied the weights before they change
    if take then par.optimizer:step{lr = lr} end
    par:after_step()
    par:zero_grad()
    return par.optimizer.state
  end)
  -- tokens of the global batch: every dp rank took its own rows (tp and pp ranks share them)
  return loss_sum / k, tokens * run.mesh.dp_size, norm, run.prec:report(nil)
end

-- The data of a plain config table (numbers, strings, booleans, tables of them), for the
-- checkpoint's manifest; functions and other values are left out.
function plain_copy(v, depth)
  depth = depth or 0
  if type(v) ~= "table" or depth > 8 then return v end
  local out = {}
  for k, x in pairs(v) do
    local t = type(x)
    if (type(k) == "string" or type(k) == "number") and (t == "number" or t == "string" or t == "boolean") then
      out[k] = x
    elseif t == "table" and getmetatable(x) == nil then
      out[k] = plain_copy(x, depth + 1)
    end
  end
  return out
end

-- A list of {name, tensor} pairs (this rank's parameters or shards) as something with
-- named_parameters(), so that the optimizer's weight-decay groups see the global names.
local function as_module(named)
  if type(named) == "table" and type(named.named_parameters) == "function" then return named end
  return {named_parameters = function()
    local i = 0
    return function()
      i = i + 1
      local e = named[i]
      if e then return e[1], e[2] end
    end
  end}
end

-- The mesh of args.mesh or config.parallel (nil: a single process).
local function mesh_of(args, cfg)
  local mesh = args.mesh
  if mesh == nil and cfg.parallel ~= nil then mesh = require("lutra.dist").init(cfg.parallel) end
  return mesh
end

function M.train(args)
  if type(args) ~= "table" then raise("train: expected a table {model =, data =, config =}") end
  local model, data = args.model, args.data
  if type(model) ~= "table" or type(model.parameters) ~= "function" then
    raise("train: model = must be a module (with parameters())")
  end
  if type(data) ~= "table" or type(data.next) ~= "function" then raise("train: data = must be a loader with :next()") end
  local cfg = args.config or {}
  local get = getter(cfg)
  local run = {model = model, data = data, get = get, params = params_of(model), step = 0, tokens = 0}
  run.prec = precision.new(get) -- mixed precision: the forward under autocast (precision.lua)
  run.loss_fn = run.prec:wrap(args.loss_fn or default_loss)
  run.grad_accum = get "grad_accum"
  if type(run.grad_accum) ~= "number" or run.grad_accum < 1 then raise("train: grad_accum must be >= 1") end

  local mesh = mesh_of(args, cfg)
  if mesh and mesh.size > 1 then
    if args.optimizer then
      raise("train: with a parallel layout the optimizer is built over this rank's shards: give its settings "
        .. "in the config (optimizer, lr, betas, weight_decay, ...) rather than optimizer =")
    end
    run.mesh = mesh
    -- each data-parallel rank reads its own rows of the global batch
    if mesh.dp_size > 1 and data.dp_size == 1 and type(data.with) == "function" then
      data = data:with{dp_rank = mesh.dp_rank, dp_size = mesh.dp_size}
      run.data = data
    end
    run.par = require("lutra.dist").parallelize(model, mesh,
      {optimizer = function(named) return make_optimizer(as_module(named), get) end, local_batch = data.local_batch})
    run.opt = run.par.optimizer
    run.params = run.par:parameters()
  end
  run.opt = run.opt or args.optimizer or make_optimizer(model, get)
  run.device = device_of(run.params) -- batches follow the model (recipes put it on the GPU: lt.device())
  run.val = args.val_data
  if run.val == nil and type(data.with) == "function" and get "eval_every" > 0 then
    local ok, v = pcall(data.with, data, {split = "val"})
    if ok then run.val = v end
  elseif run.mesh and run.val and run.mesh.dp_size > 1 and run.val.dp_size == 1 and type(run.val.with) == "function" then
    run.val = run.val:with{dp_rank = run.mesh.dp_rank, dp_size = run.mesh.dp_size}
  end
  -- the lr of each step: schedule =, else the given optimizer's own schedule, else the config's
  local sched = args.schedule or (args.optimizer and args.optimizer.schedule) or make_schedule(get)
  run.cfg_plain = type(cfg.plain) == "function" and cfg:plain() or plain_copy(cfg)
  local total = get "steps"
  local run_dir = get "run_dir"
  if run_dir == "" then run_dir = nil end
  local main_rank = run.mesh == nil or run.mesh.rank == 0
  -- every rank writes its shard of a checkpoint; rank 0 alone logs, writes metrics and samples
  run.ckpt_root = run_dir and run_dir .. "/ckpt" or nil
  if not main_rank then run_dir = nil end
  run.run_dir = run_dir
  local quiet = args.quiet or not main_rank
  local bar = progress.new{total = total, out = args.out or io.stdout, tty = args.tty}
  local say = quiet and function() end or function(s) bar:print(s) end

  -- resume
  local resume = args.resume or get "resume"
  -- a job restarted by `lutra launch --max-restarts` resumes from the latest valid checkpoint
  if (resume == nil or resume == "") and os.getenv("LUTRA_RESUME") == "auto" then resume = "auto" end
  if resume and resume ~= "" then
    local path = resume
    if resume == "auto" then path = run.ckpt_root and latest(run.ckpt_root) end
    if path then
      restore(run, path)
      say(string.format("resumed from %s at step %d", path, run.step))
    end
  end

  local log
  if run_dir then
    ckpt.mkdir_p(run_dir)
    -- the tokenizer goes into every checkpoint (rank 0 copies it in)
    local tok = args.tokenizer
    if type(tok) == "table" and type(tok.save) == "function" and pcall(tok.save, tok, run_dir .. "/tokenizer.json") then
      run.ckpt_files = {["tokenizer.json"] = run_dir .. "/tokenizer.json"}
    end
    if type(cfg.save) == "function" then pcall(cfg.save, cfg, run_dir .. "/config.lua") end
    log = metrics.open(run_dir .. "/metrics.jsonl", run.step == 0 and "w" or "a")
  end
  local function record(r)
    if log then log:write(r) end
    if args.log then args.log(r) end
  end

  local eval_every, eval_iters = get "eval_every", get "eval_iters"
  local sample_every = get "sample_every"
  local log_every, ckpt_every = get "log_every", get "ckpt_every"
  -- plain lines (not a terminal): every print_every steps, by default about 50 lines a run
  local print_every = get "print_every"
  if print_every == 0 then print_every = math.max(1, math.floor(total / 50)) end
  print_every = math.max(print_every, log_every)
  local losses, val_losses = {}, {}
  local last_loss, last_val = nil, nil
  local t_start, tok_start = now(), run.tokens
  local t_window, tok_window = t_start, run.tokens
  local interrupted = false
  local train_seconds = 0 -- in training steps only (not evaluation, samples, checkpoints)
  local stop_at = args.until_step or total -- stop (and save) there, as an interrupt would
  local result_ckpt = nil
  local armed = not args.no_interrupt and interrupt.arm()

  local function sample()
    local tok = args.tokenizer
    if not tok then return end
    local rng = create.get_rng_state() -- sampling draws must not move the training stream
    local ok, text = pcall(generate.text, model, tok, get "sample_prompt",
      {max_new_tokens = get "sample_tokens", temperature = get "temperature", top_k = get "top_k", top_p = get "top_p"})
    create.set_rng_state(rng)
    if ok then
      say(string.format("---- sample at step %d ----\n%s\n----", run.step, text))
      if run_dir then
        local f = io.open(run_dir .. "/samples.txt", "a")
        if f then
          f:write(string.format("---- step %d ----\n%s\n", run.step, text))
          f:close()
        end
      end
    else
      say("sample failed: " .. tostring(text))
    end
  end

  local ok, err = pcall(function()
    while true do
      local done = run.step >= total
      if run.val and eval_every > 0 and (run.step % eval_every == 0 or done) then
        local v = run.par and evaluate_parallel(run.par, run.val, eval_iters, run.loss_fn, run.device)
          or evaluate(model, run.val, eval_iters, run.loss_fn, run.device)
        last_val = v
        if run.best_val == nil or v < run.best_val then run.best_val = v end
        val_losses[#val_losses + 1] = {step = run.step, loss = v}
        record{step = run.step, val_loss = v}
        say(string.format("step %d: val loss %.4f", run.step, v))
      end
      if sample_every > 0 and not run.par and run.step > 0 and (run.step % sample_every == 0 or done) then sample() end
      if done then break end

      local lr = sched(run.step)
      local t0 = now()
      local loss, tokens, norm, extras = (run.par and one_step_parallel or one_step)(run, lr)
      local dt = now() - t0
      train_seconds = train_seconds + dt
      run.step = run.step + 1
      run.tokens = run.tokens + tokens
      losses[#losses + 1] = loss
      last_loss = loss
      fault.after_step(run.step, run.mesh and run.mesh.rank or 0)
      if interrupt.pending() then interrupted = true end

      local t = now()
      local r = {step = run.step, loss = loss, lr = lr, grad_norm = norm, tokens = run.tokens,
                 step_ms = dt * 1000, tokens_per_s = (run.tokens - tok_window) / math.max(t - t_window, 1e-9)}
      if extras then
        for name, v in pairs(extras) do r[name] = v end
      end
      local rate = (run.tokens - tok_start) / math.max(t - t_start, 1e-9)
      r.eta = (total - run.step) * tokens / math.max(rate, 1e-9)
      if run.step % log_every == 0 or run.step == total or interrupted then
        record(r)
        if not quiet and (bar.tty or run.step % print_every == 0 or run.step == total or interrupted) then
          bar:update(r)
        end
        t_window, tok_window = t, run.tokens
      end
      local stopping = interrupted or (run.step >= stop_at and run.step < total)
      if run.ckpt_root and ((ckpt_every > 0 and run.step % ckpt_every == 0) or stopping) then
        result_ckpt = save(run)
      end
      if stopping then break end -- before the next evaluation: a resumed run does that one
    end
  end)
  if armed then interrupt.disarm() end
  bar:finish()
  if log then log:close() end
  if not ok then
    pcall(sharded.wait) -- a save in flight is committed (or fails) before the error goes on
    error(err, 0)
  end
  if interrupted then say(string.format("interrupted: stopped after step %d", run.step)) end
  local elapsed = now() - t_start
  local result = {step = run.step, loss = last_loss, val_loss = last_val, best_val = run.best_val, losses = losses,
                  val_losses = val_losses, interrupted = interrupted, seconds = elapsed, tokens = run.tokens,
                  train_seconds = train_seconds, optimizer = run.opt,
                  tokens_per_s = (run.tokens - tok_start) / math.max(train_seconds, 1e-9)}
  result.checkpoint = result_ckpt
  result.parallel = run.par -- the layout's model, optimizer and groups (nil on one process)
  if run.ckpt_root and ckpt_every > 0 and run.step == total and run.step % ckpt_every ~= 0 then
    result.checkpoint = save(run)
  end
  -- an asynchronous save still writing: the run ends when it is committed (errors raise here)
  sharded.wait()
  return result
end

-- Exposed for recipes and tests.
M.evaluate = evaluate
M.clip_grad_norm = clip_grad_norm
M.checkpoint = ckpt

return setmetatable(M, {__call = function(_, args) return M.train(args) end})
