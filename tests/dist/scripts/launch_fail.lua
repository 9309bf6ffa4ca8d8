-- Rank 1 raises an error inside step(), whose local rank_var the post-mortem REPL must
-- read; rank 0 goes on to a world barrier that rank 1 never joins (held there by the hold
-- file past LUTRA_COMM_TIMEOUT, not aborted by its watchdog).
local comm = require "lutra.dist.comm"
local world = comm.init()

local function step(rank)
  local rank_var = "rank_var of rank " .. rank
  if rank == 1 then error("launch_fail: rank 1 fails on purpose") end
  return rank_var
end

step(comm.rank())
world:barrier()
print("rank " .. comm.rank() .. " passed the barrier")
