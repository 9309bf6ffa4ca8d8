-- Rank 0 sits in comm.hold (as in a debugger REPL) longer than the timeout while rank 1
-- already waits in an all_reduce: rank 1's watchdog sees LUTRA_HOLD_FILE and keeps waiting.
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local world = comm.init()
world:barrier()
if world.rank == 0 then
  comm.hold(function() os.execute("sleep " .. (os.getenv("HOLD_SECONDS") or "5")) end)
end
local t = lt.ones(3)
world:all_reduce(t)
assert(t:tolist()[1] == world.size)
print("rank " .. world.rank .. ": all_reduce done after the hold")
