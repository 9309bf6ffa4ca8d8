-- A small training job (f64) for the checkpoint tests (tests/dist/test_ckpt_*.sh), run under
-- mpirun / lutra launch or alone:
--   lutra ckpt_train.lua RUN_DIR OUT.safetensors STEPS LAYOUT [UNTIL] [ARCH]
-- LAYOUT: "single" or "dp=2,tp=2,zero=1,..." (config.parallel); UNTIL: stop (and save) after
-- that step; a run dir with checkpoints resumes from the latest valid one. Rank 0 prints
-- "loss STEP VALUE" for every step it ran and writes the whole parameters (gathered from
-- the layout's pieces) to OUT.safetensors at the end.
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local testing = require "lutra.testing"
local helpers = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../layout_helpers.lua")

local run_dir, out, steps, layout, until_step, arch = arg[1], arg[2], tonumber(arg[3]), arg[4], tonumber(arg[5] or ""),
  arg[6] or "gpt2"
local world = comm.init()
local parallel = nil
if layout ~= "single" then
  parallel = {bucket_mb = 0.001}
  for k, v in layout:gmatch("(%w+)=(%w+)") do parallel[k] = tonumber(v) or v end
end
local path = string.format("%s/corpus_%d.txt", os.getenv("TMPDIR") or "/tmp", comm.rank())
testing.word_corpus(path, {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home"}, 4000,
  12345)
local tok = lt.tokenizer.char(assert(io.open(path)):read("*a"))
local data = lt.data.text(path, tok, {seq_len = 16, batch = 8, seed = 3, cache = path .. ".bin", quiet = true})
local cfg = {arch = arch, n_layer = 4, n_head = 4, n_kv_head = arch == "llama" and 2 or 4, d_model = 32,
             vocab_size = tok.vocab_size, block_size = 16, dropout = 0, dtype = "f64"}
lt.manual_seed(7)
local model = lt.models.build(cfg)
local names, shapes = {}, {}
do -- the global names and shapes, from an unparallelized twin
  lt.manual_seed(7)
  for name, p in lt.models.build(cfg):named_parameters() do names[#names + 1], shapes[name] = name, p end
end
local r = lt.train{model = model, data = data, quiet = true, no_interrupt = true, until_step = until_step,
                   config = {steps = steps, lr = 1e-2, warmup = 0, schedule = "constant", grad_clip = 1.0,
                             weight_decay = 0.1, eval_every = 0, run_dir = run_dir, ckpt_every = 1, ckpt_keep = 3,
                             parallel = parallel, resume = "auto", model = cfg},
                   log = function(rec)
                     if rec.loss and comm.rank() == 0 then print(string.format("loss %d %.17g", rec.step, rec.loss)) end
                   end}
local full
if r.parallel then
  full = helpers.gather(r.parallel, names, shapes, world)
else
  full = {}
  for name, p in model:named_parameters() do full[name] = p:double() end
end
if comm.rank() == 0 then lt.safetensors.save(out, full) end
world:barrier()
