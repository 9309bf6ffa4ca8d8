-- Rank 1 skips an all_reduce that rank 0 makes (async, then waited: the watchdog watches
-- h:wait() too), and rank 1 waits in a blocking recv for a message that never comes:
-- both watchdogs must end the job with a report naming the pending calls.
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local world = comm.init()
world:all_reduce(lt.ones(4), "sum") -- seq 1: everyone
if world.rank == 0 then
  local h = world:all_reduce(lt.ones(1024), "sum", {async = true}) -- seq 2: rank 1 never joins
  h:wait()
else
  world:recv(lt.empty(8), 0) -- rank 0 never sends
end
print("unreachable: rank " .. world.rank .. " passed the skipped collective")
