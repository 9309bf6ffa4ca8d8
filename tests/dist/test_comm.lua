-- np: 2 4
-- Collectives of lutra.dist.comm against values every rank computes on its own: rank r
-- contributes value(r, i) at index i, so each rank knows what all the others sent.
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local testing = require "lutra.testing"

local world = comm.init()
local R, N = world.rank, world.size
local DTYPES = {"f32", "f64", "bf16", "f16", "i32", "i64", "u8"}
local FLOATS = {f32 = true, f64 = true, bf16 = true, f16 = true}

-- Small integers (exact in every dtype, sums of 4 ranks too); no negatives for u8.
local function value(dt, r, i)
  local v = (r * 7 + i * 3) % 11
  if dt ~= "u8" then v = v - 3 end
  return v
end

local function make(dt, n, fn)
  if n == 0 then return lt.empty(0, dt) end
  local list = {}
  for i = 1, n do list[i] = fn(i - 1) end
  return lt.tensor(list, dt)
end

local function check(t, n, fn, what)
  testing.assert_equal(t:numel(), n, what .. ": numel")
  local got = n > 0 and t:view(-1):tolist() or {}
  for i = 1, n do
    local want = fn(i - 1)
    if math.abs(got[i] - want) > 1e-6 * math.max(1, math.abs(want)) then
      error(string.format("%s: rank %d element %d: got %s, expected %s", what, R, i - 1, tostring(got[i]), tostring(want)), 2)
    end
  end
end

-- sum/avg/max/min of value(dt, r, i) over the ranks in `ranks`
local function reduce(dt, op, ranks, i)
  local acc
  for _, r in ipairs(ranks) do
    local v = value(dt, r, i)
    if acc == nil then acc = v
    elseif op == "max" then acc = math.max(acc, v)
    elseif op == "min" then acc = math.min(acc, v)
    else acc = acc + v end
  end
  if op == "avg" then acc = acc / #ranks end
  return acc
end

