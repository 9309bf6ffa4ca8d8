-- bench/precision.lua — training-step throughput of lutra.train's config.precision
-- ("fp32", "bf16", "fp16") on the device at hand, and how far the losses part.
--   lutra bench/precision.lua [--arch gpt2|llama] [--layers 4] [--dim 128] [--seq 64] [--batch 12]
--                             [--rounds 7] [--steps 10] [--device cpu|cuda]
-- Three models from one seed, one per precision, are trained on the same random batches in
-- interleaved blocks (round r: `steps` steps of each precision in turn, the order rotating),
-- so that the load of a shared machine weighs on all alike. Printed per precision: the
-- median block's tokens/s, its ratio to fp32, and the loss after all rounds next to fp32's.
-- On a CPU bf16/f16 are emulated (stored 16-bit, computed in f32), so they are not faster there;
-- f16's conversions are done in software (see the note in the report of issue 4).
local lt = require "lutra"
local train = require "lutra.train"
local util = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/util.lua")
local now, median = util.now, util.median

local opts = {arch = "gpt2", layers = 4, dim = 128, seq = 64, batch = 12, rounds = 7, steps = 10, device = "cpu",
              vocab = 128}
for i = 1, #arg, 2 do
  local k = arg[i]:match("^%-%-(.*)$")
  if not k or opts[k] == nil then error("precision bench: unknown option " .. tostring(arg[i])) end
  opts[k] = tonumber(arg[i + 1]) or arg[i + 1]
end

local precisions = {"fp32", "bf16", "fp16"}
local runs = {}
for _, prec in ipairs(precisions) do
  lt.manual_seed(1)
  local model = lt.models.build{arch = opts.arch, n_layer = opts.layers, n_head = 4, d_model = opts.dim,
                                vocab_size = opts.vocab, block_size = opts.seq, device = opts.device}
  -- the same random batches for every precision
  local L = {pos = 0}
  function L:next()
    lt.manual_seed(1000 + self.pos % 8) -- 8 batches again and again: a loss that falls
    self.pos = self.pos + 1
    local w = lt.randint(0, opts.vocab, {opts.batch, opts.seq + 1}, {device = opts.device})
    return w:narrow(1, 0, opts.seq):contiguous(), w:narrow(1, 1, opts.seq):contiguous()
  end
  function L:state() return {pos = self.pos} end
  function L:set_state(s) self.pos = s.pos end
  runs[prec] = {model = model, data = L, rates = {}, optimizer = nil}
end

local total = opts.rounds * opts.steps
for r = 1, opts.rounds do
  for j = 0, #precisions - 1 do
    local prec = precisions[(r + j) % #precisions + 1]
    local run = runs[prec]
    local t0 = now()
    -- a block: `steps` more steps of the same model, optimizer and loader (constant lr)
    local res = train{model = run.model, data = run.data, optimizer = run.optimizer, quiet = true, no_interrupt = true,
                      config = {steps = opts.steps, precision = prec, lr = 1e-3, warmup = 0, schedule = "constant",
                                eval_every = 0, run_dir = ""}}
    run.optimizer = res.optimizer
    run.rates[#run.rates + 1] = res.tokens / res.train_seconds
    run.loss = res.loss
    run.seconds = (run.seconds or 0) + (now() - t0)
  end
end

print(string.format("%s, %d layers, dim %d, seq %d, batch %d, %s: %d rounds of %d steps", opts.arch, opts.layers,
  opts.dim, opts.seq, opts.batch, opts.device, opts.rounds, opts.steps))
local base = median(runs.fp32.rates)
for _, prec in ipairs(precisions) do
  local run = runs[prec]
  local rate = median(run.rates)
  print(string.format("  %-5s %9.0f tokens/s  %.2fx fp32   loss after %d steps %.4f (fp32 %.4f)", prec, rate,
    rate / base, total, run.loss, runs.fp32.loss))
end
