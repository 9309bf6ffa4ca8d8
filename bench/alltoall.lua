-- bench/alltoall.lua — bandwidth of lutra.dist's Group:all_to_all (f32, even pieces: each rank
-- sends bytes / n to every rank) over the world, next to a plain MPI_Alltoallv loop in C
-- (bench/alltoall_mpi.c, loaded as liballtoall_peer.so) on the same buffers, run in the same
-- processes:
--   bench/alltoall.sh [BUILD_DIR]       (mpirun; env NP ranks, default 2, REPS, default 15)
--   lutra launch -n 2 bench/alltoall.lua [--reps N] [--peer path/to/liballtoall_peer.so]
-- For each size (bytes each rank sends, 1 KiB to 64 MiB, x4): a warm-up, then `reps` rounds of
-- one timed block of ours and one of the C loop, in alternating order. A block is k calls after
-- a barrier; its time is the slowest rank's; the bandwidths are the median blocks', the ratio
-- ours/MPI the median of the rounds' ratios. busbw = (n - 1) / n * bytes / time (nccl-tests'
-- definition for all-to-all).
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local ffi = require "ffi"
local util = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/util.lua")
local now, median = util.now, util.median

local reps, peer_path = 15, nil
for i = 1, #arg do
  if arg[i] == "--reps" then reps = tonumber(arg[i + 1]) end
  if arg[i] == "--peer" then peer_path = arg[i + 1] end
end

local world = comm.init()
local n = world.size

local peer, peer_file = util.load_peer("alltoall_peer", peer_path,
  "double alltoall_mpi_block(const float *send, float *recv, const int *counts, const int *displs, int k);")
local calls_per_block = util.calls_per_block

local max_floats = 16 * 2 ^ 20
local send_buf, recv_buf = lt.ones(max_floats), lt.zeros(max_floats)

local function ours_block(out, inp, counts, k)
  world:barrier()
  local t0 = now()
  for _ = 1, k do world:all_to_all(out, inp, counts, counts) end
  local slowest = world:all_reduce(lt.tensor({(now() - t0) / k}, "f64"), "max")
  return slowest:item()
end

local function busbw(bytes, sec) return (n - 1) / n * bytes / sec / 1e9 end
local function human(b)
  return b >= 2 ^ 20 and string.format("%d MiB", b / 2 ^ 20) or string.format("%d KiB", b / 1024)
end

if world.rank == 0 then
  print(string.format("all_to_all, f32, even pieces, %d ranks: bus bandwidth GB/s (median of %d blocks)", n, reps))
  if peer then print("MPI: a plain MPI_Alltoallv loop in C (" .. peer_file .. "), blocks alternating with ours") end
  print(string.format("%10s %10s %10s %7s", "size", "ours", peer and "MPI" or "", peer and "ratio" or ""))
end
local ratios = {}
local bytes = 1024
while bytes <= 64 * 2 ^ 20 do
  local floats = bytes / 4
  local each = math.floor(floats / n)
  local total = each * n
  local counts, c_counts, c_displs = {}, ffi.new("int[?]", n), ffi.new("int[?]", n)
  for i = 1, n do counts[i], c_counts[i - 1], c_displs[i - 1] = each, each, (i - 1) * each end
  local inp, out = send_buf:narrow(0, 0, total), recv_buf:narrow(0, 0, total)
  local sp, rp = ffi.cast("const float *", inp:data_ptr()), ffi.cast("float *", out:data_ptr())
  local k = calls_per_block(bytes)
  ours_block(out, inp, counts, k)
  if peer then peer.alltoall_mpi_block(sp, rp, c_counts, c_displs, k) end
  local ours, theirs = {}, {}
  for r = 1, reps do
    if peer and r % 2 == 0 then theirs[r] = peer.alltoall_mpi_block(sp, rp, c_counts, c_displs, k) end
    ours[r] = ours_block(out, inp, counts, k)
    if peer and r % 2 == 1 then theirs[r] = peer.alltoall_mpi_block(sp, rp, c_counts, c_displs, k) end
  end
  local pair = {}
  for r = 1, peer and reps or 0 do pair[r] = theirs[r] / ours[r] end
  local a, b, ratio = median(ours), peer and median(theirs), peer and median(pair)
  if world.rank == 0 then
    if b then
      ratios[#ratios + 1] = ratio
      print(string.format("%10s %10.3f %10.3f %7.2f", human(bytes), busbw(total * 4, a), busbw(total * 4, b), ratio))
    else
      print(string.format("%10s %10.3f", human(bytes), busbw(total * 4, a)))
    end
  end
  bytes = bytes * 4
end
if world.rank == 0 and #ratios > 0 then print(string.format("median ratio ours/MPI: %.2f", median(ratios))) end
