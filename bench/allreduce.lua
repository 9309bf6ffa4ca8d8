-- bench/allreduce.lua — all_reduce bus bandwidth of lutra.dist.comm next to a plain
-- MPI_Allreduce loop in C (bench/mpi_allreduce.c), f32 sum in place, across sizes.
--   lutra bench/allreduce.lua [--np 2] [--peer BUILD/bench/libmpi_allreduce_peer.so] [bytes...]
-- Relaunches itself under mpirun. Each rank alternates timed blocks of lutra's
-- world:all_reduce and of the C loop (called through the FFI from the peer library, so
-- both run in the same process at the same moments: fair on a busy machine). Prints per
-- size the median time per call, bus bandwidth 2 (n - 1) / n * bytes / time, and
-- lutra / MPI (the target: >= 0.95).
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local ffi = require "ffi"

local np, peer, sizes = 2, nil, {}
local i = 1
while i <= #arg do
  if arg[i] == "--np" then np, i = tonumber(arg[i + 1]), i + 1
  elseif arg[i] == "--peer" then peer, i = arg[i + 1], i + 1
  else sizes[#sizes + 1] = tonumber(arg[i]) end
  i = i + 1
end
if #sizes == 0 then sizes = {4096, 65536, 1048576, 16777216} end

pcall(ffi.cdef, [[
long readlink(const char *path, char *buf, unsigned long size);
double bench_mpi_allreduce_loop(float *buf, int n, int iters);
]])
local function executable()
  local buf = ffi.new("char[4096]")
  return ffi.string(buf, ffi.C.readlink("/proc/self/exe", buf, 4096))
end
peer = peer or (executable():match("^(.*)/[^/]*$") .. "/bench/libmpi_allreduce_peer.so")

local function worker()
  local world = comm.init()
  local C_loop = ffi.load(peer).bench_mpi_allreduce_loop
  local now = lt.C.lt_wall_time
  local function ours(t, iters)
    local t0 = now()
    for _ = 1, iters do world:all_reduce(t) end
    return now() - t0
  end
  local rows = {}
  for _, bytes in ipairs(sizes) do
    local n = math.floor(bytes / 4)
    local t = lt.zeros(n)
    local p = ffi.cast("float *", t:data_ptr())
    local iters = 1
    while true do -- double until a block takes 50 ms; rank 0 decides for all
      local more = lt.tensor({(ours(t, iters) < 0.05 and iters < 2 ^ 20) and 1 or 0}, "i32")
      world:broadcast(more, 0)
      if more:item() == 0 then break end
      iters = iters * 2
    end
    local a, b = {}, {}
    for k = 1, 7 do
      world:barrier()
      a[k] = ours(t, iters) / iters
      world:barrier()
      b[k] = C_loop(p, n, iters) / iters
    end
    local ta, tb = lt.tensor(a, "f64"), lt.tensor(b, "f64")
    world:all_reduce(ta, "max")
    world:all_reduce(tb, "max")
    a, b = ta:tolist(), tb:tolist()
    table.sort(a)
    table.sort(b)
    rows[#rows + 1] = {bytes, a[4], b[4]}
  end
  if world.rank ~= 0 then return end
  print(string.format("all_reduce f32 sum, %d ranks (mpirun on this machine), median of 7 alternating blocks", world.size))
  print(string.format("%12s %12s %12s %12s %12s %7s", "bytes", "lutra us", "MPI C us", "lutra GB/s", "MPI C GB/s", "ratio"))
  local factor = 2 * (world.size - 1) / world.size
  for _, r in ipairs(rows) do
    local bytes, sa, sb = r[1], r[2], r[3]
    print(string.format("%12d %12.2f %12.2f %12.3f %12.3f %7.3f", bytes, sa * 1e6, sb * 1e6, factor * bytes / sa / 1e9,
      factor * bytes / sb / 1e9, sb / sa))
  end
end

if os.getenv("OMPI_COMM_WORLD_SIZE") or os.getenv("PMIX_RANK") then
  worker()
else
  local cmd = string.format("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe "
    .. "--bind-to none -np %d -x OMP_NUM_THREADS=1 %s %s --peer %s %s", np, executable(), arg[0], peer,
    table.concat(sizes, " "))
  local ok = os.execute(cmd)
  if ok ~= true and ok ~= 0 then os.exit(1) end
end
