-- lutra.train: a step whose loss or gradient norm is nan or inf (config.nonfinite,
-- lutra/train/nonfinite.lua). The bad step is made on purpose, at a known step: a loss_fn that
-- multiplies the loss by nan, or a hook that adds inf to one parameter's gradient. Everything
-- is compared exactly: the message's step, loss (the clean run's loss of that step, printed
-- %.6g) and parameter; weights and losses with == against a run without the bad step.
local lt = require "lutra"
local train = require "lutra.train"
local models = require "lutra.models"
local ckpt = require "lutra.ckpt"
local metrics = require "lutra.train.metrics"
local T = require "lutra.testing"
local equal, fails = T.assert_equal, T.assert_error

local dir = os.tmpname()
os.remove(dir)
os.execute("mkdir -p " .. dir)
local text_path = dir .. "/corpus.txt"
T.word_corpus(text_path, {"the", "king", "queen", "of", "a", "fair", "night", "and", "my", "lord"}, 3000, 7)
local tok = lt.tokenizer.char(assert(io.open(text_path)):read("*a"))

local function setup(arch)
  lt.manual_seed(1)
  local data = lt.data.text(text_path, tok, {seq_len = 16, batch = 4, seed = 1234, cache = dir .. "/corpus.bin",
                                             quiet = true})
  local model = models.build{arch = arch or "gpt2", n_layer = 1, n_head = 2, d_model = 16,
                             vocab_size = tok.vocab_size, block_size = 16, dropout = 0.1}
  return model, data
end

local runs = 0
local function config(extra)
  local cfg = {steps = 8, warmup = 2, lr = 3e-3, min_lr = 3e-4, grad_clip = 0.5, eval_every = 2, eval_iters = 2,
               betas = {0.9, 0.99}, weight_decay = 0.1, run_dir = "", ckpt_every = 0}
  for k, v in pairs(extra or {}) do cfg[k] = v end
  if cfg.run_dir == true then
    runs = runs + 1
    cfg.run_dir = dir .. "/run" .. runs
  end
  return cfg
end

-- A loss_fn whose loss is nan at the training steps listed in `at` (a set of step numbers,
-- counted by the training calls: eval runs under no_grad), micro-batch `micro` of each (1).
local function nan_loss(at, grad_accum, micro)
  local calls = 0
  return function(model, batch)
    local _, loss = model:forward(batch.x, batch.y)
    if lt.is_grad_enabled() then
      calls = calls + 1
      local step, m = math.ceil(calls / (grad_accum or 1)), (calls - 1) % (grad_accum or 1) + 1
      if at[step] and m == (micro or 1) then loss = loss * (0 / 0) end
    end
    return loss
  end, function() calls = 0 end
end

-- Adds inf to the gradient of parameter `name` in the backward of the training calls listed in `at`.
local function inf_grad(model, name, at)
  local p
  for n, q in model:named_parameters() do
    if n == name then p = q end
  end
  local calls = 0
  p:register_hook(function(g)
    calls = calls + 1
    if at[calls] then return g + (1 / 0) end
  end)
end

-- The weights as plain numbers (exact).
local function weights(model)
  local out = {}
  for name, p in model:named_parameters() do out[name] = p:tolist() end
  return out
end

-- A log function keeping the weights after every training step's record (by step).
local function snapshots(model)
  local after = {}
  return after, function(r)
    if r.loss ~= nil then after[r.step] = weights(model) end
  end
end

local function clean_run(extra)
  local model, data = setup()
  local r = train{model = model, data = data, config = config(extra), quiet = true, no_interrupt = true}
  return r, weights(model)
end

local clean, clean_weights = clean_run()

