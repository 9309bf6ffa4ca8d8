-- lutra.train.profile — config.profile: the trainer's steps under lutra.profile.
--
--   "" (default): off.  "N-M": steps N to M (inclusive).  "N": N steps after the first (step 1,
--   the warmup, runs unprofiled): steps 2 to N + 1.
-- The profiled steps show as "ProfilerStep#N" ranges. After the last one (or at the end of a run
-- that stops before it) the trace goes to trace.json in the run's directory (every rank takes part:
-- rank 0 writes one track per rank) and the top-20 table (by self time) is printed.
--
--   local p = profile.for_run(trainer)   -- the trainer calls p:before_step(step), p:after_step(step)
--   p:finish(ok)                         -- ok false: the run failed (no collective, nothing written)
local errors = require "lutra.errors"
local lprofile = require "lutra.profile"

local M = {}

local raise = errors.raise

-- The first and last profiled steps of config.profile's value, or nil ("" or nil: off).
function M.parse(spec)
  if spec == nil or spec == "" or spec == false then return nil end
  if type(spec) == "number" then spec = tostring(spec) end
  if type(spec) ~= "string" then raise("train: config.profile must be a string (\"N-M\" or \"N\"), got " .. type(spec)) end
  local a, b = spec:match("^%s*(%d+)%s*%-%s*(%d+)%s*$")
  if a then
    a, b = tonumber(a), tonumber(b)
    if a < 1 or b < a then
      raise(string.format("train: config.profile \"%s\": steps N-M need 1 <= N <= M", spec))
    end
    return a, b
  end
  local n = spec:match("^%s*(%d+)%s*$")
  if n then
    n = tonumber(n)
    if n < 1 then raise(string.format("train: config.profile \"%s\": N must be at least 1", spec)) end
    return 2, n + 1
  end
  raise(string.format("train: config.profile \"%s\": expected \"N-M\" (steps N to M) or \"N\" (N steps after step 1)",
    spec))
end

local Run = {}
Run.__index = Run

local Off = {}
function Off.before_step() end
function Off.after_step() end
function Off.finish() end

-- The profiler of a trainer run (a no-op object when config.profile is off).
function M.for_run(trainer)
  local first, last = M.parse(trainer.get "profile")
  if not first then return Off end
  return setmetatable({trainer = trainer, first = first, last = last}, Run)
end

function Run:before_step(step)
  if step == self.first and not self.prof then self.prof = lprofile.start() end
  if self.prof and not self.done then self.range = lprofile.push("ProfilerStep#" .. step) end
end

function Run:after_step(step)
  if not self.prof or self.done then return end
  lprofile.pop(self.range)
  self.range = nil
  if step >= self.last then self:write() end
end

-- Stops, writes trace.json (collective under several ranks) and prints the table.
function Run:write()
  self.done = true
  local t = self.trainer
  self.prof:stop()
  local dir = t.run_path or t.run_dir or "."
  local path = self.prof:export_chrome_trace(dir .. "/trace.json")
  self.path = path
  t.profile_trace = path
  t:say(string.format("profile of steps %d-%d%s:\n%s", self.first, math.min(self.last, t.step),
    path and (" (trace: " .. path .. ")") or "", self.prof:table{sort_by = "self_ms", top = 20}))
end

function Run:finish(ok)
  if not self.prof or self.done then return end
  if ok == false then
    self.done = true
    self.prof:stop() -- the original functions back; a failed run writes no trace
    return
  end
  self:write()
end

return M
