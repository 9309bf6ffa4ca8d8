-- Custom ops written in the script (lt.kernel, lt.custom_op, lt.gradcheck): a fused bias + GELU and
-- a squared ReLU with CPU bodies in Lua, against a naive Lua loop of the same formula (bitwise: the
-- same double operations) and against the same thing composed from built-in ops (f64: the C
-- rows may fuse multiply-adds, so 1e-12); gradients by finite differences in f64; row splitting
-- over 1, 2 and 3 threads gives the same bits, every row run once; every refusal and its message;
-- CUDA bodies compiled by NVRTC (PTX produced, cached in memory and on disk, compile errors with
-- their line) and the launch's "no GPU" where there is none (a real launch against the CPU where
-- there is one).
local lt = require "lutra"
local T = require "lutra.testing"
local ffi = require "ffi"
local cuda = require "lutra.custom_op.cuda"
local close, equal, fails = T.assert_close, T.assert_equal, T.assert_error

local K, GC = math.sqrt(2 / math.pi), 0.044715

-- ---- the kernels ---------------------------------------------------------------------------------

-- y = gelu(x + b): x (..., n) contiguous, b (n)
local bias_gelu_fwd = lt.kernel {
  name = "bias_gelu_fwd", args = {"y", "x", "b"}, params = {"k", "c"},
  cpu = function(a, lo, hi)
    local y, x, b, k, c = a.y, a.x, a.b, a.k, a.c
    local n = a.shape.x[#a.shape.x]
    for r = lo, hi - 1 do
      for j = 0, n - 1 do
        local v = x[r * n + j] + b[j]
        y[r * n + j] = 0.5 * v * (1 + math.tanh(k * (v + c * v * v * v)))
      end
    end
  end,
}

-- gx = gy * gelu'(x + b)
local bias_gelu_bwd = lt.kernel {
  name = "bias_gelu_bwd", args = {"gx", "gy", "x", "b"}, params = {"k", "c"},
  cpu = function(a, lo, hi)
    local gx, gy, x, b, k, c = a.gx, a.gy, a.x, a.b, a.k, a.c
    local n = a.shape.x[#a.shape.x]
    for r = lo, hi - 1 do
      for j = 0, n - 1 do
        local i = r * n + j
        local v = x[i] + b[j]
        local t = math.tanh(k * (v + c * v * v * v))
        gx[i] = gy[i] * (0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * c * v * v))
      end
    end
  end,
}

local bias_gelu = lt.custom_op {
  name = "bias_gelu",
  forward = function(ctx, x, b)
    assert(b.shape[1] == x.shape[#x.shape], "bias_gelu: b must have x's last size")
    x = x:contiguous()
    local y = lt.empty_like(x)
    bias_gelu_fwd{y, x, b, k = K, c = GC}
    ctx:save(x, b)
    return y
  end,
  backward = function(ctx, gy)
    local x, b = ctx:saved()
    local gx = lt.empty_like(x)
    bias_gelu_bwd{gx, gy:contiguous(), x, b, k = K, c = GC}
    local n = b:numel()
    return gx, gx:reshape(-1, n):sum(0)
  end,
}

-- The same formula in plain Lua doubles over the tensors' values: rows of n.
local function rows_map(fn, list)
  local out = {}
  for i, row in ipairs(list) do out[i] = fn(row) end
  return out
end
local function naive_bias_gelu(x, b)
  local bl = b:double():tolist()
  return rows_map(function(row)
    local out = {}
    for j = 1, #row do
      local v = row[j] + bl[j]
      out[j] = 0.5 * v * (1 + math.tanh(K * (v + GC * v * v * v)))
    end
    return out
  end, x:double():reshape(-1, b:numel()):tolist())
end

local function same_bits(a, b, msg)
  equal(a:double():tolist(), b:double():tolist(), msg)
end

-- ---- values --------------------------------------------------------------------------------------

test("bias_gelu: f64 and f32 on odd shapes equal a naive loop bitwise and the built-ins to rounding", function()
  T.seed(1)
  for _, shape in ipairs {{7, 13}, {1, 1}, {3, 1, 5}, {2, 3, 4}, {33, 2}} do
    local n = shape[#shape]
    for _, dt in ipairs {"f64", "f32"} do
      local x = lt.tensor(T.random_list(shape), {dtype = dt}) * 3
      local b = lt.tensor(T.random_list({n}), {dtype = dt})
      local y = bias_gelu(x, b)
      equal(y.shape, x.shape)
      equal(y.dtype, dt)
      -- the body reads the stored values and rounds once on the store, as this reference does
      local ref = naive_bias_gelu(x, b)
      if dt == "f32" then ref = T.map(T.f32, ref) end
      equal(y:reshape(-1, n):double():tolist(), ref, "naive " .. dt)
      local composed = (x:double() + b:double()):gelu()
      close(y:double(), composed, {atol = dt == "f64" and 1e-12 or 1e-6, rtol = dt == "f64" and 1e-12 or 1e-6})
    end
  end
end)

test("bias_gelu: a non-contiguous x (the forward makes it contiguous) gives the values of its copy", function()
  T.seed(2)
  local base = lt.tensor(T.random_list({6, 5}), {dtype = "f64"})
  local x = base:t() -- (5, 6), strides (1, 5)
  local b = lt.tensor(T.random_list({6}), {dtype = "f64"})
  same_bits(bias_gelu(x, b), bias_gelu(x:contiguous(), b))
end)

-- ---- gradients -----------------------------------------------------------------------------------

test("bias_gelu: gradients of x and b by finite differences in f64 (lt.gradcheck), grad_fn named", function()
  T.seed(3)
  local x = lt.tensor(T.random_list({5, 7}), {dtype = "f64"}):requires_grad_()
  local b = lt.tensor(T.random_list({7}), {dtype = "f64"}):requires_grad_()
  local ok, report = lt.gradcheck(bias_gelu, {x, b}, {atol = 1e-8, rtol = 1e-6})
  assert(ok and report.checked == 42, "every element checked")
  equal(tostring(bias_gelu(x, b).grad_fn), "BiasGeluBackward")
  -- 3-d x, non-contiguous, only x requiring grad
  local x3 = T.random_leaf({2, 3, 4}, true)
  local b4 = lt.tensor(T.random_list({4}), {dtype = "f64"})
  lt.gradcheck(function(t) return bias_gelu(t, b4) end, {x3}, {atol = 1e-8, rtol = 1e-6})
  -- the op inside a larger graph: gradients equal those of the composed built-ins (f64)
  local xa, ba = x:detach():requires_grad_(), b:detach():requires_grad_()
  local ya = (bias_gelu(xa, ba) * 2):sum()
  ya:backward()
  local xc, bc = x:detach():requires_grad_(), b:detach():requires_grad_()
  local yc = ((xc + bc):gelu() * 2):sum()
  yc:backward()
  close(xa.grad, xc.grad, {atol = 1e-12, rtol = 1e-12})
  close(ba.grad, bc.grad, {atol = 1e-12, rtol = 1e-12})
end)

test("gradcheck: f32 inputs are checked through f64 copies; a wrong backward is caught at its worst element", function()
  T.seed(4)
  local x = lt.tensor(T.random_list({4, 3}), {dtype = "f32"}):requires_grad_()
  local b = lt.tensor(T.random_list({3}), {dtype = "f32"}):requires_grad_()
  assert(lt.gradcheck(bias_gelu, {x, b}, {atol = 1e-8, rtol = 1e-6}))
  assert(x.grad == nil, "gradcheck leaves the inputs' .grad alone")
  -- a backward off by a factor on one element: the report names that element
  local wrong = lt.custom_op {
    name = "wrong_square",
    forward = function(ctx, t) ctx:save(t); return t * t end,
    backward = function(ctx, g)
      local t = ctx:saved()
      local gt = g * t * 2
      gt[{1, 2}] = gt[{1, 2}] * 1.5
      return gt
    end,
  }
  local xx = lt.tensor(T.random_list({3, 4}), {dtype = "f64"}):requires_grad_()
  local ok, report = lt.gradcheck(wrong, {xx}, {raise = false})
  assert(not ok)
  equal(report.worst.index, "[1, 2]")
  equal(report.worst.element, 6)
  assert(report.text:find("gradcheck: input 1 element 6 [1, 2]: analytic", 1, true), report.text)
  fails("worst of 12 elements", function() lt.gradcheck(wrong, {xx}) end)
  fails("gradcheck: no input requires grad", function() lt.gradcheck(wrong, {xx:detach()}) end)
end)

-- ---- threads -------------------------------------------------------------------------------------

-- row r of y: (lo, hi) of the part that ran it
local who = lt.kernel {
  name = "who", args = {"y"},
  cpu = function(a, lo, hi)
    local y = a.y
    for r = lo, hi - 1 do
      y[2 * r], y[2 * r + 1] = lo, hi
    end
  end,
}

-- The parts `who` saw in y (rows, 2): raises unless they tile [0, rows) and each row lies in its part.
local function parts_of(y)
  local seen, list = {}, {}
  for r, pair in ipairs(y:tolist()) do
    local lo, hi = pair[1], pair[2]
    assert(lo <= r - 1 and r - 1 < hi, "row " .. (r - 1) .. " ran in part [" .. lo .. ", " .. hi .. ")")
    if not seen[lo] then
      seen[lo] = true
      list[#list + 1] = {lo, hi}
    end
  end
  table.sort(list, function(p, q) return p[1] < q[1] end)
  for k = 2, #list do assert(list[k - 1][2] == list[k][1], "parts overlap or leave a gap") end
  equal(list[1][1], 0)
  equal(list[#list][2], #y:tolist())
  return #list
end

test("row splitting: 1, 2 and 3 threads give the same bits; every row runs once, in parts", function()
  local threads = lt.get_num_threads()
  T.seed(5)
  local x = lt.tensor(T.random_list({37, 29}), {dtype = "f32"}) * 2
  local b = lt.tensor(T.random_list({29}), {dtype = "f32"})
  local results = {}
  for _, n in ipairs {1, 2, 3} do
    lt.set_num_threads(n)
    local y = bias_gelu(x, b)
    results[n] = y
    local w = lt.full({37, 2}, -1, {dtype = "f64"})
    who{w}
    equal(parts_of(w), n, n .. " threads: parts")
  end
  lt.set_num_threads(threads)
  same_bits(results[2], results[1], "2 threads")
  same_bits(results[3], results[1], "3 threads")
  -- grain: at least 16 rows a part, so 37 rows make 3 parts at most, 10 rows one
  lt.set_num_threads(3)
  local coarse = lt.kernel {name = "who16", args = {"y"}, grain = 16, cpu = function(a, lo, hi)
    for r = lo, hi - 1 do a.y[r] = lo end
  end}
  local w = lt.zeros(10, 1, {dtype = "f64"})
  coarse{w}
  equal(w:sum():item(), 0, "one part")
  lt.set_num_threads(threads)
end)

-- ---- refusals ------------------------------------------------------------------------------------

test("errors: upvalues, arguments, shapes of gradients, an error inside a body at its line", function()
  local scale = 2
  local err = fails("uses the upvalue 'scale'", function()
    lt.kernel{name = "up", args = {"y"}, cpu = function(a, lo, hi) a.y[lo] = scale end}
  end)
  assert(err:find("pass numbers through params", 1, true), err)
  -- globals: a worker state has the standard libraries only (read through a nested function too)
  fails("reads the global 'MY_SCALE', which the worker states", function()
    lt.kernel{name = "glob", args = {"y"}, cpu = function(a, lo, hi)
      local f = function() return MY_SCALE end
      a.y[lo] = f()
    end}
  end)
  fails("reads the global 'os'", function()
    lt.kernel{name = "glob", args = {"y"}, cpu = function(a, lo, hi) a.y[lo] = os.time() end}
  end)
  fails("sets the global 'leak'", function()
    lt.kernel{name = "glob", args = {"y"}, cpu = function(a, lo, hi) leak = a.y[lo] end}
  end)
  fails("kernel: unknown field", function() lt.kernel{name = "u", args = {"y"}, cpu = function() end, bogus = 1} end)
  fails("give a cpu body, a cuda body or both", function() lt.kernel{name = "u", args = {"y"}} end)
  fails("args must name at least one tensor", function() lt.kernel{name = "u", args = {}, cpu = function() end} end)
  fails("the name 'x' is taken twice", function()
    lt.kernel{name = "u", args = {"x"}, params = {"x"}, cpu = function() end}
  end)
  local x, b = lt.randn(3, 4, {dtype = "f64"}), lt.randn(4, {dtype = "f64"})
  local y = lt.empty_like(x)
  fails("argument 3 (b) must be a tensor, got nil", function() bias_gelu_fwd{y, x, k = K, c = GC} end)
  fails("param c must be a number, got nil", function() bias_gelu_fwd{y, x, b, k = K} end)
  fails("4 tensors given, it takes 3", function() bias_gelu_fwd{y, x, b, b, k = K, c = GC} end)
  fails("x is not contiguous", function() bias_gelu_fwd{y, lt.randn(4, 3, {dtype = "f64"}):t(), b, k = K, c = GC} end)
  -- backward returning a gradient of the wrong shape names the op, the input and both shapes
  local bad = lt.custom_op {
    name = "bad_grad",
    forward = function(ctx, t, u) return t + u end,
    backward = function(ctx, g) return g, g end, -- u is (4), g is (3, 4)
  }
  local xr, ur = lt.randn(3, 4, {dtype = "f64"}):requires_grad_(), lt.randn(4, {dtype = "f64"}):requires_grad_()
  fails("custom_op 'bad_grad': backward returned a gradient of shape [3, 4] for input 2 of shape [4]", function()
    bad(xr, ur):sum():backward()
  end)
  local nob = lt.custom_op {name = "no_backward", forward = function(ctx, t) return t * 2 end}
  fails("custom_op 'no_backward' has no backward, and an input requires grad", function() nob(xr) end)
  equal(nob(xr:detach()):sum():item(), (xr:detach() * 2):sum():item())
  fails("forward returned number, expected a tensor", function()
    lt.custom_op{name = "num", forward = function() return 1 end}(x)
  end)
  -- a saved input modified in place before backward
  local xs = lt.randn(3, 4, {dtype = "f64"}):requires_grad_()
  local h = xs * 1
  local out = bias_gelu(h, b)
  h:add_(1)
  fails("modified in place", function() out:sum():backward() end)
  -- an error raised inside a body, on 1 thread (main state) and on 2 (worker states), at its line
  local line = debug.getinfo(1, "l").currentline + 3
  local boom = lt.kernel {name = "boom", args = {"y"}, cpu = function(a, lo, hi)
    for r = lo, hi - 1 do
      if r == 5 then error("row " .. r .. " is bad") end
    end
  end}
  local threads = lt.get_num_threads()
  local where = "test_custom_op.lua:" .. line .. ": row 5 is bad"
  lt.set_num_threads(1)
  local e1 = fails(where, function() boom{lt.zeros(8, 2)} end)
  assert(e1:find("kernel 'boom' (cpu, rows 0..8)", 1, true), e1)
  lt.set_num_threads(2)
  local e2 = fails(where, function() boom{lt.zeros(8, 2)} end)
  assert(e2:find("kernel 'boom' (cpu, 2 threads): rows 4..8:", 1, true), e2)
  -- a runtime error (not error()) in a worker: LuaJIT's message with the line
  local nil_line = debug.getinfo(1, "l").currentline + 1
  local nil_call = lt.kernel {name = "nil_call", args = {"y"}, cpu = function(a, lo, hi) a.y[lo] = a.nothing.x end}
  fails("test_custom_op.lua:" .. nil_line .. ": attempt to index field 'nothing'", function() nil_call{lt.zeros(8, 2)} end)
  -- the workers survive an error: the next call runs
  local w = lt.zeros(8, 2, {dtype = "f64"})
  who{w}
  equal(parts_of(w), 2)
  lt.set_num_threads(threads)
end)

test("gradients of gradients: a custom op's double_backward (recorded ops) by finite differences; without it, an error naming the op",
  function()
  -- cube(x) = x^3 through a body; backward 3 x^2 g through a body, double_backward the same in built-in ops
  local cube_k = lt.kernel {name = "cube", args = {"y", "x"}, cpu = function(a, lo, hi)
    for i = lo, hi - 1 do a.y[i] = a.x[i] * a.x[i] * a.x[i] end
  end}
  local grad_k = lt.kernel {name = "cube_grad", args = {"gx", "g", "x"}, cpu = function(a, lo, hi)
    for i = lo, hi - 1 do a.gx[i] = 3 * a.x[i] * a.x[i] * a.g[i] end
  end}
  local function spec(with_double)
    return {
      name = with_double and "cube" or "cube_plain",
      forward = function(ctx, x)
        local y = lt.empty_like(x)
        cube_k{y, x}
        ctx:save(x)
        return y
      end,
      backward = function(ctx, g)
        local x = ctx:saved()
        local gx = lt.empty_like(x)
        grad_k{gx, g:contiguous(), x}
        return gx
      end,
      double_backward = with_double and function(ctx, g)
        local x = ctx:saved()
        return x * x * g * 3
      end or nil,
    }
  end
  local cube, cube_plain = lt.custom_op(spec(true)), lt.custom_op(spec(false))
  local x = lt.tensor({{0.3, -1.2, 0.7}, {1.1, -0.4, 0.9}}, {dtype = "f64"}):requires_grad_()
  local w = lt.tensor({{1.0, -2.0, 0.5}, {0.25, 3.0, -1.5}}, {dtype = "f64"})
  -- first gradient 3 x^2 w, recorded; its gradient 6 x w by finite differences
  local ok, report = lt.gradcheck(function(a)
    return lt.enable_grad(function()
      return lt.autograd.grad((cube(a) * w):sum(), {a}, nil, {create_graph = true})[1]
    end)
  end, {x})
  assert(ok, report)
  close(lt.autograd.grad((lt.autograd.grad((cube(x) * w):sum(), {x}, nil, {create_graph = true})[1]):sum(), {x})[1],
    x:detach() * w * 6, {rtol = 1e-15, atol = 0})
  local g1 = lt.autograd.grad((cube_plain(x) * w):sum(), {x}, nil, {create_graph = true})[1]
  fails("give custom_op 'cube_plain' a double_backward", function() g1:sum():backward() end)
  fails("double_backward must be a function, given with backward", function()
    lt.custom_op {name = "bad", forward = function() end, double_backward = function() end}
  end)
end)

-- ---- CUDA bodies: NVRTC --------------------------------------------------------------------------

local SRC = [[
extern "C" __global__ void bias_gelu_cuda(lt_kernel_args a) {
  long long n = a.t[1].size[a.t[1].ndim - 1];
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;  // one thread an element
  if (i >= a.rows * n) return;
  scalar_t v = ((const scalar_t *)a.t[1].data)[i] + ((const scalar_t *)a.t[2].data)[i % n];
  scalar_t k = (scalar_t)a.p[0], c = (scalar_t)a.p[1];
  ((scalar_t *)a.t[0].data)[i] = (scalar_t)0.5 * v * (1 + tanh(k * (v + c * v * v * v)));
}
]]

local function need_nvrtc()
  local version, why = cuda.nvrtc_version()
  if not version then T.skip("libnvrtc cannot be loaded: " .. why) end
  return version
end

test("without NVRTC: kernels with a cuda body are made, ptx() says what is missing, cpu bodies run", function()
  local lutra = (os.getenv("LUTRA_BUILD_DIR") or "build") .. "/lutra"
  local script = os.tmpname()
  assert(require("lutra.atomic_file").write(script, [[
local lt = require "lutra"
local k = lt.kernel {name = "both", args = {"y"}, cpu = function(a, lo, hi) for r = lo, hi - 1 do a.y[r] = r end end,
                     cuda = 'extern "C" __global__ void both(lt_kernel_args a) {}'}
local y = lt.zeros(5, 1)
k{y}
print("cpu", y:sum():item())
print(pcall(k.ptx, k))
]]))
  local p = io.popen("LUTRA_NVRTC=/nonexistent/libnvrtc.so '" .. lutra .. "' " .. script .. " 2>&1")
  local out = p:read("*a")
  p:close()
  os.remove(script)
  assert(out:find("cpu\t10", 1, true), out)
  assert(out:find("kernel 'both': nvrtc: NVRTC (the CUDA toolkit's run-time compiler) cannot be loaded: "
    .. "/nonexistent/libnvrtc.so: cannot open shared object file", 1, true), out)
end)

-- LUTRA_CACHE_DIR for this process: a fresh directory
pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
local function fresh_cache()
  local dir = os.tmpname()
  os.remove(dir)
  ffi.C.setenv("LUTRA_CACHE_DIR", dir, 1)
  return dir
end

test("nvrtc: PTX for f32 and f64, cached in memory and on disk (written atomically, checked by key)", function()
  need_nvrtc()
  local dir = fresh_cache()
  local k = lt.kernel {name = "bias_gelu_cuda", args = {"y", "x", "b"}, params = {"k", "c"}, cuda = SRC, grid = function(rows)
    return math.ceil(rows * 64 / 256)
  end}
  local s0 = {compiled = cuda.stats.compiled, from_memory = cuda.stats.from_memory, from_disk = cuda.stats.from_disk}
  local p32 = k:ptx{dtype = "f32"}
  assert(p32:find(".entry bias_gelu_cuda", 1, true), "the entry is in the PTX")
  assert(p32:find(".target sm_80", 1, true), "compute_80 by default")
  assert(p32:find("ld.global.f32", 1, true) or p32:find(".f32", 1, true), "f32 loads")
  local p64 = k:ptx{dtype = "f64", arch = 90}
  assert(p64:find(".target sm_90", 1, true) and p64:find(".f64", 1, true), "f64 for sm_90")
  equal(cuda.stats.compiled - s0.compiled, 2)
  equal(k:ptx{dtype = "f32"}, p32)
  equal(cuda.stats.from_memory - s0.from_memory, 1)
  -- on disk: one file per key, holding the key then the PTX
  local names = {}
  for name in io.popen("ls " .. dir .. "/nvrtc"):lines() do names[#names + 1] = name end
  equal(#names, 2)
  assert(names[1]:match("^%x+%.ptx$"), names[1])
  -- another kernel object with the same source (as a new process would make) finds it on disk
  local k2 = lt.kernel {name = "bias_gelu_cuda", args = {"y", "x", "b"}, params = {"k", "c"}, cuda = SRC .. ""}
  cuda.clear_memory_cache()
  equal(k2:ptx{dtype = "f32"}, p32)
  equal(cuda.stats.from_disk - s0.from_disk, 1)
  equal(cuda.stats.compiled - s0.compiled, 2)
  -- a file whose key differs (a collision, or planted) is compiled again, never used
  local path = dir .. "/nvrtc/" .. names[1]
  local planted = "// lutra nvrtc cache 1\n3\nabc\n.version 1.0 garbage"
  assert(require("lutra.atomic_file").write(path, planted))
  cuda.clear_memory_cache()
  k2:ptx{dtype = "f32"}
  k2:ptx{dtype = "f64", arch = 90}
  equal(cuda.stats.compiled - s0.compiled, 3, "the planted one compiled again, the other read")
  -- a different source is a different key
  local k3 = lt.kernel {name = "bias_gelu_cuda", args = {"y", "x", "b"}, params = {"k", "c"}, cuda = SRC .. "\n// v2\n"}
  k3:ptx{dtype = "f32"}
  equal(cuda.stats.compiled - s0.compiled, 4)
  os.execute("rm -rf '" .. dir .. "'")
end)

test("nvrtc: the CUDA argument block has the FFI's sizes (checked by static_assert in NVRTC)", function()
  need_nvrtc()
  local dir = fresh_cache()
  local abi = require "lutra.custom_op.abi"
  -- the same field types in the same order; NVRTC has no offsetof, so sizes and alignments
  local asserts = {}
  for _, c in ipairs {{"lt_kernel_args", ffi.sizeof("lt_kernel_args")}, {"lt_kernel_tensor", ffi.sizeof("lt_kernel_tensor")},
                      {"long long", 8}, {"char *", 8}, {"int", 4}, {"double", 8}} do
    asserts[#asserts + 1] = string.format('static_assert(sizeof(%s) == %d, "sizeof %s");', c[1], c[2], c[1])
  end
  asserts[#asserts + 1] = string.format('static_assert(alignof(lt_kernel_args) == %d, "align");', ffi.alignof("lt_kernel_args"))
  equal(ffi.sizeof(abi.args_type), 8 * 144 + 16 * 8 + 8 + 8)
  local k = lt.kernel {name = "layout", args = {"y"}, cuda = table.concat(asserts, "\n")
    .. '\nextern "C" __global__ void layout(lt_kernel_args a) {}\n'}
  assert(k:ptx():find(".entry layout", 1, true))
  -- and a wrong one fails, at its line
  local wrong = lt.kernel {name = "layout_wrong", args = {"y"}, cuda = "\nstatic_assert(sizeof(lt_kernel_args) == 8, \"size\");\n"}
  fails("layout_wrong.cu(2): error: static assertion failed", function() wrong:ptx() end)
  os.execute("rm -rf '" .. dir .. "'")
end)

test("nvrtc: a compile error names the kernel and the body's own line", function()
  need_nvrtc()
  local dir = fresh_cache()
  local bad = lt.kernel {name = "broken", args = {"y"}, cuda = [[
extern "C" __global__ void broken(lt_kernel_args a) {
  scalar_t *y = (scalar_t *)a.t[0].data;
  y[0] = not_declared_anywhere;
}
]]}
  local err = fails("kernel 'broken': nvrtc: compiling broken.cu failed", function() bad:ptx() end)
  assert(err:find('broken.cu(3): error: identifier "not_declared_anywhere" is undefined', 1, true), err)
  fails("cuda bodies take f32 or f64 tensors", function() require("lutra.custom_op.cuda").ptx(bad, 4, 80) end)
  fails("ptx: dtype must be f32 or f64", function() bad:ptx{dtype = "bf16"} end)
  fails("kernel 'broken' has no cpu body (its tensors are on the cpu)", function() bad{lt.zeros(2)} end)
  os.execute("rm -rf '" .. dir .. "'")
end)

test("cuda launch without a GPU: 'no GPU' and why (test_custom_op_gpu.lua launches for real)", function()
  -- the driver is asked first (the device's architecture), so this needs no NVRTC
  local dir = fresh_cache()
  local k = lt.kernel {name = "bias_gelu_cuda", args = {"y", "x", "b"}, params = {"k", "c"}, cuda = SRC}
  assert(lt.cuda.device_count() == 0, "a GPU is visible: run with CUDA_VISIBLE_DEVICES= (as ctest does)")
  local err = fails("no GPU", function() k:load_cuda{device = 0} end)
  assert(err:find("kernel 'bias_gelu_cuda': custom_op: no GPU: the CUDA driver cannot be used (", 1, true), err)
  os.execute("rm -rf '" .. dir .. "'")
end)
