-- Custom ops' CUDA bodies on cuda:0 (label gpu; skipped as a whole without a GPU): NVRTC compiles
-- for the device's architecture, the driver loads the PTX and launches it on the compute stream;
-- the results equal the CPU body's on odd shapes (rows not a multiple of the block), in f32 and f64,
-- and ops queued after the launch see its output without a synchronisation. Written without a GPU
-- at hand: this file has not yet run on one.
local lt = require "lutra"
local T = require "lutra.testing"
local close, equal, fails, skip = T.assert_close, T.assert_equal, T.assert_error, T.skip

T.need_gpu()
if not require("lutra.custom_op.cuda").nvrtc_version() then skip("libnvrtc cannot be loaded") end

local K, GC = math.sqrt(2 / math.pi), 0.044715

-- y = gelu(x + b) as v * sigmoid(2u), one thread an element; x (rows, n), b (n)
local bias_gelu = lt.kernel {
  name = "bias_gelu_gpu", args = {"y", "x", "b"}, params = {"k", "c"},
  cpu = function(a, lo, hi)
    local y, x, b, k, c = a.y, a.x, a.b, a.k, a.c
    local n = a.shape.x[#a.shape.x]
    for r = lo, hi - 1 do
      for j = 0, n - 1 do
        local v = x[r * n + j] + b[j]
        y[r * n + j] = v / (1 + math.exp(-2 * k * (v + c * v * v * v)))
      end
    end
  end,
  cuda = [[
extern "C" __global__ void bias_gelu_gpu(lt_kernel_args a) {
  long long n = a.t[1].size[a.t[1].ndim - 1];
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= a.rows * n) return;
  scalar_t v = ((const scalar_t *)a.t[1].data)[i] + ((const scalar_t *)a.t[2].data)[i % n];
  scalar_t k = (scalar_t)a.p[0], c = (scalar_t)a.p[1];
  ((scalar_t *)a.t[0].data)[i] = v / (1 + exp(-2 * k * (v + c * v * v * v)));
}
]],
  grid = function(rows, block) return math.ceil(rows * 257 / block) end, -- n = 257 below
}

test("the CUDA body equals the CPU body, f32 and f64, rows not a multiple of the block", function()
  T.seed(1)
  for _, dt in ipairs {"f64", "f32"} do
    local x = lt.tensor(T.random_list({37, 257}), {dtype = dt}) * 3
    local b = lt.tensor(T.random_list({257}), {dtype = dt})
    local y = lt.empty_like(x)
    bias_gelu{y, x, b, k = K, c = GC}
    local yc = lt.empty({37, 257}, {dtype = dt, device = "cuda:0"})
    bias_gelu{yc, x:cuda(), b:cuda(), k = K, c = GC}
    local after = yc + 1 -- queued on the same stream: sees the kernel's output
    local tol = dt == "f64" and 1e-14 or 2e-6
    close(yc:cpu():double(), y:double(), {atol = tol, rtol = tol})
    close(after:cpu():double(), (y + 1):double(), {atol = tol, rtol = tol})
  end
end)

test("the PTX is compiled for the device's architecture and loaded once per device", function()
  local arch = require("lutra.ffi").ffi.new("int[1]")
  assert(lt.C.lt_rtc_device_arch(0, arch) == 0)
  local f1 = bias_gelu:load_cuda{device = 0, dtype = "f32"}
  local f2 = bias_gelu:load_cuda{device = 0, dtype = "f32"}
  assert(f1 == f2, "loaded once")
  assert(bias_gelu:ptx{dtype = "f32", arch = arch[0]}:find(".target sm_" .. arch[0], 1, true))
end)

test("a kernel without a cuda body, mixed devices", function()
  local cpu_only = lt.kernel {name = "cpu_only", args = {"y"}, cpu = function(a, lo, hi) end}
  fails("kernel 'cpu_only' has no cuda body (its tensors are on cuda:0)", function()
    cpu_only{lt.zeros(3, {device = "cuda:0"})}
  end)
  fails("a call runs on one device", function()
    bias_gelu{lt.zeros(2, 257, {device = "cuda:0"}), lt.zeros(2, 257), lt.zeros(257), k = K, c = GC}
  end)
  equal(1, 1)
end)
