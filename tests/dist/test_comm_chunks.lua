-- np: 2
-- all_reduce and broadcast of more elements than one MPI call takes go in chunks (MPI
-- counts are ints): LUTRA_COMM_CHUNK lowers the chunk to 5 elements so that it shows here.
local ffi = require "ffi"
pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
ffi.C.setenv("LUTRA_COMM_CHUNK", "5", 1) -- read at the first all_reduce or broadcast
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local testing = require "lutra.testing"

local world = comm.init()
local R, N = world.rank, world.size

local function values(n, dt, r)
  if n == 0 then return lt.empty(0, dt) end
  local list = {}
  for i = 1, n do list[i] = (r * 5 + i * 3) % 13 end
  return lt.tensor(list, dt)
end

local function expected(n, fn)
  local list = {}
  for i = 1, n do list[i] = fn(i) end
  return list
end

test("all_reduce in chunks: blocking and async, sum, max, avg", function()
  for _, dt in ipairs({"f32", "f64", "bf16", "i64", "u8"}) do
    for _, n in ipairs({0, 1, 5, 7, 33}) do
      local t = values(n, dt, R)
      world:all_reduce(t, "sum")
      local want = expected(n, function(i) local s = 0 for r = 0, N - 1 do s = s + (r * 5 + i * 3) % 13 end return s end)
      testing.assert_equal(n > 0 and t:tolist() or {}, want, "sum " .. dt .. " n " .. n)
      t = values(n, dt, R)
      world:all_reduce(t, "max", {async = true}):wait()
      want = expected(n, function(i) local m = 0 for r = 0, N - 1 do m = math.max(m, (r * 5 + i * 3) % 13) end return m end)
      testing.assert_equal(n > 0 and t:tolist() or {}, want, "async max " .. dt .. " n " .. n)
    end
  end
  local t = values(12, "f64", R)
  world:all_reduce(t, "avg", {async = true}):wait()
  testing.assert_equal(t:tolist(), expected(12, function(i)
    local s = 0 for r = 0, N - 1 do s = s + (r * 5 + i * 3) % 13 end return s / N end))
end)

test("broadcast in chunks from each root", function()
  for root = 0, N - 1 do
    for _, n in ipairs({4, 11, 26}) do
      local t = values(n, "i32", R)
      world:broadcast(t, root)
      testing.assert_equal(t:tolist(), values(n, "i32", root):tolist())
      t = values(n, "f16", R)
      world:broadcast(t, root, {async = true}):wait()
      testing.assert_equal(t:tolist(), values(n, "f16", root):tolist())
    end
  end
end)
