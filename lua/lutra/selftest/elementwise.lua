-- lutra.selftest.elementwise — the elementwise family on st.device against the CPU on the same
-- inputs (kernels/unary.cu, binary.cu, kernels/copy.cu, elementwise.cu): every unary op and its
-- backward, every binary op (same shape, broadcast row and column, non-contiguous operands and
-- output, in place), the scalar forms in both orders, where, clamp, copies between every pair of
-- dtypes (strided, broadcast, across devices), fill of a strided view, arange and linspace; every
-- dtype each op takes; shapes from st.shapes() (odd sizes, 1 to 65537 elements).
--
-- Tolerances (st.check passes when max abs err <= tol * max(1, max |want|)):
--   exact (0): everything whose result is one correctly rounded IEEE operation or a selection on
--     both sides: neg, abs, relu, square, sqrt, rsqrt (1/sqrt), reciprocal and their backwards,
--     log's backward (g/x); add, sub, mul, div, maximum, minimum, comparisons; integer ops (the
--     same wrapping); where, clamp, copies and conversions (the same rounding code, host/core/internal.h),
--     fill (the host's bits); arange/linspace (one fused multiply-add on both sides). bf16/f16
--     compute in f32 on both sides and round the same f32 value, so they are exact too.
--   exp, log, tanh, sigmoid, gelu, gelu_erf, erf, silu, sin, cos, pow and the backwards built on them: the
--     device's expf/logf/tanhf/sinf/cosf are within 2 ulp of exact and powf within 4 (CUDA
--     programming guide, appendix on math functions); the CPU's f32 exp and tanh are its own
--     polynomials (~1.5 ulp, host/ops/vecmath.h), glibc's others within 1; f64 both within 1-2 ulp;
--     and the GPU may fuse a*b+c in the GELU/SiLU forms. So f32 1e-6 (~8 ulp of the scale), f64
--     1e-14; bf16/f16 round an f32 value that may differ by an ulp, so one unit of the 16-bit type
--     may differ: bf16 2^-7, f16 2^-10 of the scale.
local ffi = require "ffi"

