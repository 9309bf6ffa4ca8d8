-- lutra.selftest.matmul — matmul (cuBLASLt) on st.device against the CPU (OpenBLAS): f32,
-- f64, bf16, f16 and TF32, odd sizes, transposed, strided and batched operands; and the fused
-- linear layer (kernels/matmul.cu epilogues) against naive loops in double.
local ffi = require "ffi"

local uniform -- st.uniform: the selftest's own xorshift stream

local function numel(shape)
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  return n
end

-- The GPU sums in another order than OpenBLAS (and rounds TF32 inputs), so matmul is checked
-- with a tolerance: max abs error <= tol * max(1, max |want|). bf16/f16 results are rounded
-- on both sides from f32 sums, so they may differ by about one unit in the last place.
local MATMUL_TOL = {f64 = 1e-12, f32 = 1e-5, tf32 = 5e-3, bf16 = 1.6e-2, f16 = 2e-3}

-- The largest |got - want|, the largest relative error and max(1, max |want|) over n values
-- (double arrays; NaN counts as an infinite error).
local function error_stats(got, want, n)
  local max_abs, max_rel, scale = 0, 0, 1
  for i = 0, n - 1 do
    local abs = math.abs(got[i] - want[i])
    if abs ~= abs then abs = math.huge end
    max_abs = math.max(max_abs, abs)
    max_rel = math.max(max_rel, abs / math.max(math.abs(want[i]), 1e-300))
    scale = math.max(scale, math.abs(want[i]))
  end
  if max_abs == 0 then max_rel = 0 end
  return max_abs, max_rel, scale
end

-- (M, K, N): ones, odd sizes, sizes past one tile
local MATMUL_SIZES = {{1, 1, 1}, {7, 13, 5}, {33, 65, 17}, {3, 257, 31}, {128, 64, 96}}

local function set_tf32(C, on)
  pcall(ffi.cdef, "int lt_cuda_set_tf32(int enabled);")
  local ok = pcall(function() return C.lt_cuda_set_tf32 end)
  if ok then C.lt_cuda_set_tf32(on and 1 or 0) end
  return ok
end

local function run_matmul_cases(lt, C, device, report)
  -- a CPU tensor of shape with values in [-1, 1]
  local function rand(shape, dtype)
    local n = numel(shape)
    local buf = ffi.new("double[?]", math.max(n, 1))
    for i = 0, n - 1 do buf[i] = uniform() * 2 - 1 end
    local t = lt.empty(shape, {dtype = dtype})
    assert(C.lt_copy_from_buffer(t, buf, C.LT_F64, n) == 0, ffi.string(C.lt_last_error()))
    return t
  end
  local function on_device(t) return device == "cpu" and t:clone() or t:to(device) end
  -- got and want (CPU tensors of one shape): the largest error and the largest |want|
  local function check(label, tol_key, shape, dt, got, want)
    local n = numel(shape)
    local g, w = ffi.new("double[?]", math.max(n, 1)), ffi.new("double[?]", math.max(n, 1))
    assert(C.lt_copy_to_buffer(got:contiguous(), g, C.LT_F64, n) == 0, ffi.string(C.lt_last_error()))
    assert(C.lt_copy_to_buffer(want:contiguous(), w, C.LT_F64, n) == 0, ffi.string(C.lt_last_error()))
    local max_abs, max_rel, scale = error_stats(g, w, n)
    report(label, shape, dt, max_abs, max_rel, max_abs <= MATMUL_TOL[tol_key] * scale)
  end
  -- the CPU result of a @ b, and the device result of the same operands made by `view`
  -- (which may transpose, narrow or permute them on either side)
  local function case(label, tol_key, dt, a_host, b_host, a_view, b_view)
    local want = a_view(a_host):matmul(b_view(b_host))
    local got = a_view(on_device(a_host)):matmul(b_view(on_device(b_host)))
    check(label, tol_key, want.shape, dt, got:cpu(), want)
  end
  local same = function(t) return t end
  local tr = function(t) return t:transpose(t.ndim - 2, t.ndim - 1) end
  local cols = function(t) return t:narrow(t.ndim - 1, 1, t.shape[t.ndim] - 2) end -- row stride > cols

  local variants = {{"f32", "f32"}, {"f64", "f64"}, {"bf16", "bf16"}, {"f16", "f16"}, {"f32", "tf32"}}
  for _, v in ipairs(variants) do
    local dt, tol_key = v[1], v[2]
    local tf32_ok = set_tf32(C, tol_key == "tf32")
    if tol_key ~= "tf32" or tf32_ok then
      local label = tol_key == "tf32" and "matmul tf32" or "matmul"
      for _, mkn in ipairs(MATMUL_SIZES) do
        local M, K, N = mkn[1], mkn[2], mkn[3]
        case(label, tol_key, dt, rand({M, K}, dt), rand({K, N}, dt), same, same)
        -- a^T and b^T stored transposed (column-major to BLAS)
        case(label, tol_key, dt, rand({K, M}, dt), rand({N, K}, dt), tr, tr)
        -- b with a row stride larger than its width, a transposed
        case(label, tol_key, dt, rand({K, M}, dt), rand({K, N + 2}, dt), tr, cols)
      end
      -- batched: folded rows (x (B, T, C) @ w), strided batches, broadcast batches (a loop),
      -- permuted batch dims, and a layout that must be gathered first
      case(label, tol_key, dt, rand({2, 3, 9, 21}, dt), rand({21, 11}, dt), same, same)
      case(label, tol_key, dt, rand({4, 9, 21}, dt), rand({4, 21, 11}, dt), same, same)
      case(label, tol_key, dt, rand({2, 1, 9, 21}, dt), rand({1, 3, 21, 11}, dt), same, same)
      case(label, tol_key, dt, rand({9, 4, 21}, dt), rand({4, 11, 21}, dt),
           function(t) return t:permute(1, 0, 2) end, tr)
      case(label, tol_key, dt, rand({21, 9, 3}, dt), rand({3, 21, 11}, dt),
           function(t) return t:permute(2, 1, 0) end, same) -- (3, 9, 21) with no unit stride
    end
  end
  set_tf32(C, false)
