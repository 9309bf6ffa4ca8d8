-- lutra.train.tb_sink — the trainer's records as TensorBoard events (lutra.tensorboard), one
-- events file in the run's directory beside metrics.jsonl.
--
--   local sink = tb_sink.open("runs/x/runs/20261204-163005", cfg)  -- cfg as text "config", step 0
--   tb_sink.open(dir, cfg, 20)          -- a run resumed at step 20: a session START at step 21
--   sink:record{step = 10, loss = 3.2, lr = 1e-3, rank_step_ms = {12.1, 12.5}}
--       -- scalars loss, lr, rank_step_ms/rank0, rank_step_ms/rank1 at step 10
--   sink:sample(10, text)              -- text "samples"
--   sink:histograms(10, model)         -- weights/<name> and grads/<name> of each parameter
--   sink:close()
--
-- Each call ends with a flush, so TensorBoard sees a run as it goes. Histograms are of the tensors
-- this process holds: under tensor or ZeRO-3 parallelism, rank 0's shards.
local tensorboard = require "lutra.tensorboard"
local encode = require("lutra.train.metrics").encode

local M = {}

local Sink = {}
Sink.__index = Sink

local function is_number_list(v)
  if type(v) ~= "table" or #v == 0 then return false end
  local n = 0
  for _, x in pairs(v) do
    if type(x) ~= "number" then return false end
    n = n + 1
  end
  return n == #v
end

-- Every numeric field but step as a scalar; a list of numbers as NAME/rank0, NAME/rank1, ...;
-- other fields (strings, tables) are not plotted.
function Sink:record(r)
  local step = r.step or self.last_step or 0
  self.last_step = step
  local keys = {}
  for k in pairs(r) do
    if k ~= "step" and type(k) == "string" then keys[#keys + 1] = k end
  end
  table.sort(keys)
  local w = self.writer
  for _, k in ipairs(keys) do
    local v = r[k]
    if type(v) == "number" then
      w:scalar(k, v, step)
    elseif is_number_list(v) then
      for i = 1, #v do w:scalar(k .. "/rank" .. (i - 1), v[i], step) end
    end
  end
  w:flush()
end

-- Text in a fenced code block, so that markdown leaves a model's output as it is; the fence is
-- longer than any run of backticks in the text.
local function fenced(text)
  local longest = 0
  for run in text:gmatch("`+") do longest = math.max(longest, #run) end
  local fence = string.rep("`", math.max(3, longest + 1))
  return fence .. "\n" .. text .. "\n" .. fence
end

function Sink:sample(step, text)
  self.writer:text("samples", fenced(text), step)
  self.writer:flush()
end

function Sink:histograms(step, model)
  if type(model) ~= "table" or type(model.named_parameters) ~= "function" then
    error("tb_sink.histograms: expected a module (with named_parameters), got " .. type(model), 2)
  end
  local w = self.writer
  for name, p in model:named_parameters() do
    w:histogram("weights/" .. name, p, step)
    local g = p.grad
    if g ~= nil then w:histogram("grads/" .. name, g, step) end
  end
  w:flush()
end

function Sink:close() self.writer:close() end

-- A markdown table of the settings: nested keys joined with dots, values as JSON, sorted.
local function flatten(t, prefix, out)
  for k, v in pairs(t) do
    local key = prefix .. tostring(k)
    if type(v) == "table" and not (#v > 0 or next(v) == nil) then
      flatten(v, key .. ".", out)
    elseif type(v) ~= "function" then
      out[#out + 1] = {key, encode(v)}
    end
  end
  return out
end

local function cell(s) return (s:gsub("|", "\\|"):gsub("\n", " ")) end

function M.config_markdown(config)
  local rows = flatten(config, "", {})
  table.sort(rows, function(a, b) return a[1] < b[1] end)
  local lines = {"| key | value |", "|---|---|"}
  for _, r in ipairs(rows) do lines[#lines + 1] = "| " .. cell(r[1]) .. " | " .. cell(r[2]) .. " |" end
  return table.concat(lines, "\n")
end

-- A writer on dir (the run's own directory); config (a plain table, may be nil) goes in as text
-- "config" at step 0. Each start writes a session START first, as TensorFlow does: at step 0, or
-- for a run resumed at step resumed_at (its checkpoint's) at the next step, so that TensorBoard
-- (which takes a START after the first as a restart) shows the steps this run redoes (a run that
-- went on past its last save) once, as this run writes them.
function M.open(dir, config, resumed_at)
  local sink = setmetatable({writer = tensorboard.open(dir)}, Sink)
  sink.path = sink.writer.path
  sink.writer:session_start(resumed_at and resumed_at + 1 or 0)
  if type(config) == "table" then sink.writer:text("config", M.config_markdown(config), 0) end
  sink.writer:flush()
  return sink
end

return M