return function(st)
  local lt, C = st.lt, st.C
  local device = st.device
  local ALL = {"f32", "f64", "bf16", "f16", "i32", "i64", "u8", "bool"}
  local FLOAT = {f32 = true, f64 = true, bf16 = true, f16 = true}
  local TOL = {f32 = 1e-6, f64 = 1e-14, bf16 = 2 ^ -7, f16 = 2 ^ -10}

  local function ok(rc) if rc ~= 0 then error(ffi.string(C.lt_last_error()), 2) end end
  local function empty(shape, dt, dev) return lt.empty(shape, {dtype = dt, device = dev or "cpu"}) end
  local function guarded(op, shape, dt, f)
    local fine, msg = pcall(f)
    if not fine then
      print(string.format("  %s %s: %s", op, dt, tostring(msg)))
      st.report(op, shape, dt, math.huge, math.huge, false)
    end
  end
  local function numel(shape)
    local n = 1
    for _, d in ipairs(shape) do n = n * d end
    return n
  end
  local function copy_shape(shape)
    local s = {}
    for i, d in ipairs(shape) do s[i] = d end
    return s
  end

  -- A CPU tensor of dt with values in [lo, hi) (integers: truncated; bool: half true).
  local function input(shape, dt, lo, hi)
    if dt == "bool" then
      local u, out = st.rand(shape, "f32", 0, 1), empty(shape, "bool")
      ok(C.lt_binary_scalar(out, u, 0.5, C.LT_GT, 0))
      return out
    end
    return st.rand(shape, dt, lo, hi)
  end
  local function set_first(t, v) -- a special value at element 0 (NaN: kept by clamp, max, min)
    local idx = ffi.new("int64_t[8]")
    ok(C.lt_set_at(t, idx, v))
  end
  -- t on the device, contiguous or strided
  local function on_device(t, strided)
    local d = st.to_device(t)
    return strided and st.noncontig(d) or d
  end
  -- an output on the device, contiguous or a strided view
  local function dev_out(shape, dt, strided)
    local o = empty(shape, dt, device)
    return strided and st.noncontig(o) or o
  end

  local shapes = st.shapes()
  -- the biggest shape only for the cheaper sweeps, so that --device=cpu stays quick
  local function small_shapes()
    local s = {}
    for _, shape in ipairs(shapes) do if numel(shape) < 20000 then s[#s + 1] = shape end end
    return s
  end

  -- ---- unary and its backward --------------------------------------------------------------------

  local UNARY_EXACT = {[C.LT_NEG] = true, [C.LT_SQRT] = true, [C.LT_RSQRT] = true, [C.LT_RELU] = true,
                       [C.LT_ABS] = true, [C.LT_SQUARE] = true, [C.LT_RECIPROCAL] = true}
  local BACKWARD_EXACT = {[C.LT_LOG] = true}
  for k in pairs(UNARY_EXACT) do BACKWARD_EXACT[k] = true end
  local INT_UNARY = {[C.LT_NEG] = true, [C.LT_ABS] = true, [C.LT_RELU] = true, [C.LT_SQUARE] = true}

  for si, shape in ipairs(shapes) do
    for op = 0, C.LT_NUM_UNARY_OPS - 1 do
      local name = ffi.string(C.lt_unary_name(op))
      for _, dt in ipairs(ALL) do
        if FLOAT[dt] or (dt ~= "bool" and INT_UNARY[op]) then
          guarded(name, shape, dt, function()
            local lo, hi = -3, 3
            if op == C.LT_LOG or op == C.LT_SQRT or op == C.LT_RSQRT then lo = 0.05 end
            if dt == "u8" then lo, hi = 0, 256 elseif not FLOAT[dt] then lo, hi = -70000, 70000 end -- squares wrap
            local a = input(shape, dt, lo, hi)
            local want = empty(shape, dt)
            ok(C.lt_unary(want, a, op))
            local strided = (si + op) % 2 == 1
            local got = dev_out(shape, dt, not strided)
            ok(C.lt_unary(got, on_device(a, strided), op))
            st.check(name, dt, got, want, UNARY_EXACT[op] and 0 or TOL[dt])
            if FLOAT[dt] then
              local g = input(shape, dt, -1, 1)
              local gw = empty(shape, dt)
              ok(C.lt_unary_backward(gw, g, a, op))
              local gi = dev_out(shape, dt, strided)
              ok(C.lt_unary_backward(gi, on_device(g, not strided), on_device(a, strided), op))
              st.check(name .. "_backward", dt, gi, gw, BACKWARD_EXACT[op] and 0 or 4 * TOL[dt])
            end
          end)
        end
      end
    end
  end

  -- ---- binary: broadcast, strided, in place, scalars ------------------------------------------------

  local function binary_ok(op, dt)
    if FLOAT[dt] then return true end
    if dt == "bool" then return op >= C.LT_EQ end
    return op ~= C.LT_DIV and op ~= C.LT_POW
  end
  local function binary_range(op, dt)
    if op == C.LT_POW then return 0.1, 3 end
    if dt == "u8" then return 0, 256 end
    if dt == "i32" or dt == "i64" then return -2 ^ 31, 2 ^ 31 - 1 end -- products and sums wrap
    return -4, 4
  end

  for si, shape in ipairs(small_shapes()) do
    local row = {shape[#shape]}       -- broadcast along every leading dim
    local col = copy_shape(shape)     -- broadcast along the last dim
    col[#col] = 1
    for op = 0, C.LT_NUM_BINARY_OPS - 1 do
      local name = ffi.string(C.lt_binary_name(op))
      local compare = op >= C.LT_EQ
      for _, dt in ipairs(ALL) do
        if binary_ok(op, dt) then
          local odt = compare and "bool" or dt
          local tol = op == C.LT_POW and TOL[dt] or 0
          guarded(name, shape, dt, function()
            local lo, hi = binary_range(op, dt)
            local a = input(shape, dt, lo, hi)
            if FLOAT[dt] and op ~= C.LT_POW then set_first(a, 0 / 0) end
            for vi, bshape in ipairs {shape, row, col} do
              local b = input(bshape, dt, op == C.LT_POW and -2 or lo, op == C.LT_POW and 2 or hi)
              if vi == 1 and numel(shape) > 1 then -- some equal pairs, for eq/le/ge and maximum ties
                local half = empty(shape, dt)
                ok(C.lt_copy(half, a))
                b = half
                set_first(b, 1)
              end
              local want = empty(shape, odt)
              ok(C.lt_binary(want, a, b, op))
              local strided = (si + vi + op) % 2 == 1
              local got = dev_out(shape, odt, vi == 2)
              ok(C.lt_binary(got, on_device(a, strided), on_device(b, not strided), op))
              st.check(name, dt, got, want, tol)
              if not compare and vi ~= 1 then -- in place: out == a
                local ad = on_device(a, strided)
                ok(C.lt_binary(ad, ad, on_device(b, false), op))
                st.check(name .. " in place", dt, ad, want, tol)
              end
            end
            for _, s in ipairs {dt == "bool" and 1 or FLOAT[dt] and 0.75 or 3, op == C.LT_POW and 2 or nil} do
              for reverse = 0, 1 do
                local want = empty(shape, odt)
                ok(C.lt_binary_scalar(want, a, s, op, reverse))
                local got = dev_out(shape, odt, reverse == 1)
                ok(C.lt_binary_scalar(got, on_device(a, reverse == 0), s, op, reverse))
                st.check(name .. (reverse == 1 and " scalar reversed" or " scalar"), dt, got, want, tol)
              end
            end
          end)
        end
      end
    end
  end

  -- ---- where and clamp ------------------------------------------------------------------------------

  for si, shape in ipairs(shapes) do
    local row = {shape[#shape]}
    for _, dt in ipairs(ALL) do
      guarded("where", shape, dt, function()
        local cond = input(shape, "bool")
        if si % 2 == 0 then -- a u8 condition
          local c8 = empty(shape, "u8")
          ok(C.lt_copy(c8, cond))
          cond = c8
        end
        local a, b = input(shape, dt, -100, 100), input(row, dt, -9, 9)
        local want = empty(shape, dt)
        ok(C.lt_where(want, cond, a, b))
        local got = dev_out(shape, dt, si % 2 == 1)
        ok(C.lt_where(got, on_device(cond, si % 3 == 0), on_device(a, si % 2 == 0), on_device(b, true)))
        st.check("where", dt, got, want, 0)
      end)
      if dt ~= "bool" then
        guarded("clamp", shape, dt, function()
          local lo, hi = -0.5, 0.6
          if dt == "u8" then lo, hi = 10.5, 200.2 elseif not FLOAT[dt] then lo, hi = -100.5, 200.2 end
          local a = input(shape, dt, FLOAT[dt] and -1 or dt == "u8" and 0 or -300, FLOAT[dt] and 1 or 256)
          if FLOAT[dt] then set_first(a, 0 / 0) end
          local want = empty(shape, dt)
          ok(C.lt_clamp(want, a, lo, hi))
          local got = dev_out(shape, dt, si % 2 == 0)
          ok(C.lt_clamp(got, on_device(a, si % 2 == 1), lo, hi))
          st.check("clamp", dt, got, want, 0)
        end)
      end
    end
  end

  -- ---- copies with conversion, fill, sequences --------------------------------------------------------

  for si, shape in ipairs(small_shapes()) do
    local row = {shape[#shape]}
    for _, sdt in ipairs(ALL) do
      for _, ddt in ipairs(ALL) do
        guarded("copy strided", shape, sdt .. "->" .. ddt, function()
          -- values every destination holds (C leaves float -> int out of range undefined)
          local src = input(si % 2 == 0 and row or shape, sdt, 0, 100)
          if FLOAT[sdt] and FLOAT[ddt] then set_first(src, 0 / 0) end
          local want = empty(shape, ddt)
          ok(C.lt_copy(want, src))
          local got = dev_out(shape, ddt, si % 2 == 1)
          ok(C.lt_copy(got, on_device(src, si % 3 ~= 0)))
          st.check("copy strided", sdt .. "->" .. ddt, got, want, 0)
          if sdt == "f32" or ddt == "f32" then -- across devices, strided on both ends
            local back = st.noncontig(empty(shape, sdt))
            ok(C.lt_copy(back, got))
            local wback = empty(shape, sdt)
            ok(C.lt_copy(wback, want))
            st.check("copy d2h strided", ddt .. "->" .. sdt, back, wback, 0)
            local up = dev_out(shape, ddt, true)
            ok(C.lt_copy(up, st.noncontig(want)))
            st.check("copy h2d strided", ddt, up, want, 0)
          end
        end)
      end
    end
  end

  for _, shape in ipairs(shapes) do
    for _, dt in ipairs(ALL) do
      guarded("fill strided", shape, dt, function()
        local v = dt == "bool" and 1 or dt == "u8" and 200 or FLOAT[dt] and -1 / 3 or -5
        local last = #shape - 1
        local want = empty(shape, dt)
        ok(C.lt_fill(want, 0))
        ok(C.lt_fill(want:slice(last, 1, nil, 3), v))
        local got = empty(shape, dt, device)
        ok(C.lt_fill(got, 0))
        ok(C.lt_fill(got:slice(last, 1, nil, 3), v))
        st.check("fill strided", dt, got, want, 0)
      end)
    end
  end

  local dev_id = require("lutra.dtype").device_id(device)
  local function dtype_id(dt)
    local id = ffi.new("int[1]")
    ok(C.lt_dtype_from_name(dt, id))
    return id[0]
  end
  for _, n in ipairs {1, 7, 1023, 65537} do
    for _, dt in ipairs(ALL) do
      guarded("arange", {n}, dt, function()
        -- integers truncate each start + i * step; values stay in the dtype's range (C leaves
        -- out-of-range float -> int conversions undefined)
        local start, step = -5.5, 0.3
        if dt == "bool" then start, step = 0, 0.02 elseif dt == "u8" then start, step = 0, 250.3 / n end
        local stop = start + n * step
        local want = lt.arange(start, stop, step, {dtype = dt})
        local got = empty({want.shape[1] * 2}, dt, device):slice(0, 0, nil, 2) -- a strided out
        ok(C.lt_arange(got, start, stop, step, dtype_id(dt), dev_id))
        st.check("arange", dt, got, want, 0)
        local lw = lt.linspace(start, start + n * step * 0.37, n, {dtype = dt})
        local lg = empty({n}, dt, device)
        ok(C.lt_linspace(lg, start, start + n * step * 0.37, n, dtype_id(dt), dev_id))
        st.check("linspace", dt, lg, lw, 0)
      end)
    end
  end
end
