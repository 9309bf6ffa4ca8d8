-- lutra.train.interrupt — Ctrl-C as a flag the training loop polls between steps, through
-- the C core's lt_interrupt_* (host/core/interrupt.c). Where the core lacks them, arm() returns
-- false and Ctrl-C keeps its usual effect (the host interrupts the running code).
local lt = require "lutra.ffi"

local M = {}

local function fn(name)
  local ok, f = pcall(function() return lt.C[name] end)
  return ok and f or nil
end

local C_arm, C_pending, C_disarm = fn "lt_interrupt_arm", fn "lt_interrupt_pending", fn "lt_interrupt_disarm"
local C_wall = fn "lt_wall_time"

-- True when Ctrl-C now sets the flag.
function M.arm()
  if not C_arm then return false end
  return C_arm() == 0
end

function M.pending(clear)
  if not C_pending then return false end
  return C_pending(clear and 1 or 0) ~= 0
end

function M.disarm()
  if C_disarm then C_disarm() end
end

-- Wall-clock seconds (monotonic); os.clock() (CPU time of all threads) as a fallback.
M.now = C_wall and function() return C_wall() end or os.clock

return M
