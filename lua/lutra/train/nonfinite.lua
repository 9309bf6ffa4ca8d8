-- lutra.train.nonfinite — what the trainer does with a step whose loss or gradient norm is nan
-- or inf (config.nonfinite). Such a step never reaches the optimizer; then:
--   "stop" (default)  the run ends with an error naming the step, the loss, the gradient norm
--                     and the first parameter (its state_dict name) whose gradient holds a nan
--                     or inf. Nothing is saved after it: the newest checkpoint stays the last
--                     good one, and a recipe that saves its model at the end does not get there.
--   "skip"            the step is skipped: weights and optimizer state untouched, while the
--                     step counter, the lr schedule and the data go on (as fp16's skipped
--                     steps). Its record has skipped = 1 and nonfinite_skips (the count so far),
--                     and a line says so; after nonfinite_max_skips skips in a row, the next
--                     such step stops the run.
--   "rollback"        the last checkpoint of the run (saved by it, or resumed from) is loaded:
--                     weights, optimizer state, step, RNG, both loaders' positions. Training
--                     goes on from there, and so replays the same batches: a step that fails
--                     again after a rollback, or a rollback past nonfinite_max_rollbacks in the
--                     run, stops it. Needs run_dir and ckpt_every.
-- A step counts when its loss (the mean over its micro-batches, and under data parallelism over
-- the ranks) is not finite, in every precision, or its gradient norm is not, in fp32 and bf16;
-- under fp16 a gradient that overflows is the loss scaler's to handle (it skips the step and
-- backs the scale off, lutra/train/precision.lua), and only a non-finite loss counts.
-- Under a parallel layout every rank decides alike: the loss is averaged over the
-- data-parallel ranks and the gradient norm summed over all ranks before the check (a nan or
-- inf on one rank reaches every rank), the verdict is then agreed on (one all-reduce of a
-- number a step) and so is the parameter named (gathered, on a bad step only).
--
--   local ev = nonfinite.event(run, loss, norm)  -- in the step, before the optimizer: nil or
--                                                -- {step =, loss =, norm =, param =}
--   local guard = nonfinite.new(get)             -- the trainer's, from its config
--   guard:handle(run, record, ev)                -- raises (stop), "skipped" or "rolled_back"
-- A loop of its own (recipes/dpo.lua), before its optimizer step:
--   local ev = nonfinite.check(step, loss, norm, model)  -- nil, or the event (describe(ev) says it)
local errors = require "lutra.errors"
local create = require "lutra.create"
local sharded = require "lutra.ckpt"
local anomaly = require "lutra.autograd.anomaly"
local resume = require "lutra.train.resume"

local raise = errors.raise
local huge = math.huge

local M = {}

M.POLICIES = {"stop", "skip", "rollback"}

-- Whether the number x is neither nan nor +-inf.
local function finite(x) return x == x and x ~= huge and x ~= -huge end
M.finite = finite

-- A number as the messages print it: nan, inf, -inf, else 6 significant digits.
local function number(x)
  if x ~= x then return "nan" end
  if x == huge then return "inf" end
  if x == -huge then return "-inf" end
  return string.format("%.6g", x)
end
M.number = number

