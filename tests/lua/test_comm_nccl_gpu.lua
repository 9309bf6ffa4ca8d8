-- lutra.dist.comm with a GPU and NCCL in the build (label gpu; skipped as a whole without
-- either): a world of one through NCCL (the communicator, the comm stream and its events),
-- results checked against the inputs. A broken driver fails, and so does no GPU where
-- LUTRA_REQUIRE_GPU is set, as in `lutra selftest`.
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local testing = require "lutra.testing"
local lf = require "lutra.ffi"

testing.need_gpu()
if not lf.ffi.string(lf.C.lt_build_info()):find("nccl: %d") then skip("a build without NCCL") end

local world = comm.init()

test("CUDA tensors through NCCL in a world of one", function()
  for _, dt in ipairs({"f32", "f64", "bf16", "f16", "i32", "i64", "u8"}) do
    local t = lt.tensor({1, 2, 3, 4}, {dtype = dt, device = "cuda"})
    world:all_reduce(t, dt == "i32" and "max" or "sum")
    world:broadcast(t, 0)
    testing.assert_equal(t:cpu():tolist(), {1, 2, 3, 4})
    local out = world:all_gather(lt.empty(4, {dtype = dt, device = "cuda"}), t)
    testing.assert_equal(out:cpu():tolist(), {1, 2, 3, 4})
    local rs = world:reduce_scatter(lt.empty(4, {dtype = dt, device = "cuda"}), t, "min", {counts = {4}})
    testing.assert_equal(rs:cpu():tolist(), {1, 2, 3, 4})
  end
  local t = lt.tensor({2, 4}, {device = "cuda"})
  local h = world:all_reduce(t, "avg", {async = true})
  assert(h:wait() == t)
  testing.assert_equal((t * 2):cpu():tolist(), {4, 8}) -- compute after the wait sees the result
  local got = lt.empty(2, {device = "cuda"})
  world:p2p({{"send", t, 0}, {"recv", got, 0}}):wait()
  testing.assert_equal(got:cpu():tolist(), {2, 4})
  local r = comm.recent(1)[1]
  testing.assert_equal({r.op, r.state}, {"p2p", "done"})
  testing.assert_error("out [4] f32 cuda:0 has 4 elements, expected 8", function()
    world:all_gather(lt.empty(4, {device = "cuda"}), lt.ones(8, {device = "cuda"}))
  end)
end)
