-- lutra.train.timing — where a run's wall time goes: seconds per phase, and the table the
-- trainer prints at the end of a run (and returns as result.time_split).
--
--   local timing = require "lutra.train.timing"
--   local t = timing.new()
--   t:add("data", dt)                 -- seconds of a phase (the callers time it inline, so that a
--                                     -- traceback through them names the user's own functions)
--   t:lines(total_seconds)            -- the table, a line a phase
--
-- Phases: data (the next batch), forward and backward (one process), forward_backward (a
-- parallel layout: both, with the communication they overlap), communication (gradient
-- reductions and the global norm after backward), optimizer (clipping and the step), evaluation,
-- samples, checkpoint; "other" is the rest of the run's wall time (logging, the loop). On a GPU
-- the host returns before the device is done: a phase's time is where the host waited, so the
-- split is a guide there, not a measurement.
local M = {}

M.PHASES = {"data", "forward", "backward", "forward_backward", "communication", "optimizer", "evaluation", "samples",
            "checkpoint"}

local Timing = {}
Timing.__index = Timing

function M.new() return setmetatable({seconds = {}}, Timing) end

function Timing:add(phase, dt) self.seconds[phase] = (self.seconds[phase] or 0) + dt end

-- The phases' seconds and "other" (total minus their sum, at least 0), as a table.
function Timing:split(total)
  local out, sum = {}, 0
  for _, phase in ipairs(M.PHASES) do
    if self.seconds[phase] then
      out[phase] = self.seconds[phase]
      sum = sum + self.seconds[phase]
    end
  end
  out.other = math.max(total - sum, 0)
  return out
end

-- The table: a line a phase that took time, its seconds and share of total, then the total.
function Timing:lines(total)
  local split = self:split(total)
  local lines = {string.format("%-18s %10s %7s", "time split", "seconds", "share")}
  local names = {}
  for _, phase in ipairs(M.PHASES) do names[#names + 1] = phase end
  names[#names + 1] = "other"
  for _, phase in ipairs(names) do
    local s = split[phase]
    if s and s > 0 then
      lines[#lines + 1] = string.format("%-18s %10.2f %6.1f%%", phase, s, 100 * s / math.max(total, 1e-9))
    end
  end
  lines[#lines + 1] = string.format("%-18s %10.2f %6.1f%%", "total", total, 100)
  return lines
end

return M
