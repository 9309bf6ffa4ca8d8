-- lutra.debug() with no rank, on every rank: each opens its own REPL in turn (the launcher
-- lends the terminal to one at a time); the first one reads the piped input, the next one
-- finds its end; then both meet in a barrier.
local comm = require "lutra.dist.comm"
local world = comm.init()

local function f()
  local mine = comm.rank() * 100
  require("lutra.repl").debug()
  return mine
end

local got = f()
print("rank " .. comm.rank() .. " got " .. got)
world:barrier()