end

-- The fused linear layer (kernels/matmul.cu: cuBLASLt's BIAS, GELU_BIAS and BGRADB
-- epilogues) against naive loops in double on the inputs as stored. CUDA only: there is no
-- CPU entry point for it yet.
local LINEAR_DECLS = {
  "int lt_cuda_linear_forward(lt_tensor *out, const lt_tensor *x, const lt_tensor *w, const lt_tensor *bias, int act);",
  "int lt_cuda_linear_backward_params(lt_tensor *dw, lt_tensor *dbias, const lt_tensor *dy, const lt_tensor *x);",
}

local function run_linear_cases(lt, C, device, report)
  for _, decl in ipairs(LINEAR_DECLS) do pcall(ffi.cdef, decl) end
  if device == "cpu" or not pcall(function() return C.lt_cuda_linear_forward end) then return end
  local function doubles(t) -- a CPU tensor's values as a double buffer
    local n = numel(t.shape)
    local buf = ffi.new("double[?]", math.max(n, 1))
    assert(C.lt_copy_to_buffer(t:contiguous(), buf, C.LT_F64, n) == 0, ffi.string(C.lt_last_error()))
    return buf
  end
  local function rand(shape, dtype)
    local n = numel(shape)
    local buf = ffi.new("double[?]", math.max(n, 1))
    for i = 0, n - 1 do buf[i] = uniform() * 2 - 1 end
    local t = lt.empty(shape, {dtype = dtype})
    assert(C.lt_copy_from_buffer(t, buf, C.LT_F64, n) == 0, ffi.string(C.lt_last_error()))
    return t
  end
  local function check(label, shape, dt, got, want)
    local g, n = doubles(got), numel(shape)
    local max_abs, max_rel, scale = error_stats(g, want, n)
    report(label, shape, dt, max_abs, max_rel, max_abs <= MATMUL_TOL[dt] * scale)
  end
  local function gelu(v) return 0.5 * v * (1 + math.tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))) end
  set_tf32(C, false)
  for _, dt in ipairs {"f32", "bf16", "f16"} do
    for _, mkn in ipairs {{1, 1, 1}, {7, 13, 5}, {33, 65, 17}, {64, 128, 96}} do
      local M, K, N = mkn[1], mkn[2], mkn[3]
      local x, w, b, dy = rand({M, K}, dt), rand({N, K}, dt), rand({N}, dt), rand({M, N}, dt)
      local xd, wd, bd, dyd = doubles(x), doubles(w), doubles(b), doubles(dy)
      for act = 0, 1 do
        local want = ffi.new("double[?]", M * N)
        for i = 0, M - 1 do
          for j = 0, N - 1 do
            local acc = bd[j]
            for k = 0, K - 1 do acc = acc + xd[i * K + k] * wd[j * K + k] end
            want[i * N + j] = act == 1 and gelu(acc) or acc
          end
        end
        local out = lt.empty({M, N}, {dtype = dt, device = device})
        assert(C.lt_cuda_linear_forward(out, x:to(device), w:to(device), b:to(device), act) == 0,
               ffi.string(C.lt_last_error()))
        check(act == 1 and "linear gelu" or "linear bias", {M, N}, dt, out:cpu(), want)
      end
      -- dw (N, K) = dy^T @ x, db (N) = dy summed over rows
      local want_dw, want_db = ffi.new("double[?]", N * K), ffi.new("double[?]", N)
      for j = 0, N - 1 do
        local db = 0
        for i = 0, M - 1 do db = db + dyd[i * N + j] end
        want_db[j] = db
        for k = 0, K - 1 do
          local acc = 0
          for i = 0, M - 1 do acc = acc + dyd[i * N + j] * xd[i * K + k] end
          want_dw[j * K + k] = acc
        end
      end
      local dw, db = lt.empty({N, K}, {dtype = dt, device = device}), lt.empty({N}, {dtype = dt, device = device})
      assert(C.lt_cuda_linear_backward_params(dw, db, dy:to(device), x:to(device)) == 0, ffi.string(C.lt_last_error()))
      check("linear dw", {N, K}, dt, dw:cpu(), want_dw)
      check("linear dbias", {N}, dt, db:cpu(), want_db)
    end
  end
end

return function(st)
  uniform = st.uniform
  run_matmul_cases(st.lt, st.C, st.device, st.report)
  run_linear_cases(st.lt, st.C, st.device, st.report)
end
