-- A ring in debug mode (LUTRA_COMM_DEBUG=1): each round every rank receives from rank - 1 and
-- sends to rank + 1 (async p2p, the round as tag), then an all_reduce; rank 1 skips round 3.
-- Rank 0 waits for round 3's message, rank 1 for round 4's: both watchdogs must end the job
-- naming the pending p2p and the rank it waits on.
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local world = comm.init()
local R, N = world.rank, world.size
for round = 1, 5 do
  if not (R == 1 and round == 3) then
    local got = lt.empty(16)
    world:p2p({{"recv", got, (R - 1) % N}, {"send", lt.full({16}, R * 10 + round), (R + 1) % N}}, {tag = round}):wait()
    world:all_reduce(lt.ones(1))
  end
end
print("unreachable: rank " .. R .. " finished the ring")
