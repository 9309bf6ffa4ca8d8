-- lutra.debug{rank = 1} inside a function: rank 1's REPL reads and assigns the frame's
-- locals (the script sees the assignment) and reads a shard's global shape; the other
-- ranks wait in a barrier with their watchdog off, however long the REPL stays open.
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local spec = require "lutra.dist.spec"
local repl = require "lutra.repl"
local world = comm.init()
local rank, size = comm.rank(), comm.size()

local function work()
  local secret = 10 + rank
  -- rows [2 * rank, 2 * rank + 2) of a (2 * size, 3) tensor
  local shard = lt.full({2, 3}, rank)
  spec.set(shard, {global = {2 * size, 3}, offset = {2 * rank, 0}})
  repl.debug {rank = 1}
  return secret
end

local secret = work()
io.stdout:write(string.format("after debug: rank %d secret %d\n", rank, secret))
io.stdout:flush()
world:barrier()
