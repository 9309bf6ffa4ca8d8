-- lutra.train: exact resume. N steps, save, resume in a fresh model and optimizer, N more
-- steps: the losses (training and validation) are exactly those of a straight 2N-step run
-- (compared with ==), with dropout (the RNG), gradient accumulation, clipping, a cosine
-- schedule, AdamW state and both loaders' positions in play.
local lt = require "lutra"
local train = require "lutra.train"
local models = require "lutra.models"
local ckpt = require "lutra.ckpt"
local runs = require "lutra.train.runs"
local metrics = require "lutra.train.metrics"
local files = require "lutra.ckpt.files"
local T = require "lutra.testing"
local equal, fails = T.assert_equal, T.assert_error

local dir = os.tmpname()
os.remove(dir)
os.execute("mkdir -p " .. dir)
local text_path = dir .. "/corpus.txt"
do -- a small corpus: varied enough for a loss that moves
  local words = {"the", "king", "queen", "of", "a", "fair", "night", "and", "my", "lord", "shall", "be", "so"}
  local parts = {}
  T.seed(7)
  for i = 1, 3000 do
    parts[#parts + 1] = words[T.randint(1, #words + 1)]
    if i % 11 == 0 then parts[#parts + 1] = ".\n" end
  end
  local f = assert(io.open(text_path, "w"))
  f:write(table.concat(parts, " "))
  f:close()
end

local tok = lt.tokenizer.char(assert(io.open(text_path)):read("*a"))

local function setup(seed, arch)
  lt.manual_seed(seed)
  local data = lt.data.text(text_path, tok, {seq_len = 16, batch = 4, seed = 1234, cache = dir .. "/corpus.bin",
                                             quiet = true})
  local model = models.build{arch = arch or "gpt2", n_layer = 2, n_head = 2, d_model = 32, vocab_size = tok.vocab_size,
                             block_size = 16, dropout = 0.1}
  return model, data
end

local function config(run_dir, extra)
  local cfg = {steps = 8, warmup = 2, lr = 3e-3, min_lr = 3e-4, grad_accum = 2, grad_clip = 0.5, eval_every = 2,
               eval_iters = 2, betas = {0.9, 0.99}, weight_decay = 0.1, run_dir = run_dir or "", ckpt_every = 0}
  for k, v in pairs(extra or {}) do cfg[k] = v end
  return cfg
end

local function val_list(r)
  local out = {}
  for i, v in ipairs(r.val_losses) do out[i] = {v.step, v.loss} end
  return out
end

for _, arch in ipairs {"gpt2", "llama"} do
  test(arch .. ": 4 steps, save, resume, 4 more == 8 straight steps (bitwise)", function()
    local model, data = setup(1, arch)
    local straight = train{model = model, data = data, config = config(), quiet = true}
    equal(#straight.losses, 8)
    equal(straight.step, 8)

    local run_dir = dir .. "/run_" .. arch
    model, data = setup(1, arch)
    local first = train{model = model, data = data, config = config(run_dir), quiet = true, until_step = 4}
    equal(first.step, 4)
    equal(first.checkpoint, run_dir .. "/ckpt/step_000004")
    equal(ckpt.latest(run_dir .. "/ckpt"), run_dir .. "/ckpt/step_000004")

    -- a fresh model (other weights), optimizer and loader, and a moved RNG: all restored
    model, data = setup(99, arch)
    lt.randn(100)
    local second = train{model = model, data = data, config = config(run_dir, {resume = "auto"}), quiet = true}
    equal(second.step, 8)
    for i = 1, 4 do
      assert(first.losses[i] == straight.losses[i],
        string.format("step %d: %.17g vs %.17g", i, first.losses[i], straight.losses[i]))
      assert(second.losses[i] == straight.losses[4 + i],
        string.format("step %d: %.17g vs %.17g", 4 + i, second.losses[i], straight.losses[4 + i]))
    end
    -- validation: steps 0, 2, 4 in the first part (4 is the resumed run's), 4, 6, 8 after
    local sv, fv, rv = val_list(straight), val_list(first), val_list(second)
    equal(#sv, 5)
    equal(fv, {sv[1], sv[2]})
    equal(rv, {sv[3], sv[4], sv[5]})
    -- the losses fell
    assert(straight.losses[8] < straight.losses[1], "the loss did not fall")
    -- the weights are bitwise the same too
    local a, b = model:state_dict(), nil
    model, data = setup(1, arch)
    train{model = model, data = data, config = config(), quiet = true}
    b = model:state_dict()
    for name, t in pairs(a) do equal(t:tolist(), b[name]:tolist(), name) end
  end)
end

test("resume from an explicit path; the run's metrics.jsonl continues as one run", function()
  local run_dir = dir .. "/run_path"
  local model, data = setup(3)
  train{model = model, data = data, config = config(run_dir, {ckpt_every = 2}), quiet = true, until_step = 3}
  -- ckpt_every 2: step 2, then the stop at 3; keep 2
  equal(ckpt.latest(run_dir .. "/ckpt"), run_dir .. "/ckpt/step_000003")
  local first = runs.list(run_dir)
  equal(#first, 1)
  model, data = setup(3)
  local r = train{model = model, data = data, config = config(run_dir, {resume = run_dir .. "/ckpt/step_000002"}),
                  quiet = true}
  equal(#r.losses, 6)
  equal(runs.list(run_dir), first) -- the same run, continued
  local recs = metrics.read(run_dir .. "/runs/" .. first[1] .. "/metrics.jsonl")
  local steps, vals = {}, {}
  for _, rec in ipairs(recs) do
    if rec.loss then steps[#steps + 1] = rec.step else vals[#vals + 1] = rec.step end
  end
  -- the record of step 3 (after the save of step 2) is dropped: the resumed run redid it
  equal(steps, {1, 2, 3, 4, 5, 6, 7, 8})
  equal(vals, {0, 2, 4, 6, 8})
end)

test("runs of one run_dir: each its own directory, latest the newest, earlier records kept", function()
  local run_dir = dir .. "/run_history"
  local model, data = setup(3)
  train{model = model, data = data, config = config(run_dir, {ckpt_every = 0}), quiet = true, until_step = 2}
  local first = runs.list(run_dir)
  equal(#first, 1)
  local first_records = metrics.read(run_dir .. "/runs/" .. first[1] .. "/metrics.jsonl")
  model, data = setup(3)
  train{model = model, data = data, config = config(run_dir, {ckpt_every = 0}), quiet = true, until_step = 3}
  local ids = runs.list(run_dir)
  equal(#ids, 2)
  equal(ids[1], first[1])
  equal(metrics.read(run_dir .. "/runs/" .. ids[1] .. "/metrics.jsonl"), first_records) -- untouched
  equal(files.resolved(run_dir .. "/latest"), files.resolved(run_dir .. "/runs/" .. ids[2]))
  equal(runs.latest(run_dir), run_dir .. "/latest")
  local last = 0
  for _, rec in ipairs(metrics.read(run_dir .. "/latest/metrics.jsonl")) do last = math.max(last, rec.step) end
  equal(last, 3)
  -- the run's train.log: what it said and its progress lines, as plain text (quiet or not)
  local log = assert(io.open(run_dir .. "/latest/train.log")):read("*a")
  assert(log:find("\nstep 3/8 | loss ", 1, true) and log:find("\nstep 2: val loss ", 1, true), log)
  assert(not log:find("\27", 1, true), "no terminal escapes in train.log")
  -- a run directory planted as a link is not written through: the resumed run gets a new one
  local id, path = runs.open(run_dir, nil)
  assert(id ~= ids[2] and path == run_dir .. "/runs/" .. id)
  os.execute(string.format("rm -r %s && ln -s /tmp %s", path, path))
  local id2 = runs.open(run_dir, id)
  assert(id2 ~= id and files.is_dir(run_dir .. "/runs/" .. id2) and not files.is_link(run_dir .. "/runs/" .. id2))
  -- a checkpoint's run id is a name under runs/, never a path
  for _, bad in ipairs {"../x", "a/b", ".hidden", "", string.rep("a", 65)} do
    assert(not runs.valid_id(bad), bad)
  end
  assert(runs.valid_id("20261204-163005-2"))
end)

test("resume errors: a missing checkpoint, another optimizer's state", function()
  local model, data = setup(4)
  fails("no checkpoint at", function()
    train{model = model, data = data, config = config(nil, {resume = dir .. "/nowhere"}), quiet = true}
  end)
  local run_dir = dir .. "/run_sgd"
  train{model = model, data = data, config = config(run_dir, {optimizer = "sgd"}), quiet = true, until_step = 1}
  model, data = setup(4)
  fails("optimizer is 'sgd'", function()
    train{model = model, data = data, config = config(run_dir, {resume = "auto"}), quiet = true}
  end)
end)

test("resume=auto: no checkpoint starts fresh and says so; none readable stops and lists each; fresh starts over",
function()
  local model, data = setup(5)
  local run_dir = dir .. "/run_unreadable"
  local log_path = dir .. "/auto.log"
  local log = assert(io.open(log_path, "w"))
  train{model = model, data = data, config = config(run_dir, {resume = "auto", ckpt_every = 2}), out = log,
        until_step = 4}
  log:close()
  local said = assert(io.open(log_path)):read("*a")
  assert(said:find("resume=auto: no checkpoint under " .. run_dir .. "/ckpt; starting from step 1", 1, true), said)
  local steps = {}
  for _, name in ipairs {"step_000002", "step_000004"} do
    local manifest = run_dir .. "/ckpt/" .. name .. "/manifest.json"
    local f = assert(io.open(manifest, "w")) -- a manifest this lutra cannot read
    f:write('{"format": "lutra-checkpoint", "version": 999}')
    f:close()
    steps[#steps + 1] = manifest
  end
  model, data = setup(5)
  local ok, err = pcall(train, {model = model, data = data, config = config(run_dir, {resume = "auto", ckpt_every = 2}),
                               quiet = true})
  assert(not ok, "resume=auto trained over unreadable checkpoints")
  err = tostring(err)
  assert(err:find("resume=auto: 2 checkpoints under " .. run_dir .. "/ckpt, none readable", 1, true), err)
  assert(err:find(run_dir .. "/ckpt/step_000002: ", 1, true) and err:find(run_dir .. "/ckpt/step_000004: ", 1, true), err)
  assert(err:find("--resume=fresh", 1, true), err)
  for _, manifest in ipairs(steps) do -- left as they were: nothing saved over them, nothing pruned
    equal(assert(io.open(manifest)):read("*a"), '{"format": "lutra-checkpoint", "version": 999}')
  end
  model, data = setup(5)
  local r = train{model = model, data = data, config = config(run_dir, {resume = "fresh"}), quiet = true, until_step = 1}
  equal(#r.losses, 1) -- started at step 1
end)

test("settings out of range or not finite are refused before anything runs, naming the key", function()
  local model, data = setup(6)
  for _, case in ipairs {
    {{lr = math.huge}, "config.lr must be a finite number >= 0, got inf"},
    {{lr = 0 / 0}, "config.lr must be a finite number >= 0, got"},
    {{grad_clip = 0 / 0}, "config.grad_clip must be a finite number >= 0"},
    {{top_p = 2}, "config.top_p must be a finite number in [0, 1], got 2"},
    {{eval_every = -1}, "config.eval_every must be a finite number >= 0, got -1"},
    {{ckpt_keep = -1}, "config.ckpt_keep must be a finite number >= 0, got -1"},
    {{temperature = -0.5}, "config.temperature must be a finite number >= 0"},
    {{betas = {0.9, 1}}, "config.betas[2] must be below 1, got 1"},
    {{betas = {0.9, 1.5}}, "config.betas[2] must be a finite number in [0, 1], got 1.5"},
    {{betas = {0.9}}, "config.betas must be a list of two numbers"},
  } do
    fails(case[2], function() train{model = model, data = data, config = config(nil, case[1]), quiet = true} end)
  end
end)

test("cleanup", function() os.execute("rm -rf " .. dir) end)