local all = {}
for r = 0, N - 1 do all[#all + 1] = r end

test("world and rank queries", function()
  testing.assert_equal(comm.size(), N)
  testing.assert_equal(comm.rank(), R)
  assert(comm.initialized() and comm.uses_mpi())
  testing.assert_equal(world.name, "world")
  testing.assert_equal(#world.ranks, N)
  assert(comm.local_rank() >= 0 and comm.local_rank() < N)
  assert(comm.init() == world and comm.world == world)
end)

test("all_reduce: every op and dtype, sizes 1, 7, 33", function()
  for _, dt in ipairs(DTYPES) do
    for _, op in ipairs({"sum", "avg", "max", "min"}) do
      if op ~= "avg" or FLOATS[dt] then
        for _, n in ipairs({1, 7, 33}) do
          local t = make(dt, n, function(i) return value(dt, R, i) end)
          local res = world:all_reduce(t, op)
          assert(res == t, "all_reduce returns its tensor")
          check(t, n, function(i) return reduce(dt, op, all, i) end, "all_reduce " .. op .. " " .. dt)
        end
      end
    end
  end
end)

test("all_reduce: 2-d and non-contiguous tensors", function()
  local t = make("f32", 12, function(i) return value("f32", R, i) end):view(3, 4)
  world:all_reduce(t)
  check(t, 12, function(i) return reduce("f32", "sum", all, i) end, "all_reduce 2-d")
  local base = make("f64", 12, function(i) return value("f64", R, i) end):view(3, 4)
  local tt = base:t() -- (4, 3) view, element (a, b) is base[b][a]
  assert(not tt:is_contiguous())
  world:all_reduce(tt, "max")
  check(base, 12, function(i) return reduce("f64", "max", all, i) end, "all_reduce non-contiguous")
end)

-- pieces of a flat buffer: counts[k] elements for group rank k
local function displs(counts)
  local d, s = {}, 0
  for k, c in ipairs(counts) do d[k], s = s, s + c end
  return d, s
end

local function uneven_counts(n)
  local counts = {}
  for k = 1, n do counts[k] = (k * 3 + 1) % 5 end -- 4, 2, 0, 3, ...: a zero piece at np 4
  return counts
end

test("reduce_scatter: every dtype, even and uneven pieces", function()
  for _, dt in ipairs(DTYPES) do
    for _, op in ipairs({"sum", "max", FLOATS[dt] and "avg" or "min"}) do
      -- even: 5 elements each
      local inp = make(dt, 5 * N, function(i) return value(dt, R, i) end)
      local out = lt.empty(5, dt)
      world:reduce_scatter(out, inp, op)
      check(out, 5, function(i) return reduce(dt, op, all, R * 5 + i) end, "reduce_scatter " .. op .. " " .. dt)
      -- uneven
      local counts = uneven_counts(N)
      local d, total = displs(counts)
      inp = make(dt, total, function(i) return value(dt, R, i) end)
      out = lt.empty(counts[R + 1], dt)
      world:reduce_scatter(out, inp, op, {counts = counts})
      check(out, counts[R + 1], function(i) return reduce(dt, op, all, d[R + 1] + i) end, "reduce_scatter counts " .. dt)
    end
  end
end)

test("all_gather: every dtype, even and uneven pieces, out allocated", function()
  for _, dt in ipairs(DTYPES) do
    local inp = make(dt, 6, function(i) return value(dt, R, i) end)
    local out = lt.empty(N * 6, dt)
    world:all_gather(out, inp)
    check(out, N * 6, function(j) return value(dt, math.floor(j / 6), j % 6) end, "all_gather " .. dt)
    local counts = uneven_counts(N)
    local d, total = displs(counts)
    inp = make(dt, counts[R + 1], function(i) return value(dt, R, i) end)
    out = world:all_gather(nil, inp, {counts = counts})
    check(out, total, function(j)
      for k = N, 1, -1 do if j >= d[k] and counts[k] > 0 then return value(dt, k - 1, j - d[k]) end end
    end, "all_gather counts " .. dt)
  end
  local out = world:all_gather(nil, lt.ones(2, 3))
  testing.assert_equal(out.shape, {N, 2, 3})
end)

test("all_gather: in place from this rank's slice of out", function()
  local out = lt.zeros(N * 4, "f64")
  local mine = out:narrow(0, R * 4, 4)
  mine:copy_(make("f64", 4, function(i) return value("f64", R, i) end))
  world:all_gather(out, mine)
  check(out, N * 4, function(j) return value("f64", math.floor(j / 4), j % 4) end, "all_gather in place")
end)

test("all_gather_text: every rank's string in rank order, empty ones too; a non-string is an error", function()
  local mine = world.rank % 2 == 1 and "" or string.rep("r" .. world.rank, world.rank + 1)
  local got = world:all_gather_text(mine)
  testing.assert_equal(#got, world.size)
  for r = 0, world.size - 1 do
    testing.assert_equal(got[r + 1], r % 2 == 1 and "" or string.rep("r" .. r, r + 1))
  end
  testing.assert_error("all_gather_text on group world: expected a string, got number", world.all_gather_text, world, 3)
end)

test("broadcast from each root, every dtype", function()
  for _, dt in ipairs(DTYPES) do
    for root = 0, N - 1 do
      local t = make(dt, 9, function(i) return value(dt, R, i) end)
      world:broadcast(t, root)
      check(t, 9, function(i) return value(dt, root, i) end, "broadcast " .. dt .. " root " .. root)
    end
  end
end)

test("send and recv around the ring, blocking and async", function()
  local nxt, prv = (R + 1) % N, (R - 1 + N) % N
  for _, dt in ipairs(DTYPES) do
    local out, got = make(dt, 5, function(i) return value(dt, R, i) end), lt.empty(5, dt)
    if R % 2 == 0 then
      world:send(out, nxt); world:recv(got, prv)
    else
      world:recv(got, prv); world:send(out, nxt)
    end
    check(got, 5, function(i) return value(dt, prv, i) end, "send/recv " .. dt)
  end
  local got = lt.empty(3, "f32")
  local hr = world:recv(got, prv, {async = true, tag = 7})
  local hs = world:send(make("f32", 3, function(i) return value("f32", R, i) end), nxt, {async = true, tag = 7})
  hs:wait()
  assert(hr:wait() == got)
  check(got, 3, function(i) return value("f32", prv, i) end, "async send/recv")
end)

test("p2p batch: ring exchange in both directions", function()
  local nxt, prv = (R + 1) % N, (R - 1 + N) % N
  local a, b = lt.empty(4, "f32"), lt.empty(4, "f32")
  local h = world:p2p({
    {"send", make("f32", 4, function(i) return value("f32", R, i) end), nxt},
    {"send", make("f32", 4, function(i) return value("f32", R, i + 10) end), prv},
    {"recv", a, prv}, {"recv", b, nxt},
  })
  h:wait()
  check(a, 4, function(i) return value("f32", prv, i) end, "p2p from prev")
  check(b, 4, function(i) return value("f32", nxt, i + 10) end, "p2p from next")
end)

test("async handles: several in flight, waited out of order", function()
  local t1 = make("f32", 50, function(i) return value("f32", R, i) end)
  local t2 = make("bf16", 20, function(i) return value("bf16", R, i) end)
  local out = lt.empty(N * 3, "i64")
  local h1 = world:all_reduce(t1, "avg", {async = true})
  local h2 = world:all_reduce(t2, "max", {async = true})
  local h3 = world:all_gather(out, make("i64", 3, function(i) return value("i64", R, i) end), {async = true})
  local h4 = world:barrier({async = true})
  assert(h3:wait() == out)
  h4:wait()
  while not h2:done() do end
  assert(h2:wait() == t2)
  h1:wait()
  h1:wait() -- a second wait is a no-op
  check(t1, 50, function(i) return reduce("f32", "avg", all, i) end, "async avg")
  check(t2, 20, function(i) return reduce("bf16", "max", all, i) end, "async max bf16")
  check(out, N * 3, function(j) return value("i64", math.floor(j / 3), j % 3) end, "async all_gather")
  -- freeing a tensor while its call is in flight is safe: the request holds the storage
  local tf = lt.ones(1000)
  local hf = world:all_reduce(tf, "avg", {async = true})
  tf:free()
  hf:wait()
end)

test("split: even and odd ranks", function()
  local g = comm.split(R % 2, R, "parity")
  local members = {}
  for r = R % 2, N - 1, 2 do members[#members + 1] = r end
  testing.assert_equal(g.ranks, members)
  testing.assert_equal(g.size, #members)
  testing.assert_equal(g.rank, math.floor(R / 2))
  testing.assert_equal(g.name, "parity")
  local t = make("f64", 6, function(i) return value("f64", R, i) end)
  g:all_reduce(t)
  check(t, 6, function(i) return reduce("f64", "sum", members, i) end, "all_reduce on parity group")
  local b = make("i32", 4, function(i) return value("i32", R, i) end)
  g:broadcast(b, g.size - 1)
  check(b, 4, function(i) return value("i32", members[#members], i) end, "broadcast on parity group")
  -- color < 0: not a member
  local only0 = comm.split(R == 0 and 0 or -1, 0, "zero")
  if R == 0 then testing.assert_equal(only0.size, 1) else assert(only0 == nil) end
  g:barrier()
end)

test("bad input: clear errors naming op and group", function()
  testing.assert_error("all_gather on group world: out [3] f32", function() world:all_gather(lt.empty(3), lt.ones(2)) end)
  testing.assert_error("unknown op 'prod'", function() world:all_reduce(lt.ones(2), "prod") end)
  testing.assert_error("avg needs a floating dtype, got i32", function() world:all_reduce(lt.ones(2, "i32"), "avg") end)
  testing.assert_error("not a multiple of the group size", function()
    world:reduce_scatter(nil, lt.ones(N * 2 + 1))
  end)
  testing.assert_error("root " .. N .. " is out of range", function() world:broadcast(lt.ones(2), N) end)
  testing.assert_error("opts.counts must be a list of " .. N, function() world:all_gather(nil, lt.ones(2), {counts = {1}}) end)
  testing.assert_error("differ in dtype", function() world:all_gather(lt.empty(N * 2, "f64"), lt.ones(2)) end)
  testing.assert_error("unsupported dtype", function() world:all_reduce(lt.ones(2, "bool")) end)
  testing.assert_error("peer " .. R .. " is this rank", function() world:send(lt.ones(2), R) end)
  -- the C API itself refuses non-contiguous tensors (the Lua layer copies them)
  local C = require("lutra.ffi").C
  local nc = lt.zeros(3, 4):t()
  assert(C.lt_comm_all_reduce(world.ptr, nc, C.LT_COMM_SUM, nil) ~= 0)
  assert(require("lutra.ffi").ffi.string(C.lt_last_error()):find("must be contiguous", 1, true))
  -- a non-contiguous out through Lua gets the values copied back
  local out = lt.zeros(4, N):t() -- (N, 4) view of a (4, N) tensor
  world:all_gather(out, make("f32", 4, function(i) return value("f32", R, i) end))
  check(out:contiguous(), 4 * N, function(j) return value("f32", math.floor(j / 4), j % 4) end, "non-contiguous out")
  world:barrier() -- everyone still in step
end)

test("debug mode: fingerprints match, then a mismatch fails on every rank", function()
  comm.set_debug(true)
  local t = lt.ones(8)
  world:all_reduce(t)
  check(t, 8, function() return N end, "all_reduce in debug mode")
  local err = testing.assert_error("collective mismatch on group world", function()
    if R == 0 then world:all_reduce(lt.ones(16)) else world:broadcast(lt.ones(4), 0) end
  end)
  assert(err:find("rank 0 all_reduce f32 [16]", 1, true), err)
  assert(err:find("rank 1 broadcast f32 [4] root 0", 1, true), err)
  assert(err:find("test_comm.lua:", 1, true), err) -- the call sites
  -- a dtype that differs across ranks (without debug mode MPI would mix the bytes)
  err = testing.assert_error("collective mismatch on group world", function()
    world:all_reduce(lt.ones(6, R == 0 and "f32" or "f64"))
  end)
  assert(err:find("rank 0 all_reduce f32 [6]", 1, true) and err:find("rank 1 all_reduce f64 [6]", 1, true), err)
  -- the group goes on in step after a mismatch
  local t2 = lt.ones(3, "i64")
  world:all_reduce(t2)
  check(t2, 3, function() return N end, "all_reduce after a mismatch")
  comm.set_debug(false)
  world:barrier()
end)

test("flight recorder: the last calls with seq, op, group, dtype and state", function()
  local g = comm.split(0, R, "fr")
  g:all_reduce(lt.ones(5, "f64"), "max")
  g:broadcast(lt.ones(2, 3, "i32"), 0)
  local rec = comm.recent(2)
  testing.assert_equal(#rec, 2)
  testing.assert_equal(rec[1].op, "all_reduce")
  testing.assert_equal(rec[1].group, "fr")
  testing.assert_equal(rec[1].dtype, "f64")
  testing.assert_equal(rec[1].count, 5)
  testing.assert_equal(rec[1].state, "done")
  testing.assert_equal(rec[2].seq, rec[1].seq + 1)
  testing.assert_equal(rec[2].shape, "[2,3]")
  testing.assert_equal(rec[2].peer, 0)
  assert(#comm.recent(1000) <= 64)
end)

test("hold: the watchdog is off while fn runs; results and errors pass through", function()
  local a, b = comm.hold(function(x) return x + 1, "y" end, 1)
  testing.assert_equal(a, 2)
  testing.assert_equal(b, "y")
  testing.assert_error("boom", function() comm.hold(function() error("boom") end) end)
  local old = comm.timeout()
  comm.set_timeout(5)
  testing.assert_equal(comm.timeout(), 5)
  comm.set_timeout(old)
end)
