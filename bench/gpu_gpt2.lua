-- bench/gpu_gpt2.lua — a GPT-2 124M training step on one GPU: lutra against PyTorch eager and
-- torch.compile, the same model and step (../shared/peers/torch_gpt.py, --device cuda --sdpa
-- --bf16 [--compile]), runs alternating in one invocation; medians and ratios, and MFU.
--   lutra bench/gpu_gpt2.lua [--runs 3] [--batch 16] [--seq 1024] [--steps 20] [--fp32]
-- The defaults are issue 4's: 12 layers, 12 heads, 768 dim, seq 1024, vocab 50304, bf16, batch 16,
-- AdamW, 20 steps after the peer's 2 warmup steps; the goal is >= 1.0x torch.compile's tokens/s
-- at no more peak memory, and MFU >= 50% of 989 TFLOP/s.
-- The lutra side is bench/gpt_step.lua --gpu 1 --bf16 1 (a child process, as the peer is).
-- Environment: TORCH_GPT (the peer script; default ../shared/peers/torch_gpt.py, else
-- .gpu/peers/torch_gpt.py), PYTHON (default python3), PEAK_TFLOPS (the GPU's dense bf16
-- peak for MFU; default 989 = H100/H200 SXM).
local ffi = require "ffi"
local lt = require "lutra"

local opts = {runs = 3, batch = 16, seq = 1024, steps = 20, fp32 = false}
local i = 1
while i <= #arg do
  local key = arg[i]:match("^%-%-(%w+)$")
  if key == "fp32" then
    opts.fp32 = true
  elseif key and opts[key] ~= nil and tonumber(arg[i + 1]) then
    opts[key] = tonumber(arg[i + 1])
    i = i + 1
  else
    io.stderr:write("gpu_gpt2: bad argument '", tostring(arg[i]), "'\n")
    os.exit(2)
  end
  i = i + 1
end

if not lt.cuda.is_available() then
  print("gpu_gpt2: skipped: no CUDA device (" .. lt.cuda.status() .. ")")
  os.exit(0)
end

ffi.cdef "long readlink(const char *path, char *buf, size_t size);"
local function self_exe()
  local buf = ffi.new("char[4096]")
  local n = ffi.C.readlink("/proc/self/exe", buf, 4096)
  return n > 0 and ffi.string(buf, n) or "lutra"
end
local function exists(p)
  local f = io.open(p)
  if f then f:close() end
  return f ~= nil
end

local here = arg[0]:match("^(.*)/[^/]*$") or "."
local peer = os.getenv("TORCH_GPT")
for _, p in ipairs {here .. "/../../shared/peers/torch_gpt.py", here .. "/../.gpu/peers/torch_gpt.py"} do
  if not peer and exists(p) then peer = p end
end
local python = os.getenv("PYTHON") or "python3"
local peak = tonumber(os.getenv("PEAK_TFLOPS") or "989")

local shape = string.format("--layers 12 --heads 12 --dim 768 --vocab 50304 --seq %d --batch %d --steps %d --warmup 2",
                            opts.seq, opts.batch, opts.steps)
local contenders = {
  {name = "lutra", cmd = string.format("%s %s/gpt_step.lua --gpu 1 --bf16 %d %s", self_exe(), here,
                                       opts.fp32 and 0 or 1, shape)},
}
if peer then
  local bf16 = opts.fp32 and "" or " --bf16"
  contenders[2] = {name = "torch eager", cmd = string.format("%s %s --device cuda --sdpa%s %s", python, peer, bf16, shape)}
  contenders[3] = {name = "torch compile",
                   cmd = string.format("%s %s --device cuda --sdpa --compile%s %s", python, peer, bf16, shape)}
else
  print("gpu_gpt2: no peer script (set TORCH_GPT): lutra alone")
end

local function run(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("*a")
  p:close()
  return tonumber(out:match("tokens_per_s=([%d.]+)")), tonumber(out:match("tflops=([%d.]+)")),
         out:match("peak_gpu_mb=([%d.]+)"), out
end

print(string.format("GPT-2 124M, batch %d x seq %d, %s, %d steps after 2 warmup, %d runs alternating",
                    opts.batch, opts.seq, opts.fp32 and "fp32" or "bf16 autocast", opts.steps, opts.runs))
local results = {}
for r = 1, opts.runs do
  for _, c in ipairs(contenders) do
    local tps, tflops, mem, out = run(c.cmd)
    if not tps then
      print(string.format("  run %d %-14s FAILED:\n%s", r, c.name, out:sub(-1500)))
    else
      results[c.name] = results[c.name] or {}
      table.insert(results[c.name], {tps = tps, tflops = tflops, mem = mem})
      print(string.format("  run %d %-14s %10.0f tok/s  %7.1f TFLOP/s  peak %s MB", r, c.name, tps, tflops, mem or "?"))
    end
  end
end

local function median(list, key)
  local v = {}
  for k, x in ipairs(list) do v[k] = x[key] end
  table.sort(v)
  return v[math.floor((#v + 1) / 2)]
end
local ours = results.lutra and median(results.lutra, "tps")
print(string.format("%-14s %12s %10s %6s %12s %10s", "", "tok/s (med)", "TFLOP/s", "MFU", "peak GPU MB", "lutra/x"))
for _, c in ipairs(contenders) do
  local list = results[c.name]
  if list then
    local tps, tf = median(list, "tps"), median(list, "tflops")
    print(string.format("%-14s %12.0f %10.1f %5.1f%% %12s %10s", c.name, tps, tf, 100 * tf / peak,
                        list[1].mem or "?", ours and string.format("%.2fx", ours / tps) or "-"))
  end
end