test("stop: an inf gradient names the step, its loss, the parameter; the step is not taken", function()
  local model, data = setup()
  inf_grad(model, "blocks.0.mlp.fc.weight", {[3] = true})
  local after, log = snapshots(model)
  local cfg = config{run_dir = true, ckpt_every = 1}
  local err = fails("train: step 3: loss " .. string.format("%.6g", clean.losses[3]) .. ", gradient norm inf; "
    .. "the first parameter whose gradient holds a nan or inf is blocks.0.mlp.fc.weight. Stopped (nonfinite=stop) "
    .. "before the optimizer step, saving nothing of it; the newest checkpoint is " .. cfg.run_dir
    .. "/ckpt/step_000002.", function()
    train{model = model, data = data, config = cfg, quiet = true, no_interrupt = true, log = log}
  end)
  assert(not err:find("wte.weight", 1, true), err)
  -- the weights are those after step 2, and step 2's are the clean run's
  equal(weights(model), after[2])
  equal(after[3], after[2]) -- the stop's own record of step 3
  -- nothing saved after the bad step: step_000002 is the newest checkpoint, and it holds step 2's weights
  equal(ckpt.latest(cfg.run_dir .. "/ckpt"), cfg.run_dir .. "/ckpt/step_000002")
  local f = io.open(cfg.run_dir .. "/ckpt/step_000003/manifest.json")
  equal(f, nil)
  local saved = ckpt.load(cfg.run_dir .. "/ckpt/step_000002")
  local w = saved:tensor("blocks.0.mlp.fc.weight")
  equal(w:tolist(), after[2]["blocks.0.mlp.fc.weight"])
  -- metrics.jsonl ends with the bad step's record
  local recs = metrics.read(cfg.run_dir .. "/latest/metrics.jsonl")
  local last = recs[#recs]
  equal({last.step, last.nonfinite, last.nonfinite_param, last.loss}, {3, "stop", "blocks.0.mlp.fc.weight",
                                                                       clean.losses[3]})
end)

test("stop: a nan loss (fp32) names the step and the first parameter in state_dict order", function()
  local model, data = setup()
  local loss_fn = nan_loss{[2] = true}
  local after, log = snapshots(model)
  fails("train: step 2: loss nan, gradient norm nan; the first parameter whose gradient holds a nan or inf is "
    .. "wte.weight. Stopped (nonfinite=stop) before the optimizer step, saving nothing of it; the run saved no "
    .. "checkpoint.", function()
    train{model = model, data = data, config = config(), loss_fn = loss_fn, quiet = true, no_interrupt = true, log = log}
  end)
  equal(weights(model), after[1])
end)

test("stop: bf16, and a nan in the second micro-batch of grad_accum = 2", function()
  local model, data = setup()
  fails("train: step 2: loss nan, gradient norm nan; the first parameter whose gradient holds a nan or inf is "
    .. "wte.weight. Stopped (nonfinite=stop)", function()
    train{model = model, data = data, config = config{precision = "bf16"}, loss_fn = nan_loss{[2] = true},
          quiet = true, no_interrupt = true}
  end)
  model, data = setup()
  local after, log = snapshots(model)
  fails("train: step 3: loss nan, gradient norm nan", function()
    train{model = model, data = data, config = config{grad_accum = 2}, loss_fn = nan_loss({[3] = true}, 2, 2),
          quiet = true, no_interrupt = true, log = log}
  end)
  equal(weights(model), after[2])
end)

test("an fp32 run whose weights blow up (lr 1e30) stops at step 2", function()
  local model, data = setup()
  local after, log = snapshots(model)
  fails("train: step 2: loss nan, gradient norm nan; the first parameter whose gradient holds a nan or inf is "
    .. "wte.weight", function()
    train{model = model, data = data, config = config{lr = 1e30, warmup = 0, schedule = "constant"}, quiet = true,
          no_interrupt = true, log = log}
  end)
  equal(weights(model), after[1]) -- huge but finite: the last step that went through
end)

test("skip: the skipped step leaves weights and optimizer state bitwise as they were; counted", function()
  local model, data = setup()
  local loss_fn = nan_loss{[3] = true}
  inf_grad(model, "ln_f.bias", {[6] = true}) -- and step 6: a finite loss, an inf gradient
  local after, log = snapshots(model)
  local recs = {}
  local r = train{model = model, data = data, config = config{nonfinite = "skip"}, loss_fn = loss_fn, quiet = true,
                  no_interrupt = true, log = function(rec)
                    log(rec)
                    if rec.loss ~= nil then recs[rec.step] = rec end
                  end}
  equal(r.step, 8)
  equal(r.nonfinite_skips, 2)
  equal(after[3], after[2]) -- bitwise
  equal(after[6], after[5])
  assert(not T.equal(after[4], after[3]), "step 4 did not train")
  equal(r.optimizer.steps, 6) -- the optimizer was not called for steps 3 and 6
  equal({recs[3].skipped, recs[3].nonfinite, recs[3].nonfinite_skips, recs[3].nonfinite_param},
        {1, "skip", 1, "wte.weight"})
  equal({recs[6].skipped, recs[6].nonfinite_skips, recs[6].nonfinite_param, recs[6].grad_norm},
        {1, 2, "ln_f.bias", 1 / 0})
  equal(recs[4].skipped, nil)
  assert(r.losses[3] ~= r.losses[3], "the skipped step's loss is nan")
  for i = 1, 2 do equal(r.losses[i], clean.losses[i]) end
end)

test("skip: nonfinite_max_skips bounds the skips in a row, and a good step starts the count over", function()
  local model, data = setup()
  local r = train{model = model, data = data, config = config{nonfinite = "skip", nonfinite_max_skips = 2},
                  loss_fn = nan_loss{[2] = true, [3] = true, [5] = true, [6] = true}, quiet = true, no_interrupt = true}
  equal(r.nonfinite_skips, 4)
  model, data = setup()
  local after, log = snapshots(model)
  fails("train: step 4: loss nan, gradient norm nan; the first parameter whose gradient holds a nan or inf is "
    .. "wte.weight. Stopped (nonfinite=skip: 2 steps in a row skipped before it, nonfinite_max_skips = 2)",
    function()
      train{model = model, data = data, config = config{nonfinite = "skip", nonfinite_max_skips = 2},
            loss_fn = nan_loss{[2] = true, [3] = true, [4] = true}, quiet = true, no_interrupt = true, log = log}
    end)
  equal(weights(model), after[1])
end)

test("fp16: a nan loss is the nonfinite policy's, the loss scale is left alone", function()
  local model, data = setup()
  local recs = {}
  local r = train{model = model, data = data, config = config{precision = "fp16", nonfinite = "skip"},
                  loss_fn = nan_loss{[2] = true}, quiet = true, no_interrupt = true,
                  log = function(rec) if rec.loss ~= nil then recs[rec.step] = rec end end}
  equal(r.nonfinite_skips, 1)
  equal({recs[2].skipped, recs[2].nonfinite, recs[2].loss_scale}, {1, "skip", recs[1].loss_scale})
  equal(recs[1].skipped, nil)
end)

test("rollback: the run goes back to the last checkpoint and ends bitwise as a run without the bad step", function()
  local model, data = setup()
  local cfg = config{run_dir = true, ckpt_every = 2, nonfinite = "rollback"}
  local said = {}
  local r = train{model = model, data = data, config = cfg, loss_fn = nan_loss{[5] = true}, quiet = false,
                  no_interrupt = true, out = {write = function(_, ...) said[#said + 1] = table.concat({...}) end,
                                              flush = function() end}}
  equal(r.step, 8)
  equal(r.rollbacks, 1)
  equal(weights(model), clean_weights)
  equal(r.losses, clean.losses)
  equal(r.val_losses, clean.val_losses)
  equal(r.best_val, clean.best_val)
  local text = table.concat(said)
  assert(text:find("step 5: loss nan, gradient norm nan; the first parameter whose gradient holds a nan or inf is "
    .. "wte.weight; rolled back to " .. cfg.run_dir .. "/ckpt/step_000004 (step 4; nonfinite=rollback, 1 of at most 3)",
    1, true), text)
  local recs = metrics.read(cfg.run_dir .. "/latest/metrics.jsonl")
  local steps = {}
  for _, rec in ipairs(recs) do
    if rec.loss or rec.nonfinite then steps[#steps + 1] = rec.step end
    if rec.nonfinite then equal({rec.step, rec.nonfinite, rec.rolled_back_to}, {5, "rollback", 4}) end
  end
  equal(steps, {1, 2, 3, 4, 5, 5, 6, 7, 8})
end)

test("rollback: the same step failing again stops, and so does the bound on rollbacks", function()
  -- nan_loss counts training calls: calls 1-4 are steps 1-4, call 5 step 5, rolled back; call 6
  -- replays step 5
  local model, data = setup()
  local cfg = config{run_dir = true, ckpt_every = 2, nonfinite = "rollback"}
  local after, log = snapshots(model)
  fails("train: step 5: loss nan, gradient norm nan; the first parameter whose gradient holds a nan or inf is "
    .. "wte.weight. Stopped (nonfinite=rollback: it failed again after rolling back to " .. cfg.run_dir
    .. "/ckpt/step_000004) before the optimizer step, saving nothing of it; the newest checkpoint is " .. cfg.run_dir
    .. "/ckpt/step_000004.", function()
    train{model = model, data = data, config = cfg, loss_fn = nan_loss{[5] = true, [6] = true}, quiet = true,
          no_interrupt = true, log = log}
  end)
  equal(weights(model), after[4])
  equal(ckpt.latest(cfg.run_dir .. "/ckpt"), cfg.run_dir .. "/ckpt/step_000004")
  -- call 8 is step 7: a second rollback, one past the bound
  model, data = setup()
  cfg = config{run_dir = true, ckpt_every = 2, nonfinite = "rollback", nonfinite_max_rollbacks = 1}
  fails("train: step 7: loss nan, gradient norm nan; the first parameter whose gradient holds a nan or inf is "
    .. "wte.weight. Stopped (nonfinite=rollback: 1 rollback already, nonfinite_max_rollbacks = 1)", function()
    train{model = model, data = data, config = cfg, loss_fn = nan_loss{[5] = true, [8] = true}, quiet = true,
          no_interrupt = true}
  end)
end)

test("rollback: before the first checkpoint it stops; it needs run_dir and ckpt_every", function()
  local model, data = setup()
  fails("Stopped (nonfinite=rollback: no checkpoint to roll back to yet) before the optimizer step", function()
    train{model = model, data = data, config = config{run_dir = true, ckpt_every = 4, nonfinite = "rollback"},
          loss_fn = nan_loss{[2] = true}, quiet = true, no_interrupt = true}
  end)
  fails('train: config.nonfinite = "rollback" goes back to the last checkpoint: set run_dir and ckpt_every', function()
    train{model = model, data = data, config = config{nonfinite = "rollback"}, quiet = true, no_interrupt = true}
  end)
  fails('train: config.nonfinite = "rollback" goes back to the last checkpoint', function()
    train{model = model, data = data, config = config{run_dir = true, nonfinite = "rollback"}, quiet = true,
          no_interrupt = true}
  end)
end)

test("config: nonfinite is one of stop, skip, rollback; the bounds are integers >= 1", function()
  local model, data = setup()
  local function run(extra)
    return function() train{model = model, data = data, config = config(extra), quiet = true, no_interrupt = true} end
  end
  fails('train: config.nonfinite must be one of "stop", "skip", "rollback", got "ignore"', run{nonfinite = "ignore"})
  fails("train: config.nonfinite_max_skips must be an integer >= 1, got 0", run{nonfinite_max_skips = 0})
  fails("train: config.nonfinite_max_skips must be an integer >= 1, got 1.5", run{nonfinite_max_skips = 1.5})
  fails("train: config.nonfinite_max_rollbacks must be an integer >= 1, got -1", run{nonfinite_max_rollbacks = -1})
end)

test("nonfinite.check and describe, for loops of their own", function()
  local nonfinite = train.nonfinite
  local model = setup()
  equal(nonfinite.check(1, 2.5, 1.0, model), nil)
  local w = model:parameters()[3]
  w.grad = lt.zeros_like(w)
  w.grad[{0}] = 0 / 0
  local ev = nonfinite.check(7, 2.5, 0 / 0, model)
  equal(nonfinite.describe(ev), "step 7: loss 2.5, gradient norm nan; the first parameter whose gradient holds a nan "
    .. "or inf is blocks.0.ln_1.weight")
  w.grad = nil
  ev = nonfinite.check(8, 1 / 0, 3.25, model)
  equal(nonfinite.describe(ev), "step 8: loss inf, gradient norm 3.25; no gradient holds a nan or inf")
end)
