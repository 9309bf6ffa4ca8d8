-- bench/allreduce.lua — bus bandwidth of lutra.dist's all_reduce (f32, sum, in place) over
-- the world, timed as bench/allreduce_mpi.c times a plain MPI_Allreduce loop:
--   lutra launch -n 2 bench/allreduce.lua [--reps N] [--raw]
--   bench/allreduce.sh          (both, side by side, with the ratio)
-- For each size from 4 KiB to 64 MiB (x4): `reps` timed blocks of k calls after a warm-up
-- block; a block's time is the slowest rank's; the figure is the median block.
-- busbw = 2 (n - 1) / n * bytes / time (nccl-tests' definition for all-reduce). --raw prints
-- "bytes seconds GB/s" lines (what allreduce.sh reads), else a table.
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local util = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/util.lua")
local now, median = util.now, util.median

local reps, raw = 7, false
for i = 1, #arg do
  if arg[i] == "--reps" then reps = tonumber(arg[i + 1]) end
  if arg[i] == "--raw" then raw = true end
end

local world = comm.init()
local n = world.size

-- Calls per timed block: about 16 MiB of traffic, between 2 and 1000 calls.
local function calls_per_block(bytes) return math.max(2, math.min(1000, math.floor(16 * 2 ^ 20 / bytes))) end

local buf = lt.zeros(16 * 2 ^ 20) -- 64 MiB of f32 zeros: repeated sums stay finite
local slowest = lt.zeros(1, {dtype = "f64"})
if world.rank == 0 and not raw then
  print(string.format("all_reduce f32 sum over %d ranks (median of %d blocks)", n, reps))
  print(string.format("%10s %12s %10s", "bytes", "us/call", "busbw GB/s"))
end
local bytes = 4096
while bytes <= 64 * 2 ^ 20 do
  local t = buf:narrow(0, 0, bytes / 4)
  local k = calls_per_block(bytes)
  for _ = 1, k do world:all_reduce(t) end
  local times = {}
  for r = 1, reps do
    world:barrier()
    local t0 = now()
    for _ = 1, k do world:all_reduce(t) end
    slowest:fill_((now() - t0) / k)
    world:all_reduce(slowest, "max")
    times[r] = slowest:item()
  end
  local sec = median(times)
  local busbw = 2 * (n - 1) / n * bytes / sec / 1e9
  if world.rank == 0 then
    if raw then
      print(string.format("%d %.9f %.4f", bytes, sec, busbw))
    else
      print(string.format("%10d %12.2f %10.3f", bytes, sec * 1e6, busbw))
    end
  end
  bytes = bytes * 4
end