-- {name, parameter} of every parameter whose gradient this rank has, in the model's state_dict
-- order: the model's own on one process; under a layout the optimizer's (the global names of
-- this rank's pieces, which it keeps in its groups' order), put in the local model's order.
local function named_params(run)
  local out = {}
  if not run.par then
    for name, p in run.model:named_parameters() do out[#out + 1] = {name, p} end
    return out
  end
  local position, n = {}, 0
  for name in run.par.model:named_parameters() do
    n = n + 1
    position[name] = n
  end
  local opt = run.par.optimizer
  for i, p in ipairs(opt.params) do
    local name = tostring(opt.keys[i])
    out[i] = {name, p, position[name] or n + i}
  end
  table.sort(out, function(a, b) return a[3] < b[3] end)
  return out
end

-- The name of the first parameter whose gradient holds a nan or inf (nil: none). Over a group
-- of ranks every rank gets the same answer: the lowest position, the lowest rank on a tie.
function M.first_param(named, group)
  local index, name
  for i, e in ipairs(named) do
    local g = e[2].grad
    if g ~= nil and not anomaly.finite(g) then
      index, name = i, e[1]
      break
    end
  end
  if group and group.size > 1 then
    local all = group:all_gather_text(index and (index .. "\t" .. name) or "")
    index, name = nil, nil
    for _, s in ipairs(all) do
      local i, n = s:match("^(%d+)\t(.*)$")
      if i and (index == nil or tonumber(i) < index) then index, name = tonumber(i), n end
    end
  end
  return name
end

-- Whether any rank of group says yes (one all-reduce of a number).
local function any_rank(group, yes)
  local t = create.tensor({yes and 1 or 0}, {dtype = "f64"})
  group:all_reduce(t, "sum")
  local n = t:item()
  t:free()
  return n > 0
end

-- The step's event when its loss or gradient norm counts as non-finite (see the header), else
-- nil. Called with the gradients still there, before the optimizer would step. Under a layout
-- the ranks agree first (a loss that only one tensor- or pipeline-parallel rank saw as nan, with
-- gradients that stayed finite, must still stop every rank, or the others would wait for it).
function M.event(run, loss, norm)
  local bad = not (finite(loss) and (finite(norm) or run.prec.loss_scale))
  local group = run.mesh and run.mesh.size > 1 and run.mesh.world or nil
  if group then bad = any_rank(group, bad) end
  if not bad then return nil end
  return {step = run.step + 1, loss = loss, norm = norm, param = M.first_param(named_params(run), group)}
end

-- The event of a hand-written loop's step (nil: loss and norm finite); model: what has named_parameters.
function M.check(step, loss, norm, model)
  if finite(loss) and finite(norm) then return nil end
  local named = {}
  for name, p in model:named_parameters() do named[#named + 1] = {name, p} end
  return {step = step, loss = loss, norm = norm, param = M.first_param(named)}
end

-- "step 3: loss nan, gradient norm nan; the first parameter whose gradient holds a nan or inf is wte.weight"
function M.describe(ev)
  local s = string.format("step %d: loss %s, gradient norm %s; ", ev.step, number(ev.loss), number(ev.norm))
  if ev.param then return s .. "the first parameter whose gradient holds a nan or inf is " .. ev.param end
  return s .. "no gradient holds a nan or inf"
end

-- ---- the trainer's policy ---------------------------------------------------------------------

local Guard = {}
Guard.__index = Guard

-- Checks the config's settings (a getter key -> value) and makes the trainer's guard.
function M.new(get)
  local policy = get "nonfinite"
  local known = false
  for _, p in ipairs(M.POLICIES) do known = known or policy == p end
  if not known then
    raise(string.format("train: config.nonfinite must be one of \"stop\", \"skip\", \"rollback\", got %s",
      type(policy) == "string" and "\"" .. policy .. "\"" or tostring(policy)))
  end
  for _, key in ipairs {"nonfinite_max_skips", "nonfinite_max_rollbacks"} do
    local v = get(key)
    if type(v) ~= "number" or v < 1 or v % 1 ~= 0 or v == huge then
      raise(string.format("train: config.%s must be an integer >= 1, got %s", key, tostring(v)))
    end
  end
  if policy == "rollback" and (get "run_dir" == "" or get "ckpt_every" == 0) then
    raise("train: config.nonfinite = \"rollback\" goes back to the last checkpoint: set run_dir and ckpt_every "
      .. "(> 0)")
  end
  return setmetatable({policy = policy, max_skips = get "nonfinite_max_skips",
                       max_rollbacks = get "nonfinite_max_rollbacks", skips = 0, in_a_row = 0, rollbacks = 0,
                       rolled_back_at = {}}, Guard)
end

-- The run's last checkpoint: the newest it saved, else the one it resumed from.
local function last_checkpoint(run) return run.checkpoint or run.resumed_from end

-- Ends the run: the step's record (nonfinite = "stop") is written, then the error.
local function stop(run, r, ev, why)
  r.nonfinite = "stop"
  r.nonfinite_param = ev.param
  run:record(r)
  local ckpt = last_checkpoint(run)
  error(string.format("train: %s. Stopped (%s) before the optimizer step, saving nothing of it; %s. "
    .. "--nonfinite=skip skips such steps, --nonfinite=rollback goes back to the last checkpoint, and "
    .. "lutra.detect_anomaly(true) names the op that made the first nan or inf", M.describe(ev), why,
    ckpt and ("the newest checkpoint is " .. ckpt) or "the run saved no checkpoint"), 0)
end

-- Drops what the trainer kept of the steps after the one it went back to.
local function forget_after(run, failed_step)
  local losses = run.losses
  for _ = 1, failed_step - run.step do losses[#losses] = nil end
  run.last_loss = losses[#losses]
  local vals = run.val_losses
  while #vals > 0 and vals[#vals].step >= run.step do vals[#vals] = nil end -- the loop evaluates again
  run.last_val = #vals > 0 and vals[#vals].loss or nil
end

function Guard:rollback(run, r, ev)
  if self.rolled_back_at[ev.step] then
    stop(run, r, ev, "nonfinite=rollback: it failed again after rolling back to " .. self.rolled_back_at[ev.step])
  end
  if self.rollbacks >= self.max_rollbacks then
    stop(run, r, ev, string.format("nonfinite=rollback: %d rollback%s already, nonfinite_max_rollbacks = %d",
      self.rollbacks, self.rollbacks == 1 and "" or "s", self.max_rollbacks))
  end
  local path = last_checkpoint(run)
  if not path then stop(run, r, ev, "nonfinite=rollback: no checkpoint to roll back to yet") end
  -- a save still being written is committed before it is read back: every rank's wait, then (under a
  -- layout) an all-reduce, which also waits for rank 0's, the one that commits
  local group = run.mesh and run.mesh.size > 1 and run.mesh.world or nil
  local function agreed(ok, err)
    if group and any_rank(group, not ok) and ok then ok, err = false, "on another rank" end
    if not ok then stop(run, r, ev, "nonfinite=rollback: rolling back to " .. path .. " failed: " .. tostring(err)) end
  end
  agreed(pcall(sharded.wait))
  agreed(pcall(resume.restore, run, path))
  self.rollbacks, self.in_a_row = self.rollbacks + 1, 0
  self.rolled_back_at[ev.step] = path
  forget_after(run, ev.step)
  r.nonfinite, r.nonfinite_param, r.rolled_back_to = "rollback", ev.param, run.step
  run:record(r)
  run:say(string.format("%s; rolled back to %s (step %d; nonfinite=rollback, %d of at most %d)", M.describe(ev),
    path, run.step, self.rollbacks, self.max_rollbacks))
  return "rolled_back"
end

-- The trainer's answer to a non-finite step (its record r, its event ev): raises for "stop" and
-- when a bound is reached, else "skipped" (r says so) or "rolled_back" (r is recorded here).
function Guard:handle(run, r, ev)
  if self.policy == "rollback" then return self:rollback(run, r, ev) end
  if self.policy == "skip" then
    self.in_a_row = self.in_a_row + 1
    if self.in_a_row > self.max_skips then
      stop(run, r, ev, string.format("nonfinite=skip: %d step%s in a row skipped before it, nonfinite_max_skips = %d",
        self.max_skips, self.max_skips == 1 and "" or "s", self.max_skips))
    end
    self.skips = self.skips + 1
    r.skipped, r.nonfinite, r.nonfinite_param, r.nonfinite_skips = 1, "skip", ev.param, self.skips
    run:say(string.format("%s; step skipped (nonfinite=skip: %d in a row, %d in all)", M.describe(ev),
      self.in_a_row, self.skips))
    return "skipped"
  end
  stop(run, r, ev, "nonfinite=stop")
end

-- A step that went through: the skips in a row start over.
function Guard:passed() self.in_a_row = 0 end

return M
