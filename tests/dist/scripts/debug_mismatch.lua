-- Debug mode (LUTRA_COMM_DEBUG=1): rank 0 calls all_reduce where rank 1 calls broadcast.
-- Every rank must fail with the same message naming both calls, instead of hanging.
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local world = comm.init()
world:barrier()
if world.rank == 0 then
  world:all_reduce(lt.ones(16))
else
  world:broadcast(lt.ones(4), 0)
end
print("unreachable")
