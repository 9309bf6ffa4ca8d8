-- lutra.dist.comm without a launcher: a world of one, no MPI; collectives are local.
-- CUDA tensors: test_comm_no_nccl.lua (a build without NCCL), test_comm_nccl_gpu.lua (a GPU).
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local testing = require "lutra.testing"

local world = comm.init()

test("singleton world", function()
  assert(not comm.uses_mpi(), "no MPI without mpirun")
  testing.assert_equal({comm.rank(), comm.size(), comm.local_rank()}, {0, 1, 0})
  testing.assert_equal({world.rank, world.size, world.name}, {0, 1, "world"})
  testing.assert_equal(world.ranks, {0})
  assert(comm.initialized() and comm.init() == world)
end)

test("collectives leave values as they are, for every dtype", function()
  for _, dt in ipairs({"f32", "f64", "bf16", "f16", "i32", "i64", "u8"}) do
    local t = lt.tensor({1, 2, 3}, dt)
    for _, op in ipairs({"sum", "max", "min"}) do world:all_reduce(t, op) end
    testing.assert_equal(t:tolist(), {1, 2, 3})
    world:broadcast(t, 0)
    testing.assert_equal(t:tolist(), {1, 2, 3})
    local out = world:all_gather(lt.empty(3, dt), t)
    testing.assert_equal(out:tolist(), {1, 2, 3})
    local rs = world:reduce_scatter(nil, t)
    testing.assert_equal(rs:tolist(), {1, 2, 3})
  end
  local t = lt.tensor({2.5, -1})
  world:all_reduce(t, "avg")
  testing.assert_equal(t:tolist(), {2.5, -1})
  local out = world:all_gather(nil, lt.tensor({4, 5}), {counts = {2}})
  testing.assert_equal(out:tolist(), {4, 5})
  local rs = world:reduce_scatter(nil, lt.tensor({{1, 2}, {3, 4}}), "max") -- a 2-d inp: out is its flat piece
  testing.assert_equal(rs:tolist(), {1, 2, 3, 4})
end)

test("async handles, barrier, p2p with oneself", function()
  local t = lt.tensor({1, 2})
  local h = world:all_reduce(t, "sum", {async = true})
  assert(h:done())
  assert(h:wait() == t)
  world:barrier()
  world:barrier({async = true}):wait()
  local got = lt.empty(2)
  world:p2p({{"send", lt.tensor({7, 8}), 0}, {"recv", got, 0}}):wait()
  testing.assert_equal(got:tolist(), {7, 8})
  testing.assert_error("is this rank", function() world:send(t, 0) end)
  testing.assert_error("has no matching send", function() world:p2p({{"recv", got, 0}}):wait() end)
end)

test("split: a group of one, or nil for a negative color", function()
  local g = comm.split(0, 0, "solo")
  testing.assert_equal({g.name, g.size, g.rank}, {"solo", 1, 0})
  assert(comm.split(-1) == nil)
  local t = lt.tensor({3})
  g:all_reduce(t)
  testing.assert_equal(t:tolist(), {3})
end)

test("bad input is an error in a singleton too", function()
  testing.assert_error("unknown op 'prod'", function() world:all_reduce(lt.ones(2), "prod") end)
  testing.assert_error("out [5] f32 cpu has 5 elements, expected 2", function() world:all_gather(lt.empty(5), lt.ones(2)) end)
  testing.assert_error("root 1 is out of range", function() world:broadcast(lt.ones(2), 1) end)
  testing.assert_error("t must be a tensor", function() world:all_reduce(3) end)
  testing.assert_error("counts[1] = -1 is negative", function() world:all_gather(nil, lt.ones(2), {counts = {-1}}) end)
end)

test("flight recorder and debug mode in a singleton", function()
  comm.set_debug(true)
  world:all_reduce(lt.ones(3, "f64"), "max")
  comm.set_debug(false)
  local r = comm.recent(1)[1]
  testing.assert_equal({r.op, r.group, r.dtype, r.count, r.state}, {"all_reduce", "world", "f64", 3, "done"})
end)
