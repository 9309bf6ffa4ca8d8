-- bench/scaling.lua — training tokens/s of one model at dp = 1, 2, ... ranks on this machine.
--
--   ./build/lutra bench/scaling.lua [--ranks=1,2] [--steps=30] [--layer=4] [--dim=128] [--batch=16]
--
-- Runs the same training job (gpt2, synthetic word corpus, the same global batch) under
-- `lutra launch -n K` for each K, each rank with cores / K threads, and prints the median
-- tokens/s of the training steps (the first 3 steps are warmup) side by side with the
-- dp = 1 figure. A rank prints "RESULT tokens_per_s=..." for the driver to read.
local lt = require "lutra"

local opts = {ranks = "1,2", steps = 30, layer = 4, dim = 128, batch = 16, seq = 64, worker = false}
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^%-%-([%w_]+)=(.*)$")
  if k == nil and a == "--worker" then k, v = "worker", "true" end
  if k == nil or opts[k] == nil then
    io.stderr:write("scaling: unknown argument '", a, "'\n")
    os.exit(2)
  end
  opts[k] = type(opts[k]) == "number" and tonumber(v) or v
end

local function corpus(path)
  local words = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home", "over", "hill"}
  require("lutra.testing").word_corpus(path, words, 200000, 12345)
end

if opts.worker ~= false then
  local mesh = lt.dist.init{dp = "auto"}
  local path = string.format("%s/lutra_scaling_%d.txt", os.getenv("TMPDIR") or "/tmp", mesh.rank)
  corpus(path)
  local tok = lt.tokenizer.char(assert(io.open(path)):read("*a"))
  local data = lt.data.text(path, tok, {seq_len = opts.seq, batch = opts.batch, seed = 1, cache = path .. ".bin",
                                        quiet = true})
  lt.manual_seed(1)
  local model = lt.models.build{arch = "gpt2", n_layer = opts.layer, n_head = 4, d_model = opts.dim,
                                vocab_size = tok.vocab_size, block_size = opts.seq}
  local times = {}
  lt.train{model = model, data = data, quiet = true, no_interrupt = true,
           config = {steps = opts.steps, lr = 1e-3, warmup = 0, eval_every = 0, run_dir = "",
                     parallel = {dp = "auto"}},
           log = function(r) times[#times + 1] = r.step_ms end}
  local steady = {}
  for i = 4, #times do steady[#steady + 1] = times[i] end
  table.sort(steady)
  local median_ms = steady[math.floor((#steady + 1) / 2)]
  if mesh.rank == 0 then
    print(string.format("RESULT tokens_per_s=%.1f step_ms=%.2f", opts.batch * opts.seq / (median_ms / 1000), median_ms))
  end
  os.remove(path)
  os.remove(path .. ".bin")
  return
end

-- the driver
local exe = "lutra"
local f = io.popen("readlink -f /proc/$PPID/exe 2>/dev/null")
exe = f and f:read("*l") or exe
if f then f:close() end
local script = arg[0]
local rows, base = {}, nil
print(string.format("scaling: gpt2 %d layers, d_model %d, global batch %d x %d tokens, %d steps (median of steps 4..)",
  opts.layer, opts.dim, opts.batch, opts.seq, opts.steps))
print(string.format("%6s %14s %10s %8s", "ranks", "tokens/s", "step ms", "vs dp=1"))
for k in tostring(opts.ranks):gmatch("%d+") do
  local cmd = string.format("%s launch -n %s %s --worker --steps=%d --layer=%d --dim=%d --batch=%d --seq=%d 2>&1", exe,
    k, script, opts.steps, opts.layer, opts.dim, opts.batch, opts.seq)
  local p = assert(io.popen(cmd))
  local out = p:read("*a")
  p:close()
  local tps, ms = out:match("RESULT tokens_per_s=([%d%.]+) step_ms=([%d%.]+)")
  if not tps then
    io.stderr:write("scaling: the run with ", k, " ranks failed:\n", out, "\n")
    os.exit(1)
  end
  tps, ms = tonumber(tps), tonumber(ms)
  base = base or tps
  print(string.format("%6s %14.0f %10.2f %7.2fx", k, tps, ms, tps / base))
end
