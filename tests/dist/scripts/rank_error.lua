-- Rank 1 fails with a Lua error while rank 0 waits in an all_reduce: rank 1 must exit at
-- once (no MPI_Finalize waiting for rank 0), and mpirun then ends the job.
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local world = comm.init()
world:barrier()
if world.rank == 1 then error("rank 1 fails on purpose") end
world:all_reduce(lt.ones(4))
print("unreachable")
