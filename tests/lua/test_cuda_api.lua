-- lutra.cuda's streams, events and pinned memory where there is no GPU: clear errors, and
-- copy_async falling back to the synchronous copy. ctest hides any GPU (CUDA_VISIBLE_DEVICES=),
-- so this runs on every machine. (With a GPU, lutra selftest checks them for real:
-- lua/lutra/selftest/streams.lua.)
local lt = require "lutra"
local T = require "lutra.testing"
local equal, fails = T.assert_equal, T.assert_error

test("copy_async between CPU tensors is the plain copy and returns no event", function()
  local src = lt.arange(0, 10, 1, {dtype = "f32"})
  local dst = lt.empty({10})
  equal(lt.cuda.copy_async(dst, src), nil)
  equal(dst:tolist(), src:tolist())
  -- broadcast and a dtype change go through lt_copy too
  local d2 = lt.empty({2, 10}, {dtype = "f64"})
  equal(lt.cuda.copy_async(d2, src), nil)
  equal(d2[1]:tolist(), src:tolist())
  fails("expected two tensors", lt.cuda.copy_async, dst, 3)
  fails("copy", lt.cuda.copy_async, lt.empty({3}), src) -- shapes that do not broadcast
end)

test("pinned memory and events without a GPU: errors that say why", function()
  assert(not lt.cuda.is_available(), "a GPU is visible: run with CUDA_VISIBLE_DEVICES= (as ctest does)")
  fails("pinned", lt.empty, {4}, {pin_memory = true})
  fails("pinned", function() return lt.ones(4):pin_memory() end)
  fails("cuda_event_create", lt.cuda.event)
  equal(lt.ones(2):is_pinned(), false)
end)

test("bad arguments", function()
  fails("pin_memory is for CPU tensors", lt.empty, {4}, {pin_memory = true, device = "cuda:0"})
  fails("stream must be", function() lt.cuda.stream_synchronize("cuda:0", "nope") end)
  fails("needs a CUDA device", function() lt.cuda.stream_synchronize("cpu") end)
end)
