-- bench/gpu_gemm.lua — GEMM through lutra's API next to cuBLAS's own rate, in one run.
--   lutra bench/gpu_gemm.lua [--n 4096] [--iters 50] [--dtypes bf16,f16,tf32]
-- For each dtype: C = A @ B on n x n matrices on cuda:0, timed through a:matmul(b, out)
-- (lutra's dispatch + cuBLASLt) and through cublasGemmEx called directly on the same buffers
-- (lt_cuda_bench_cublas_gemm in kernels/matmul.cu). Prints TFLOP/s and the ratio;
-- the goal is lutra >= 0.95x cuBLAS at 4096^3 bf16. "tf32" is f32 with lutra.cuda TF32 on.
local lt = require "lutra"
local ffi = require "ffi"
local C = lt.C

local n, iters, dtypes = 4096, 50, {"bf16", "f16", "tf32"}
local i = 1
while i <= #arg do
  if arg[i] == "--n" then
    n = tonumber(arg[i + 1]); i = i + 1
  elseif arg[i] == "--iters" then
    iters = tonumber(arg[i + 1]); i = i + 1
  elseif arg[i] == "--dtypes" then
    dtypes = {}
    for d in arg[i + 1]:gmatch("[^,]+") do dtypes[#dtypes + 1] = d end
    i = i + 1
  else
    io.stderr:write("gpu_gemm: unknown argument '", arg[i], "'\n")
    os.exit(2)
  end
  i = i + 1
end

if C.lt_cuda_device_count() == 0 then
  print("gpu_gemm: skipped: no CUDA device (" .. ffi.string(C.lt_cuda_status()) .. ")")
  os.exit(0)
end

for _, decl in ipairs {
  "int lt_cuda_set_tf32(int enabled);",
  "int lt_cuda_bench_cublas_gemm(int device, int dtype, int n, const void *a, const void *b, void *c, int iters, "
    .. "int tf32, double *seconds);",
} do pcall(ffi.cdef, decl) end
if not pcall(function() return C.lt_cuda_bench_cublas_gemm end) then
  print("gpu_gemm: skipped: this lutra was built without kernels/matmul.cu")
  os.exit(0)
end

local util = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/util.lua")
local now = util.now

local function check(rc)
  if rc ~= 0 then error(ffi.string(C.lt_last_error()), 2) end
end

print(string.format("gpu_gemm: %d^3, %d iterations each; %s", n, iters, ffi.string(C.lt_cuda_status())))
print(string.format("%-6s %14s %14s %8s", "dtype", "lutra TFLOP/s", "cuBLAS TFLOP/s", "ratio"))
local flops = 2 * n * n * n
for _, name in ipairs(dtypes) do
  local tf32 = name == "tf32"
  local dt = tf32 and "f32" or name
  check(C.lt_cuda_set_tf32(tf32 and 1 or 0))
  local a = lt.randn({n, n}, {dtype = dt}):to("cuda:0")
  local b = lt.randn({n, n}, {dtype = dt}):to("cuda:0")
  local out = lt.empty({n, n}, {dtype = dt, device = "cuda:0"})

  -- lutra: warm-up (heuristic and workspace), then `iters` calls between two synchronisations
  for _ = 1, 3 do a:matmul(b, out) end
  lt.cuda.synchronize(0)
  local t0 = now()
  for _ = 1, iters do a:matmul(b, out) end
  lt.cuda.synchronize(0)
  local lutra_s = (now() - t0) / iters

  -- cuBLAS directly, on the same buffers (it does its own warm-up and event timing)
  local secs = ffi.new("double[1]")
  check(C.lt_cuda_bench_cublas_gemm(0, a.dtype_, n, C.lt_data_ptr(a), C.lt_data_ptr(b), C.lt_data_ptr(out), iters,
                                    tf32 and 1 or 0, secs))
  local lutra_tf, blas_tf = flops / lutra_s / 1e12, flops / secs[0] / 1e12
  print(string.format("%-6s %14.1f %14.1f %8.3f", name, lutra_tf, blas_tf, lutra_tf / blas_tf))
end
check(C.lt_cuda_set_tf32(0))
