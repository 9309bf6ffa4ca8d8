-- lutra.train.outputs — what a run writes into its run_dir besides checkpoints: the tokenizer and
-- config.json (the settings as data: --config=run_dir/config.json reads them back), and this run's
-- own directory (lutra.train.runs: runs/ID, `latest` pointing at it) with metrics.jsonl, train.log
-- (what the run said and its progress lines, plain), samples.txt, TensorBoard's events
-- (lutra.train.tb_sink) and a copy of config.json.
--
--   local out = outputs.open(trainer)   -- nil without a run_dir (and on every rank but 0)
--   out:record(r); out:line(s); out:sample(step, text); out:close()
--
-- A resumed run continues the run its checkpoint was saved by: records after the checkpoint's
-- step (a run that went on past its last save) are dropped, so the file reads as one run that
-- never stopped. Each file is written through lutra.atomic_file: a link planted in the directory
-- is replaced, never written through. A config that cannot be written as JSON (a value the recipe
-- added that JSON has no form for) is said on stderr and the run goes on; a run_dir that cannot be
-- written is an error.
local atomic_file = require "lutra.atomic_file"
local errors = require "lutra.errors"
local files = require "lutra.ckpt.files"
local metrics = require "lutra.train.metrics"
local runs = require "lutra.train.runs"
local tb_sink = require "lutra.train.tb_sink"

local M = {}
local raise = errors.raise

local Outputs = {}
Outputs.__index = Outputs

local function save_config(cfg, paths)
  if type(cfg.save) ~= "function" then return end
  for _, path in ipairs(paths) do
    local ok, err = pcall(cfg.save, cfg, path)
    if not ok then
      io.stderr:write("lutra: ", (tostring(err):gsub("^[^\n]-:%d+: ", "")), "\n")
      return
    end
  end
end

-- The histograms of config.histogram_every: the trainer's step calls t.grads_hook after the
-- optimizer step, before the gradients are dropped (this process's tensors: rank 0's shards under
-- tp or ZeRO-3).
local function histogram_hook(t, tb)
  local every = t.get "histogram_every"
  if type(every) ~= "number" or every < 0 or every ~= math.floor(every) then
    raise("train: config.histogram_every must be an integer >= 0 (0: none), got " .. tostring(every))
  end
  if every == 0 then return nil end
  return function()
    local step = t.step + 1 -- the step being taken
    if step % every == 0 then tb:histograms(step, t.par and t.par.model or t.model) end
  end
end

-- Opens the run's outputs for trainer t (after its resume): sets t.run_id, t.run_path,
-- t.ckpt_files (the tokenizer, copied into every checkpoint) and t.grads_hook.
function M.open(t)
  local run_dir = t.run_dir
  if not run_dir then return nil end
  files.mkdir_p(run_dir)
  local tok = t.args.tokenizer
  if type(tok) == "table" and type(tok.save) == "function" and pcall(tok.save, tok, run_dir .. "/tokenizer.json") then
    t.ckpt_files = {["tokenizer.json"] = run_dir .. "/tokenizer.json"}
  end
  local resumed = t.step > 0 and t.resumed_run_id or nil
  t.run_id, t.run_path = runs.open(run_dir, resumed)
  save_config(t.cfg, {run_dir .. "/config.json", t.run_path .. "/config.json"})
  local log_path = t.run_path .. "/metrics.jsonl"
  local continued = t.run_id == resumed
  if continued then
    local step = t.step -- a resumed run evaluates at its step again (the stopped one broke before)
    local ok, err = metrics.trim(log_path, function(r)
      return type(r.step) == "number" and (r.step < step or (r.step == step and r.val_loss == nil))
    end)
    if not ok then raise("metrics: " .. tostring(err)) end
  end
  local out = setmetatable({path = t.run_path, log = metrics.open(log_path, "a")}, Outputs)
  local text, err = atomic_file.append(t.run_path .. "/train.log")
  if not text then
    out:close()
    raise("train: " .. tostring(err))
  end
  out.text = text
  if t.get "log_tensorboard" then
    -- a new events file each start: a resumed run's go beside the earlier ones
    out.tb = tb_sink.open(t.run_path, t.cfg_plain, continued and t.step or nil)
    t.grads_hook = histogram_hook(t, out.tb)
  end
  return out
end

-- One record to metrics.jsonl and TensorBoard's events.
function Outputs:record(r)
  if self.log then self.log:write(r) end
  if self.tb then self.tb:record(r) end
end

-- A line to train.log. A failed write is said once and the run goes on without the file.
function Outputs:line(s)
  local f = self.text
  if not f then return end
  local ok, err = f:write(s, "\n")
  if not ok then
    io.stderr:write("lutra: ", tostring(err), "; train.log is not written further\n")
    f:close()
    self.text = nil
  end
end

-- A sample of the model's text: appended to samples.txt and to the events. true, or nil and why.
function Outputs:sample(step, text)
  if self.tb then self.tb:sample(step, text) end
  local f, err = atomic_file.append(self.path .. "/samples.txt")
  if not f then return nil, err end
  local ok, write_err = f:write(string.format("---- step %d ----\n%s\n", step, text))
  local closed, close_err = f:close()
  if not ok then return nil, write_err end
  if not closed then return nil, close_err end
  return true
end

function Outputs:close()
  if self.log then self.log:close() end
  if self.tb then self.tb:close() end
  if self.text then self.text:close() end
  self.log, self.tb, self.text = nil, nil, nil
end

return M
