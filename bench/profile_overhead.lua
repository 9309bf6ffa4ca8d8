-- bench/profile_overhead.lua — what lutra.profile costs: the GPT step of bench/gpt_step.lua (GPT-2
-- block, AdamW, fp32, random tokens) timed never profiled, profiled, and after profiling stopped
-- (the op tables restored); the median over --runs runs of --steps steps each, then the ratios,
-- then the profiler's top table of the profiled steps.
--   lutra bench/profile_overhead.lua [--layers 4] [--heads 4] [--dim 256] [--seq 256] [--vocab 4096]
--                                    [--batch 8] [--steps 3] [--runs 5] [--threads 2] [--gpu 1] [--sync 1]
-- Prints: off_ms=<median> on_ms=<median> off_again_ms=<median> on_ratio=<on/off> off_again_ratio=<..>
-- Goal: on_ratio < 1.10, off_again_ratio ~ 1.00.
local lt = require "lutra"

local util = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/util.lua")
local a = util.options({layers = 4, heads = 4, dim = 256, seq = 256, vocab = 4096, batch = 8, steps = 3, runs = 5,
                        threads = 2, gpu = 0, sync = 0, top = 20}, "profile_overhead")
local now = util.now

local setup = util.gpt_setup(a, "profile_overhead")
local model, params, opt, idx, tgt, device = setup.model, setup.params, setup.opt, setup.idx, setup.tgt, setup.device

local function step()
  for _, p in ipairs(params) do
    if p.grad ~= nil then p.grad:free() end
  end
  opt:zero_grad(true)
  lt.tidy(function()
    local logits, loss = model:forward(idx, tgt)
    logits:free()
    loss:backward()
  end)
  opt:step()
end

local function sync()
  if a.gpu ~= 0 then lt.cuda.synchronize(device) end
end

-- The median milliseconds per step over a.runs runs of a.steps steps.
local function timed()
  local ms = {}
  for r = 1, a.runs do
    sync()
    local t0 = now()
    for _ = 1, a.steps do step() end
    sync()
    ms[r] = (now() - t0) * 1e3 / a.steps
  end
  return util.median(ms)
end

for _ = 1, 2 do step() end -- warmup: traces, the allocator's blocks
local off = timed()

local prof = lt.profile.start{sync = a.sync ~= 0}
step() -- the wrappers' traces
local on = timed()
prof:stop()

for _ = 1, 2 do step() end -- the same warmup as before the first measure
local off_again = timed()

print(string.format("off_ms=%.2f on_ms=%.2f off_again_ms=%.2f on_ratio=%.3f off_again_ratio=%.3f events_per_step=%.0f",
  off, on, off_again, on / off, off_again / off, #prof.events / (1 + a.steps * a.runs)))
print(prof:table{sort_by = "self_ms", top = a.top})
