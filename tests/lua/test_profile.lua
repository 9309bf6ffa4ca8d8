-- lutra.profile: the events of a known computation (shapes, dtype, bytes, the matmul's 2MNK
-- FLOPs), nesting, the table, the Chrome trace (read back by python3's json when there is one,
-- else lutra.json), the op tables put back exactly (also after an error), and config.profile.
local lt = require "lutra"
local json = require "lutra.json"
local T = require "lutra.testing"
local profile = require "lutra.profile"
local tprofile = require "lutra.train.profile"
local equal, fails = T.assert_equal, T.assert_error

-- Every table the profiler swaps functions in, with a copy of its contents now.
local function snapshot()
  local tables = {require "lutra.ops", require "lutra.ops.elementwise", require "lutra.ops.reduce",
                  require "lutra.ops.matmul", require "lutra.create", require("lutra.tensor").methods,
                  require "lutra.functional", require "lutra.functional.linear", lt, require "lutra.ckpt",
                  require("lutra.data").Loader, require("lutra.dist.comm").Group, require("lutra.dist.comm").Handle}
  for _, cls in pairs(require("lutra.autograd.op").classes) do tables[#tables + 1] = cls end
  local copy = {}
  for i, t in ipairs(tables) do
    copy[i] = {}
    for k, v in pairs(t) do copy[i][k] = v end
  end
  return tables, copy
end

local function same_as(tables, copy, what)
  for i, t in ipairs(tables) do
    for k, v in pairs(copy[i]) do
      if rawget(t, k) ~= v then error(string.format("%s: %s differs from before", what, tostring(k)), 2) end
    end
    for k in pairs(t) do
      if copy[i][k] == nil then error(string.format("%s: %s was added", what, tostring(k)), 2) end
    end
  end
end

local function by_name(prof, name)
  local out = {}
  for _, ev in ipairs(prof.events) do
    if ev.name == name then out[#out + 1] = ev end
  end
  return out
end

-- M, K, N = 5, 7, 3: a (5, 7) @ b (7, 3), then + c (5, 3), summed, backward.
local M_, K_, N_ = 5, 7, 3
local function known()
  local a = lt.randn(M_, K_):requires_grad_()
  local b = lt.randn(K_, N_):requires_grad_()
  local c = lt.randn(M_, N_)
  local prof, loss = lt.profile(function()
    local y = lt.matmul(a, b)
    local z = (y + c):sum()
    z:backward()
    return z:item()
  end)
  return prof, loss, a, b
end

test("profile: the matmul, the add and the backward nodes with their shapes, dtype, bytes and FLOPs", function()
  local prof, loss, a = known()
  equal(type(loss), "number")
  equal(a.grad ~= nil, true)
  local mm = by_name(prof, "matmul")
  equal(#mm, 1)
  local e = mm[1]
  equal(e.cat, "op")
  equal(e.shapes, {"[5,7]", "[7,3]", "[5,3]"})
  equal(e.n_in, 2)
  equal(lt.dtypes[e.dtype + 1], "f32")
  equal(e.dev, -1)
  equal(e.flops, 2 * M_ * N_ * K_)
  equal(e.bytes, 4 * (M_ * K_ + K_ * N_ + M_ * N_))
  equal(e.out_bytes, 4 * M_ * N_)
  local add = by_name(prof, "add")
  equal(#add, 1)
  equal(add[1].shapes, {"[5,3]", "[5,3]", "[5,3]"})
  equal(add[1].flops, M_ * N_)
  equal(#by_name(prof, "sum"), 1)
  -- the backward: the engine's pass, the nodes inside it; the matmul's node costs 2x its forward
  local bw = by_name(prof, "backward")
  equal(#bw, 1)
  equal(bw[1].cat, "autograd")
  local mmb = by_name(prof, "MmBackward")
  equal(#mmb, 1)
  equal(mmb[1].cat, "backward")
  equal(mmb[1].flops, 2 * 2 * M_ * N_ * K_)
  equal(mmb[1].shapes[1], "[5,3]") -- its gradient
  equal(#by_name(prof, "AddBackward") + #by_name(prof, "SumBackward") >= 1, true)
end)

test("profile: nesting: every event lies within its parent, self = dur minus the children", function()
  local prof = known()
  local evs = {}
  for i, ev in ipairs(prof.events) do evs[i] = ev end
  table.sort(evs, function(x, y) return x.ts < y.ts or (x.ts == y.ts and x.depth < y.depth) end)
  local open, nested = {}, 0
  for _, ev in ipairs(evs) do
    while #open > 0 and open[#open].ts + open[#open].dur <= ev.ts do open[#open] = nil end
    equal(ev.dur >= 0, true)
    equal(ev.depth, #open + 1, "depth of " .. ev.name)
    local parent = open[#open]
    if parent then
      nested = nested + 1
      equal(ev.ts >= parent.ts and ev.ts + ev.dur <= parent.ts + parent.dur + 1e-6, true, ev.name .. " in " .. parent.name)
    end
    open[#open + 1] = ev
  end
  equal(nested > 0, true)
  for _, p in ipairs(prof.events) do
    local children = 0
    for _, c in ipairs(prof.events) do
      if c.depth == p.depth + 1 and c.ts >= p.ts and c.ts + c.dur <= p.ts + p.dur + 1e-6 then
        children = children + c.dur
      end
    end
    T.assert_close(p.self, p.dur - children, {atol = 1e-6, msg = "self of " .. p.name})
  end
  -- the node ran inside the backward pass
  local bw, mmb = by_name(prof, "backward")[1], by_name(prof, "MmBackward")[1]
  equal(mmb.ts >= bw.ts and mmb.ts + mmb.dur <= bw.ts + bw.dur, true)
end)

test("profile: the table lists the ops with calls, times, bytes and GFLOP/s; key_averages sums them", function()
  local prof = known()
  local text = prof:table{sort_by = "self_ms", top = 50}
  for _, name in ipairs {"matmul", "add", "sum", "backward", "MmBackward"} do
    equal(text:find("\n" .. name .. "%s") ~= nil, true, name .. " in the table:\n" .. text)
  end
  equal(text:find("Self ms", 1, true) ~= nil and text:find("GFLOP/s", 1, true) ~= nil, true)
  local rows = prof:key_averages()
  local total_self, mm = 0, nil
  for _, r in ipairs(rows) do
    total_self = total_self + r.self_ms
    if r.name == "matmul" then mm = r end
  end
  equal(mm.calls, 1)
  equal(mm.flops, 2 * M_ * N_ * K_)
  T.assert_close(mm.gflops, mm.flops / (mm.total_ms * 1e6), {rtol = 1e-12})
  local sum_events = 0
  for _, ev in ipairs(prof.events) do sum_events = sum_events + ev.self end
  T.assert_close(total_self, sum_events / 1e3, {rtol = 1e-9})
  -- top and sort_by
  local two = prof:table{sort_by = "flops", top = 2}
  local first = two:match("^%-+\n[^\n]+\n%-+\n(%S+)")
  equal(first, "MmBackward")
  fails("sort_by", function() prof:table{sort_by = "nope"} end)
end)

test("profile: the Chrome trace: traceEvents, X events with ts, dur, pid, tid, args; process and thread names", function()
  local prof = known()
  local path = os.tmpname()
  equal(prof:export_chrome_trace(path), path)
  local text = assert(io.open(path)):read("*a")
  local doc
  if os.execute("python3 -c 'import json' 2>/dev/null") == 0 then -- python's reader, the independent one
    local out = os.tmpname()
    equal(os.execute(string.format("python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
      .. "json.dump(d, open(sys.argv[2], \"w\"))' %s %s", path, out)), 0)
    doc = json.read_file(out)
    os.remove(out)
  else
    doc = json.decode(text)
  end
  os.remove(path)
  local names, meta, cats = {}, {}, {}
  for _, e in ipairs(doc.traceEvents) do
    if e.ph == "X" then
      equal(type(e.name), "string")
      equal(type(e.ts), "number")
      equal(e.dur >= 0, true)
      equal(e.pid, 0)
      equal(e.tid, 1)
      names[e.name] = e
      cats[e.cat] = true
    else
      equal(e.ph, "M")
      meta[e.name] = e.args
    end
  end
  equal(meta.process_name.name, "rank 0")
  equal(meta.thread_name.name, "main")
  local mm = names.matmul
  equal(mm.args.shapes, "[5,7], [7,3], [5,3]")
  equal(mm.args.dtype, "f32")
  equal(mm.args.device, "cpu")
  equal(mm.args.flops, 2 * M_ * N_ * K_)
  equal(mm.args.bytes, 4 * (M_ * K_ + K_ * N_ + M_ * N_))
  equal(names.MmBackward ~= nil and cats.backward and cats.op, true)
  -- ts: microseconds since the epoch (within a day of os.time)
  equal(math.abs(mm.ts / 1e6 - os.time()) < 86400, true)
end)

test("profile: off leaves the op tables as they were; an error inside fn still restores everything", function()
  local tables, copy = snapshot()
  local mt_add = getmetatable(lt.zeros(1)).__add
  known()
  same_as(tables, copy, "after a profile")
  local seen
  fails("matmul", function()
    lt.profile(function()
      seen = require("lutra.ops").matmul
      lt.matmul(lt.zeros(2, 3), lt.zeros(4, 5)) -- inner dims differ
    end)
  end)
  equal(seen ~= copy[1].matmul, true) -- it was swapped while running
  same_as(tables, copy, "after an error")
  equal(profile.active(), nil)
  equal(getmetatable(lt.zeros(1)).__add, mt_add)
  -- profiling again after the error works
  local prof = known()
  equal(#by_name(prof, "matmul"), 1)
end)

test("profile: regions and nested calls; one profile at a time; bad options", function()
  local prof = lt.profile(function()
    profile.region("outer", function()
      local x = lt.ones(4, 4)
      return x:exp():sum()
    end)
  end)
  local outer = by_name(prof, "outer")[1]
  local exp = by_name(prof, "exp")[1]
  equal(outer.cat, "user")
  equal(exp.depth, outer.depth + 1)
  fails("already running", function() lt.profile(function() lt.profile(function() end) end) end)
  equal(profile.active(), nil)
  fails("unknown option bogus", function() lt.profile(function() end, {bogus = 1}) end)
end)

test("train profile: config.profile parses N-M and N, and names the key on bad values", function()
  equal(tprofile.parse(""), nil)
  local a, b = tprofile.parse("3-5")
  equal(a, 3)
  equal(b, 5)
  a, b = tprofile.parse("4")
  equal(a, 2)
  equal(b, 5)
  fails("config.profile", function() tprofile.parse("5-3") end)
  fails("config.profile", function() tprofile.parse("x") end)
  fails("config.profile", function() tprofile.parse({}) end)
end)

test("train profile: a run with profile = \"2-3\" writes trace.json with two ProfilerStep ranges and the ops", function()
  local dir = os.tmpname()
  os.remove(dir)
  os.execute("mkdir -p " .. dir)
  local path = dir .. "/corpus.txt"
  T.word_corpus(path, {"the", "cat", "sat", "on", "a", "mat"}, 400, 1)
  local tok = lt.tokenizer.char(assert(io.open(path)):read("*a"))
  local data = lt.data.text(path, tok, {seq_len = 8, batch = 4, seed = 1, cache = path .. ".bin", quiet = true})
  local model = lt.models.build {arch = "gpt2", n_layer = 1, n_head = 2, d_model = 16, vocab_size = tok.vocab_size,
                                 block_size = 8, dropout = 0}
  local tables, copy = snapshot()
  local out = {}
  local r = lt.train{model = model, data = data, no_interrupt = true, quiet = false,
                     out = {write = function(_, s) out[#out + 1] = s end, flush = function() end},
                     config = {steps = 4, warmup = 0, eval_every = 0, run_dir = dir, profile = "2-3"}}
  equal(r.step, 4)
  same_as(tables, copy, "after the run")
  local doc = json.read_file(dir .. "/latest/trace.json") -- in the run's own directory
  local steps, ops, data_next = {}, 0, 0
  for _, e in ipairs(doc.traceEvents) do
    if e.ph == "X" then
      if e.name:match("^ProfilerStep#") then steps[#steps + 1] = e.name end
      if e.cat == "op" then ops = ops + 1 end
      if e.name == "data.next" then data_next = data_next + 1 end
    end
  end
  table.sort(steps)
  equal(steps, {"ProfilerStep#2", "ProfilerStep#3"})
  equal(ops > 10, true)
  equal(data_next, 2)
  local text = table.concat(out)
  equal(text:find("profile of steps 2-3", 1, true) ~= nil and text:find("Self ms", 1, true) ~= nil, true, text)
  os.execute("rm -rf " .. dir)
end)
