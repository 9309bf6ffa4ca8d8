-- test_oom.lua — out of memory is an error at the user's line, never a crash, and the
-- process keeps working afterwards.
local lt = require "lutra"
local T = require "lutra.testing"

local function assert_match(s, pattern)
  assert(tostring(s):find(pattern), string.format("'%s' does not match '%s'", tostring(s), pattern))
end

test("a tensor too large for the machine is an error naming the size and the stats", function()
  local ok, err = pcall(function() return lt.empty(1024, 1024, 1024, 1024) end) -- 4 TiB of f32
  assert(not ok, "allocating 4 TiB should fail")
  assert_match(err, "test_oom%.lua:%d+: empty: out of memory on cpu allocating 4398046511104 bytes")
  assert_match(err, "allocated %d+, reserved %d+, peak %d+")
end)

test("an op whose output does not fit fails cleanly and leaves its inputs intact", function()
  local a = lt.ones(1, 1024 * 1024)
  local b = lt.ones(1024 * 1024, 1)
  local before = lt.memory_stats().allocated
  local ok, err = pcall(function() return a:expand(1024 * 1024, 1024 * 1024) + b end) -- 4 TiB result
  assert(not ok)
  assert_match(err, "out of memory")
  T.assert_equal(lt.memory_stats().allocated, before)
  T.assert_equal(a:sum():item(), 1024 * 1024)
end)

test("after an out-of-memory error, allocation works again", function()
  pcall(function() return lt.zeros(1024, 1024, 1024, 1024) end)
  local t = lt.ones(1000)
  T.assert_equal(t:sum():item(), 1000)
end)
