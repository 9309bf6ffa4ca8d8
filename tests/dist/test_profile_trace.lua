-- np: 2
-- config.profile under data parallelism (dp = 2): 3 profiled steps of a small training run; rank 0
-- merges both ranks' events into the run's trace.json (run_dir/latest), read back by python3's json (lutra.json where
-- python3 is missing): traceEvents, each X event complete, a pid and a process_name per rank, the
-- gradient all-reduces on both ranks, and the ranks' steps on one clock.
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local json = require "lutra.json"
local T = require "lutra.testing"
local equal = T.assert_equal

local world = comm.init()
local R = world.rank

-- one directory for both ranks: rank 0's name, handed round
local dir = os.tmpname()
os.remove(dir)
dir = world:all_gather_text(dir)[1]
if R == 0 then os.execute("mkdir -p " .. dir) end
world:barrier()

local function read_trace(path)
  if os.execute("python3 -c 'import json' 2>/dev/null") == 0 then
    local out = path .. ".py.json"
    equal(os.execute(string.format("python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
      .. "json.dump(d, open(sys.argv[2], \"w\"))' %s %s", path, out)), 0, "python3 reads " .. path)
    return json.read_file(out)
  end
  return json.read_file(path)
end

test("profile under dp=2: one trace.json with both ranks, complete events and the all-reduces", function()
  local corpus = string.format("%s/corpus_%d.txt", dir, R)
  T.word_corpus(corpus, {"the", "cat", "sat", "on", "a", "mat", "and", "dog"}, 800, 7)
  local tok = lt.tokenizer.char(assert(io.open(corpus)):read("*a"))
  local data = lt.data.text(corpus, tok, {seq_len = 8, batch = 4, seed = 3, cache = corpus .. ".bin", quiet = true})
  lt.manual_seed(1)
  local model = lt.models.build {arch = "gpt2", n_layer = 1, n_head = 2, d_model = 16, vocab_size = tok.vocab_size,
                                 block_size = 8, dropout = 0}
  local r = lt.train{model = model, data = data, quiet = true, no_interrupt = true,
                     config = {steps = 4, warmup = 0, eval_every = 0, run_dir = dir, profile = "2-4",
                               parallel = {dp = 2, bucket_mb = 0.001}}}
  equal(r.step, 4)
  world:barrier()
  if R ~= 0 then return end
  local doc = read_trace(dir .. "/latest/trace.json")
  equal(type(doc.traceEvents), "table")
  local names, steps, reduces = {}, {[0] = {}, [1] = {}}, {[0] = 0, [1] = 0}
  for _, e in ipairs(doc.traceEvents) do
    equal(type(e.name), "string")
    equal(type(e.pid), "number")
    equal(type(e.tid), "number")
    if e.ph == "M" then
      if e.name == "process_name" then names[e.pid] = e.args.name end
    else
      equal(e.ph, "X", "event " .. e.name)
      equal(type(e.ts), "number")
      equal(type(e.dur) == "number" and e.dur >= 0, true, "dur of " .. e.name)
      if e.name:match("^ProfilerStep#") then steps[e.pid][#steps[e.pid] + 1] = e end
      if e.cat == "comm" and e.name == "all_reduce" then reduces[e.pid] = reduces[e.pid] + 1 end
    end
  end
  equal(names, {[0] = "rank 0", [1] = "rank 1"})
  for rank = 0, 1 do
    equal(#steps[rank], 3, "profiled steps of rank " .. rank)
    equal(reduces[rank] >= 3, true, "all-reduces of rank " .. rank .. ": " .. reduces[rank])
  end
  -- one clock: the ranks' same step overlaps (they meet in its all-reduces)
  local function by_name(list, name)
    for _, e in ipairs(list) do if e.name == name then return e end end
  end
  for s = 2, 4 do
    local a, b = by_name(steps[0], "ProfilerStep#" .. s), by_name(steps[1], "ProfilerStep#" .. s)
    equal(a.ts < b.ts + b.dur and b.ts < a.ts + a.dur, true, "step " .. s .. " overlaps on both ranks")
  end
  os.execute("rm -rf " .. dir)
end)
