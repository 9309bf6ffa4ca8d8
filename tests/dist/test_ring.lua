-- np: 2 4
-- A ring over Group:p2p in debug mode (the fingerprint checker on): each round every rank
-- receives from rank - 1 and sends to rank + 1, async, several rounds in flight at once, a
-- checked collective between rounds. The values prove who sent what; the ring under a hang
-- (a rank skipping a round, ended by the watchdog) is tests/dist/test_ring_watchdog.sh.
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local testing = require "lutra.testing"

local world = comm.init()

local function value(r, round, i) return r * 1000 + round * 10 + i end

local function payload(r, round, n)
  local list = {}
  for i = 1, n do list[i] = value(r, round, i) end
  return lt.tensor(list, "f64")
end

local function check(got, r, round, n)
  local list = got:tolist()
  for i = 1, n do
    if list[i] ~= value(r, round, i) then
      error(string.format("round %d: element %d from rank %d: got %s, expected %s", round, i, r, tostring(list[i]),
                          tostring(value(r, round, i))), 2)
    end
  end
end

-- rounds of the ring on g, `inflight` rounds posted before the first is waited for
local function ring(g, rounds, inflight)
  local R, N = g.rank, g.size
  local prev, nxt = (R - 1) % N, (R + 1) % N
  local pending = {}
  for round = 1, rounds do
    local got = lt.empty(5 + round, "f64")
    local h = g:p2p({{"recv", got, prev}, {"send", payload(R, round, 5 + round), nxt}}, {tag = round})
    pending[#pending + 1] = {h, got, round}
    if #pending == inflight or round == rounds then
      for _, p in ipairs(pending) do
        p[1]:wait()
        check(p[2], prev, p[3], 5 + p[3])
      end
      pending = {}
      -- a collective between rounds: the fingerprint checker compares seqs the p2p calls advanced
      local s = g:all_reduce(lt.tensor({R}, "f64"), "sum")
      testing.assert_equal(s:item(), N * (N - 1) / 2)
    end
  end
end

test("ring in debug mode: one round at a time, then three in flight", function()
  comm.set_debug(true)
  local ok, err = pcall(function()
    ring(world, 6, 1)
    ring(world, 9, 3)
  end)
  comm.set_debug(false)
  if not ok then error(err, 0) end
end)

test("ring in debug mode on a sub-group in reversed order", function()
  local rev = world:split(0, world.size - 1 - world.rank, "rev")
  comm.set_debug(true)
  local ok, err = pcall(ring, rev, 4, 2)
  comm.set_debug(false)
  if not ok then error(err, 0) end
  -- the flight recorder saw the ring's p2p calls complete, each with its first item's peer
  local seen = 0
  for _, r in ipairs(comm.recent(64)) do
    if r.op == "p2p" and r.group == "rev" then
      seen = seen + 1
      testing.assert_equal(r.state, "done")
      testing.assert_equal(r.peer, (rev.rank - 1) % rev.size)
    end
  end
  testing.assert_equal(seen, 4)
end)
