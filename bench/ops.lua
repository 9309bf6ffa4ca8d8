-- bench/ops.lua — figures for the tensor core, side by side with the peers in one run.
--   lutra bench/ops.lua [--peer PATH/torch_overhead.py] [--reps N]
-- Prints: matmul GFLOP/s at 1024^3 f32 (lutra vs cblas_sgemm called directly),
-- GB/s of add and softmax on 16M f32 elements, and the cost of a tiny op from Lua
-- next to PyTorch eager's (the peer script, run with /usr/bin/python3).
local lt = require "lutra"
local ffi = require "ffi"

local peer = "../shared/peers/torch_overhead.py"
local reps = 7
for i = 1, #arg do
  if arg[i] == "--peer" then peer = arg[i + 1] end
  if arg[i] == "--reps" then reps = tonumber(arg[i + 1]) end
end

ffi.cdef [[
void openblas_set_num_threads(int n);
int openblas_get_num_threads(void);
void cblas_sgemm(int order, int transa, int transb, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc);
]]
local util = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/util.lua")
local now, median = util.now, util.median

-- Median seconds of fn() over `reps` timed runs after one warm-up.
local function time_median(fn, n)
  fn()
  local xs = {}
  for r = 1, n or reps do
    local t0 = now()
    fn()
    xs[r] = now() - t0
  end
  return median(xs)
end

print(string.format("lutra %s, %d threads", lt.version or "?", lt.get_num_threads and lt.get_num_threads() or 0))

-- Per-op overhead from Lua on tiny tensors, next to PyTorch eager. First, in a fresh process
-- state, as the peer script measures it (no large tensors alive yet).
do
  local a, b = lt.ones(4), lt.ones(4)
  local ag = lt.ones(4, {requires_grad = true})
  local calls = 1000000
  -- two loops written out, as the peer's two lambdas: each gets its own compiled trace
  local function plain()
    local t0, c = now()
    for _ = 1, calls do c = a + b end
    return (now() - t0) / calls * 1e6
  end
  local function recorded()
    local t0, c = now()
    for _ = 1, calls do c = ag + b end
    return (now() - t0) / calls * 1e6
  end
  local s_plain, s_grad = {}, {}
  for r = 1, 5 do
    s_plain[r], s_grad[r] = plain(), recorded()
  end
  local ours, ours_grad = median(s_plain), median(s_grad)
  local torch_us, torch_grad_us, why = util.torch_add_overhead(peer)
  local function line(what, us, peer_us, goal)
    local s = string.format("tiny add (4 elements) from Lua%s: lutra %.3f us/call", what, us)
    if peer_us then
      return s .. string.format(", PyTorch eager %.3f us/call, ratio %.3f (goal <= %s)", peer_us, us / peer_us, goal)
    end
    return s .. " (" .. why .. ")"
  end
  print(line("", ours, torch_us, "0.3"))
  print(line(", recorded for autograd", ours_grad, torch_grad_us, "0.5"))
end

-- matmul: ours vs OpenBLAS called directly.
do
  local n = 1024
  local a, b, c = lt.randn(n, n), lt.randn(n, n), lt.empty(n, n)
  local blas = ffi.C
  if not pcall(function() return blas.cblas_sgemm end) then blas = ffi.load("openblas") end
  local pa, pb, pc = ffi.cast("float*", a:data_ptr()), ffi.cast("float*", b:data_ptr()), ffi.cast("float*", c:data_ptr())
  local ours, direct = {}, {}
  -- lutra keeps OpenBLAS on one thread, splits mid-size matmuls over its own OpenMP threads
  -- and hands one this large (>= 1e8 multiply-adds) to OpenBLAS's threads for the call; the
  -- direct call gets OpenBLAS's own threading with the same thread count.
  local threads, lutra_blas_threads = lt.get_num_threads(), blas.openblas_get_num_threads()
  local function direct_sgemm()
    blas.openblas_set_num_threads(threads)
    blas.cblas_sgemm(101, 111, 111, n, n, n, 1, pa, n, pb, n, 0, pc, n)
    blas.openblas_set_num_threads(lutra_blas_threads)
  end
  -- Interleaved, in turns (ours first, then direct first), so that the machine's noise falls
  -- on both alike: both calls run on OpenBLAS's own threads (lutra hands a gemm this large
  -- to them) and its workers sleep right after (OPENBLAS_THREAD_TIMEOUT, see
  -- host/app/thread_env.c), so neither finds the other's threads spinning.
  local function ours_gemm() lt.matmul(a, b, c) end
  local function timed(fn)
    local t0 = now()
    fn()
    return now() - t0
  end
  ours_gemm()
  direct_sgemm()
  for r = 1, 2 * reps + 1 do
    if r % 2 == 1 then
      ours[r], direct[r] = timed(ours_gemm), timed(direct_sgemm)
    else
      direct[r], ours[r] = timed(direct_sgemm), timed(ours_gemm)
    end
  end
  local flop = 2 * n * n * n
  local g_ours, g_direct = flop / median(ours) / 1e9, flop / median(direct) / 1e9
  print(string.format("matmul 1024^3 f32: lutra %.1f GFLOP/s, cblas_sgemm direct %.1f GFLOP/s, ratio %.3f (goal >= 0.95)",
    g_ours, g_direct, g_ours / g_direct))
end

-- Bandwidth: add (read 2, write 1) and softmax over rows of 1024 (read 1, write 1).
do
  local n = 16 * 1024 * 1024
  local a, b, out = lt.randn(n), lt.randn(n), lt.empty(n)
  local s_add = time_median(function() a:add(b, out) end)
  print(string.format("add 16M f32: %.1f GB/s (%.2f ms)", 3 * 4 * n / s_add / 1e9, s_add * 1e3))
  local x, y = lt.randn(n / 1024, 1024), lt.empty(n / 1024, 1024)
  local s_sm = time_median(function() x:softmax(-1, y) end)
  print(string.format("softmax 16M f32 (rows of 1024): %.1f GB/s (%.2f ms)", 2 * 4 * n / s_sm / 1e9, s_sm * 1e3))
end

