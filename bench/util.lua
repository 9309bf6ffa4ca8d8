-- bench/util.lua — what the benchmarks share: a monotonic clock and medians.
--   local util = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/util.lua")
local lt = require "lutra"
local M = {}

-- Seconds on the monotonic clock (lt_wall_time, CLOCK_MONOTONIC in the C core).
function M.now() return lt.C.lt_wall_time() end

-- Median of a list of numbers (sorts the list).
function M.median(xs)
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) / 2] or (xs[n / 2] + xs[n / 2 + 1]) / 2
end

return M
