-- bench/gpt_step.lua — one GPT-2 training step, timed: the same model, step and options
-- as ../shared/peers/torch_gpt.py (GPT-2 block: pre-LayerNorm, causal MHA, GELU MLP 4x,
-- tied embeddings, learned positions; AdamW lr 3e-4, wd 0.1 on every parameter, as the
-- peer; fp32; random tokens).
--   lutra bench/gpt_step.lua [--layers 4] [--heads 4] [--dim 256] [--seq 256] [--vocab 4096]
--                            [--batch 8] [--steps 8] [--warmup 2] [--threads 2] [--verbose 1]
--                            [--gpu 1] [--bf16 1]
-- --gpu 1 runs on cuda:0 (the peer's --device cuda); --bf16 1 computes in bf16 autocast with
-- f32 master weights (the peer's --bf16: torch.autocast).
-- Prints: params=<int> tokens_per_s=<float> tflops=<float> peak_rss_mb=<float>
-- (peak RSS is getrusage's ru_maxrss of this process, as the peer reports it). --verbose 1
-- adds the first and last losses and the tensor memory figures (lutra.memory_stats: peak,
-- reserved) on stderr.
local lt = require "lutra"
local ffi = require "ffi"

local util = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/util.lua")
local a = util.options({layers = 4, heads = 4, dim = 256, seq = 256, vocab = 4096, batch = 8, steps = 8, warmup = 2,
                        threads = 2, verbose = 0, gpu = 0, bf16 = 0}, "gpt_step")

ffi.cdef [[
struct lt_bench_rusage { long utime[2]; long stime[2]; long maxrss; long rest[13]; };
int getrusage(int who, struct lt_bench_rusage *usage);
]]
local now = util.now
local function peak_rss_mb()
  local ru = ffi.new("struct lt_bench_rusage")
  ffi.C.getrusage(0, ru) -- RUSAGE_SELF; ru_maxrss in KiB on Linux
  return tonumber(ru.maxrss) / 1024
end

local setup = util.gpt_setup(a, "gpt_step")
local model, params, opt, idx, tgt, device = setup.model, setup.params, setup.opt, setup.idx, setup.tgt, setup.device
local autocast = a.bf16 ~= 0 and "bf16" or nil
local function forward(x, y) return lt.autocast(autocast, model.forward, model, x, y) end

local function step()
  -- set_to_none, as the peer; the old gradients' memory comes back now (PyTorch frees them
  -- once unreferenced; here the GC would, later)
  for _, p in ipairs(params) do
    if p.grad ~= nil then p.grad:free() end
  end
  opt:zero_grad(true)
  local loss = lt.tidy(function()
    local logits, loss = forward(idx, tgt)
    logits:free() -- unused here (the peer's model returns only the loss); backward frees its saved copy
    loss:backward()
    return loss:item()
  end)
  opt:step()
  return loss
end

local first_loss, last_loss
for i = 1, a.warmup do
  local l = step()
  if i == 1 then first_loss = l end
end
if a.gpu ~= 0 then lt.cuda.synchronize(device) end
local t0 = now()
for _ = 1, a.steps do last_loss = step() end
if a.gpu ~= 0 then lt.cuda.synchronize(device) end
local dt = now() - t0

local nparams = 0
for _, p in ipairs(params) do nparams = nparams + p:numel() end
local tps = a.batch * a.seq * a.steps / dt
-- model FLOPs per token, as the peer counts them: 6N (N without the position table) + 12 L T d
local flops_tok = 6 * (nparams - a.seq * a.dim) + 12 * a.layers * a.seq * a.dim
if a.verbose ~= 0 then
  local st = lt.memory_stats()
  io.stderr:write(string.format("loss %.4f (first) -> %.4f (last); ", first_loss or 0, last_loss or 0))
  io.stderr:write(string.format("tensors: peak %.1f MB, allocated %.1f MB, reserved %.1f MB, %d allocations\n",
    st.peak / 2 ^ 20, st.allocated / 2 ^ 20, st.reserved / 2 ^ 20, st.num_allocs))
end
local extra = ""
if a.gpu ~= 0 then extra = string.format(" peak_gpu_mb=%.1f", lt.cuda.memory_stats(device).peak / 2 ^ 20) end
print(string.format("params=%d tokens_per_s=%.1f tflops=%.3f peak_rss_mb=%.1f%s", nparams, tps,
  tps * flops_tok / 1e12, peak_rss_mb(), extra))
