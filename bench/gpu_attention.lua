-- bench/gpu_attention.lua — flash attention on CUDA through lutra's API next to PyTorch's
-- scaled_dot_product_attention, in one run.
--   lutra bench/gpu_attention.lua [--B 8] [--H 12] [--T 1024] [--D 64] [--dtype bf16] [--iters 20]
--                                 [--no-causal] [--no-torch]
-- Times lt_attention_forward and lt_attention_backward (q, k, v (B, T, H, D), causal) on cuda:0
-- with CUDA events around each call, median of --iters calls after warm-up, then runs
-- bench/gpu_attention_torch.py on the same problem (same process machine, same GPU) and prints
-- both in ms and TFLOP/s with the ratio lutra / torch. FLOPs: forward 4 B H T S D (halved when
-- causal), backward 2.5x the forward (FlashAttention's convention).
-- Exits 77 (skipped) when there is no GPU.
local lt = require "lutra"
local ffi = require "ffi"
local C = lt.C

local opt = {B = 8, H = 12, T = 1024, D = 64, dtype = "bf16", iters = 20, causal = true, torch = true}
local i = 1
while i <= #arg do
  local a = arg[i]
  local key = a:match("^%-%-(%w+)$")
  if a == "--no-causal" then
    opt.causal = false
  elseif a == "--no-torch" then
    opt.torch = false
  elseif key and opt[key] ~= nil and arg[i + 1] then
    opt[key] = key == "dtype" and arg[i + 1] or tonumber(arg[i + 1])
    i = i + 1
  else
    io.stderr:write("gpu_attention: unknown argument '", a, "'\n")
    os.exit(2)
  end
  i = i + 1
end

if C.lt_cuda_device_count() == 0 then
  print("gpu_attention: skipped: no CUDA device (" .. ffi.string(C.lt_cuda_status()) .. ")")
  os.exit(77)
end

local function check(rc)
  if rc ~= 0 then error(ffi.string(C.lt_last_error()), 2) end
end
local function median(xs)
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) / 2] or (xs[n / 2] + xs[n / 2 + 1]) / 2
end

local B, H, T, D = opt.B, opt.H, opt.T, opt.D
local causal, scale = opt.causal and 1 or 0, 1 / math.sqrt(D)
local dev = "cuda:0"
local function randn(shape) return lt.randn(shape, {dtype = opt.dtype}):to(dev) end
local q, k, v, dout = randn({B, T, H, D}), randn({B, T, H, D}), randn({B, T, H, D}), randn({B, T, H, D})
local out = lt.empty({B, T, H, D}, {dtype = opt.dtype, device = dev})
local lse = lt.empty({B, H, T}, {dtype = "f32", device = dev})
local dq, dk, dv = lt.empty_like(q), lt.empty_like(k), lt.empty_like(v)

local function forward() check(C.lt_attention_forward(out, lse, q, k, v, nil, scale, causal, 0)) end
local function backward() check(C.lt_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, nil, scale, causal, 0)) end

-- median milliseconds of f over opt.iters calls, each between two events on the compute stream
local function time_ms(f)
  for _ = 1, 3 do f() end
  local times = {}
  local e0, e1 = lt.cuda.event(), lt.cuda.event()
  for it = 1, opt.iters do
    e0:record(0, "compute")
    f()
    e1:record(0, "compute")
    e1:synchronize()
    times[it] = e0:elapsed(e1)
  end
  return median(times)
end

local fwd_flops = 4 * B * H * T * T * D * (opt.causal and 0.5 or 1)
local bwd_flops = 2.5 * fwd_flops
local fwd_ms, bwd_ms = time_ms(forward), time_ms(backward)
local function tflops(flops, ms) return flops / (ms * 1e-3) / 1e12 end

print(string.format("gpu_attention: B=%d H=%d T=%d D=%d %s %s, median of %d; %s", B, H, T, D, opt.dtype,
                    opt.causal and "causal" or "full", opt.iters, ffi.string(C.lt_cuda_status())))

-- the peer: same shapes, same GPU, after lutra's run (its memory stays cached in this process)
local torch = nil
if opt.torch then
  local dir = arg[0]:match("^(.*)/[^/]*$") or "."
  local cmd = string.format("python3 %s/gpu_attention_torch.py --B %d --H %d --T %d --D %d --dtype %s --iters %d%s 2>&1",
                            dir, B, H, T, D, opt.dtype, opt.iters, opt.causal and "" or " --no-causal")
  local p = io.popen(cmd)
  local text = p:read("*a")
  p:close()
  local f, b = text:match("torch_fwd_ms=([%d%.]+)%s+torch_bwd_ms=([%d%.]+)")
  if f then
    torch = {fwd = tonumber(f), bwd = tonumber(b)}
  else
    print("gpu_attention: PyTorch peer did not run: " .. (text:gsub("%s+$", "")))
  end
end

print(string.format("%-10s %10s %10s %10s %10s %8s", "pass", "lutra ms", "TFLOP/s", "torch ms", "TFLOP/s", "ratio"))
for _, row in ipairs {{"forward", fwd_ms, fwd_flops, torch and torch.fwd}, {"backward", bwd_ms, bwd_flops, torch and torch.bwd},
                      {"fwd+bwd", fwd_ms + bwd_ms, fwd_flops + bwd_flops, torch and torch.fwd + torch.bwd}} do
  local name, ms, flops, tms = row[1], row[2], row[3], row[4]
  if tms then
    print(string.format("%-10s %10.3f %10.1f %10.3f %10.1f %8.3f", name, ms, tflops(flops, ms), tms, tflops(flops, tms),
                        tms / ms))
  else
    print(string.format("%-10s %10.3f %10.1f %10s %10s %8s", name, ms, tflops(flops, ms), "-", "-", "-"))
  end
end
print("ratio: lutra's rate / torch's rate (torch ms / lutra ms); > 1 means lutra is faster")
