-- bench/allreduce.lua — bus bandwidth of lutra.dist's all_reduce (f32, sum, in place) over
-- the world, next to a plain MPI_Allreduce loop in C (bench/allreduce_mpi.c, loaded as
-- liballreduce_peer.so) run in the same processes:
--   lutra launch -n 2 bench/allreduce.lua [--reps N] [--peer path/to/liballreduce_peer.so] [--raw]
--   bench/allreduce.sh [BUILD_DIR]       (the same under mpirun -np 2)
-- For each size from 4 KiB to 64 MiB (x4): a warm-up, then `reps` (15) rounds of one timed block
-- of ours and one of the C loop, in alternating order (so that the load of a shared machine
-- weighs on both alike). A block is k calls after a barrier; its time is the slowest rank's;
-- the bandwidths are the median blocks', the ratio ours/MPI the median of the rounds' ratios.
-- busbw = 2 (n - 1) / n * bytes / time (nccl-tests' definition for all-reduce). Without the
-- peer library only our column is printed. --raw prints "bytes ours_seconds ours_GB/s
-- [mpi_seconds mpi_GB/s]" lines.
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local ffi = require "ffi"
local util = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/util.lua")
local now, median = util.now, util.median

local reps, raw, peer_path = 15, false, nil
for i = 1, #arg do
  if arg[i] == "--reps" then reps = tonumber(arg[i + 1]) end
  if arg[i] == "--peer" then peer_path = arg[i + 1] end
  if arg[i] == "--raw" then raw = true end
end

local world = comm.init()
local n = world.size

-- the C loop: from --peer, else next to the build's lutra ($LUTRA_BUILD_DIR or the executable's dir)
local peer, peer_file = util.load_peer("allreduce_peer", peer_path,
  "double allreduce_mpi_block(float *buf, int count, int k);")
local calls_per_block = util.calls_per_block

local buf = lt.zeros(16 * 2 ^ 20) -- 64 MiB of f32 zeros: repeated sums stay finite
local slowest = lt.zeros(1, {dtype = "f64"})

-- Seconds per call of k all_reduce calls on t, the slowest rank's.
local function ours_block(t, k)
  world:barrier()
  local t0 = now()
  for _ = 1, k do world:all_reduce(t) end
  slowest:fill_((now() - t0) / k)
  world:all_reduce(slowest, "max")
  return slowest:item()
end

local function busbw(bytes, sec) return 2 * (n - 1) / n * bytes / sec / 1e9 end
local function human(b)
  return b >= 2 ^ 20 and string.format("%d MiB", b / 2 ^ 20) or string.format("%d KiB", b / 1024)
end

if world.rank == 0 and not raw then
  print(string.format("all_reduce, f32 sum in place, %d ranks: bus bandwidth GB/s (median of %d blocks)", n, reps))
  if peer then print("MPI: a plain MPI_Allreduce loop in C (" .. peer_file .. "), blocks alternating with ours") end
  print(string.format("%10s %10s %10s %7s", "size", "ours", peer and "MPI" or "", peer and "ratio" or ""))
end
local ratios = {}
local bytes = 4096
while bytes <= 64 * 2 ^ 20 do
  local count = bytes / 4
  local t = buf:narrow(0, 0, count)
  local ptr = ffi.cast("float *", t:data_ptr())
  local k = calls_per_block(bytes)
  ours_block(t, k)
  if peer then peer.allreduce_mpi_block(ptr, count, k) end
  local ours, theirs = {}, {}
  for r = 1, reps do
    if peer and r % 2 == 0 then theirs[r] = peer.allreduce_mpi_block(ptr, count, k) end
    ours[r] = ours_block(t, k)
    if peer and r % 2 == 1 then theirs[r] = peer.allreduce_mpi_block(ptr, count, k) end
  end
  -- the ratio: the median of each round's (two blocks next to each other in time)
  local pair = {}
  for r = 1, peer and reps or 0 do pair[r] = theirs[r] / ours[r] end
  local a = median(ours)
  local b = peer and median(theirs)
  local ratio = peer and median(pair)
  if world.rank == 0 then
    if raw then
      local mpi = b and string.format(" %.9f %.4f", b, busbw(bytes, b)) or ""
      print(string.format("%d %.9f %.4f", bytes, a, busbw(bytes, a)) .. mpi)
    elseif b then
      ratios[#ratios + 1] = ratio
      print(string.format("%10s %10.3f %10.3f %7.2f", human(bytes), busbw(bytes, a), busbw(bytes, b), ratio))
    else
      print(string.format("%10s %10.3f", human(bytes), busbw(bytes, a)))
    end
  end
  bytes = bytes * 4
end
if world.rank == 0 and #ratios > 0 then print(string.format("median ratio ours/MPI: %.2f", median(ratios))) end
