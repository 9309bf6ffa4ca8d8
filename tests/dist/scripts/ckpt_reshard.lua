-- The jobs of the resharding matrix (tests/dist/test_ckpt_reshard.sh), under `lutra launch`
-- or alone; small gpt2 in f64 on the corpus of ckpt_train.lua:
--   lutra ckpt_reshard.lua save DIR LAYOUT
--       4 steps under LAYOUT, a checkpoint at step 4 in DIR/run; the state it saved
--       (gathered whole) in DIR/saved.*
--   lutra ckpt_reshard.lua load NAME LAYOUT DIR...
--       for each DIR: that checkpoint loaded under LAYOUT, nothing run, its state gathered
--       into DIR/NAME.loaded.*; then loaded again and trained to step 8: the parameters in
--       DIR/NAME.final.safetensors, the losses of steps 5-8 in DIR/NAME.losses
--   lutra ckpt_reshard.lua straight OUT_PREFIX
--       one process, 8 steps straight: OUT_PREFIX.final.safetensors, OUT_PREFIX.losses
-- A state dump: PREFIX.safetensors (every parameter and optimizer tensor, whole, f64: bitwise
-- the owners' values) and PREFIX.r<rank>.json (step, RNG, loader position and the optimizer's
-- numbers as this rank holds them). LAYOUT: "single" or "dp=2,tp=2,zero=1,...".
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local json = require "lutra.json"
local testing = require "lutra.testing"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local H = dofile(here .. "../layout_helpers.lua")

local mode = arg[1]
local world = comm.init()
local rank = comm.rank()

local path = string.format("%s/reshard_corpus_%d.txt", os.getenv("TMPDIR") or "/tmp", rank)
testing.word_corpus(path, {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home"}, 4000,
  12345)
local tok = lt.tokenizer.char(assert(io.open(path)):read("*a"))
local cfg = {arch = "gpt2", n_layer = 2, n_head = 4, d_model = 32, vocab_size = tok.vocab_size, block_size = 16,
             dropout = 0, dtype = "f64"}

local function parallel_of(layout)
  if layout == "single" then return nil end
  local parallel = {bucket_mb = 0.001}
  for k, v in layout:gmatch("(%w+)=(%w+)") do parallel[k] = tonumber(v) or v end
  return parallel
end

-- The loader, already cut to this rank's rows (so that its restored position can be read
-- here: the trainer keeps a loader it is given with dp_size set).
local function loader(parallel)
  local data = lt.data.text(path, tok, {seq_len = 16, batch = 8, seed = 3, cache = path .. ".bin", quiet = true})
  if parallel then
    local mesh = lt.dist.init(parallel)
    if mesh.dp_size > 1 then data = data:with{dp_rank = mesh.dp_rank, dp_size = mesh.dp_size} end
  end
  return data
end

local function run(parallel, steps, run_dir, resume)
  lt.manual_seed(7)
  local model = lt.models.build(cfg)
  local data = loader(parallel)
  local losses = {}
  local r = lt.train{model = model, data = data, quiet = true, no_interrupt = true,
                     config = {steps = steps, lr = 1e-2, warmup = 0, schedule = "constant", grad_clip = 1.0,
                               weight_decay = 0.1, eval_every = 0, run_dir = run_dir or "", ckpt_every = 4,
                               parallel = parallel, resume = resume, model = cfg},
                     log = function(rec) if rec.loss then losses[rec.step] = rec.loss end end}
  return r, model, data, losses
end

local function model_and_opt(r, model)
  if r.parallel then return r.parallel.model, r.parallel.optimizer end
  return model, r.optimizer
end

local function dump(prefix, r, model, data)
  local m, opt = model_and_opt(r, model)
  local tensors, names, numbers = H.gather_state(m, opt, world)
  if rank == 0 then
    local out = {}
    for _, name in ipairs(names) do out[name] = tensors[name] end
    lt.safetensors.save(prefix .. ".safetensors", out)
  end
  local rng = lt.get_rng_state()
  json.write_file(string.format("%s.r%d.json", prefix, rank),
    {step = r.step, rng = {seed = tostring(rng.seed), offset = tostring(rng.offset)}, loader = data:state(),
     optim = numbers and {steps = numbers.steps, kind = numbers.kind, numbers = numbers.numbers} or json.null})
  world:barrier()
end

local function write_final(prefix, r, model, losses, from)
  local m = model_and_opt(r, model)
  local names, shapes = {}, {}
  lt.manual_seed(7)
  for name, p in lt.models.build(cfg):named_parameters() do names[#names + 1], shapes[name] = name, p end
  local full
  if r.parallel then full = H.gather(r.parallel, names, shapes, world) else
    full = {}
    for name, p in m:named_parameters() do full[name] = p:double() end
  end
  if rank == 0 then
    lt.safetensors.save(prefix .. ".final.safetensors", full)
    local f = assert(io.open(prefix .. ".losses", "w"))
    for s = from, 8 do f:write(string.format("%d %.17g\n", s, assert(losses[s], "no loss for step " .. s))) end
    f:close()
  end
  world:barrier()
end

if mode == "save" then
  local dir, layout = arg[2], arg[3]
  local parallel = parallel_of(layout)
  local r, model, data = run(parallel, 4, dir .. "/run")
  dump(dir .. "/saved", r, model, data)
elseif mode == "load" then
  local name, layout = arg[2], arg[3]
  local parallel = parallel_of(layout)
  for i = 4, #arg do
    local dir = arg[i]
    local ckpt = dir .. "/run/ckpt/step_000004"
    local r, model, data = run(parallel, 4, nil, ckpt)
    assert(r.step == 4, "the resumed run should stand at step 4, not " .. r.step)
    dump(string.format("%s/%s.loaded", dir, name), r, model, data)
    local r2, model2, _, losses = run(parallel, 8, nil, ckpt)
    write_final(string.format("%s/%s", dir, name), r2, model2, losses, 5)
  end
elseif mode == "straight" then
  local r, model, _, losses = run(nil, 8)
  write_final(arg[2], r, model, losses, 1)
else
  error("usage: ckpt_reshard.lua save DIR LAYOUT | load NAME LAYOUT DIR... | straight OUT_PREFIX")
end
