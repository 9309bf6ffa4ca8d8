-- lutra.selftest.reduce — reductions (sum, mean, max, min, prod, norm), var, argmax/argmin
-- and softmax/log_softmax forward and backward (kernels/reduce.cu, kernels/softmax.cu) on
-- st.device against the CPU on the same inputs: odd sizes, a row longer than a block
-- (65537), empty and size-1 dims, every dim set incl. all dims and non-adjacent ones,
-- keepdim, non-contiguous (strided, transposed) inputs, ties, NaN and -inf.
--
-- Tolerances (st.check: max abs error <= tol * max(1, max |want|)):
-- * sum, mean, prod, norm, var: both sides accumulate in double, in different orders; the
--   double results differ by about n * 2^-53 * max|x| (~1e-11 at n = 65537), so once rounded
--   to the output dtype they agree or differ by one rounding: 2 ulp of the output dtype
--   (f32 2^-22, bf16 2^-7, f16 2^-10). f64 keeps the double difference itself: 1e-9 leaves
--   a wide margin over n * 2^-53 with random signs.
-- * max, min, argmax, argmin, and every integer reduction: exact (tol 0): no rounding, and
--   integer sums wrap identically in int64.
-- * softmax, log_softmax (f32 compute for f32/bf16/f16): the device expf is within 2 ulp and
--   the CPU's polynomial exp within ~1 ulp, the sum of exp runs in another order (f32 runs
--   added in double), and the output multiplies by 1/sum: a few ulp, tol 2^-19 (16 ulp of 1)
--   for f32; bf16/f16 outputs round once from those f32 values: one ulp of the output,
--   2^-7 / 2^-10. f64: exp within 1 ulp on both sides, tol 1e-13.
-- * backward: sum(grad_out * y) / sum(grad_out) in f32 runs of 512 in another order: a few
--   ulp of the sum, times |y| <= 1: tol 2^-17 for f32; bf16/f16 as forward, f64 1e-13.
local ffi = require "ffi"

local REDUCE_TOL = {f32 = 2 ^ -22, f64 = 1e-9, bf16 = 2 ^ -7, f16 = 2 ^ -10}
local SOFTMAX_TOL = {f32 = 2 ^ -19, f64 = 1e-13, bf16 = 2 ^ -7, f16 = 2 ^ -10}
local BACKWARD_TOL = {f32 = 2 ^ -17, f64 = 1e-13, bf16 = 2 ^ -7, f16 = 2 ^ -10}
local FLOATS = {"f32", "f64", "bf16", "f16"}
local INTS = {"i32", "i64", "u8"}

return function(st)
  local lt, C = st.lt, st.C

  local function numel(shape)
    local n = 1
    for _, d in ipairs(shape) do n = n * d end
    return n
  end

  -- t (a CPU tensor) with the element at flat index i set to v
  local function set_flat(t, i, v)
    local nd = #t.shape
    local idx = ffi.new("int64_t[?]", math.max(nd, 1))
    for d = nd, 1, -1 do
      idx[d - 1] = i % t.shape[d]
      i = math.floor(i / t.shape[d])
    end
    assert(C.lt_set_at(t, idx, v) == 0, ffi.string(C.lt_last_error()))
  end

  -- x's values as every other element of the last dim of a tensor twice as wide, on the
  -- device: made strided on the CPU and moved whole, so that no strided copy runs on the device
  local function strided(x)
    local shape = {}
    for i, d in ipairs(x.shape) do shape[i] = d end
    if #shape == 0 then return st.to_device(x) end
    shape[#shape] = shape[#shape] * 2
    local big = lt.empty(shape, {dtype = x.dtype})
    big:slice(#shape - 1, 0, nil, 2):copy_(x)
    return st.to_device(big):slice(#shape - 1, 0, nil, 2)
  end

  -- The layouts a case runs on, on the device: as is, and two non-contiguous ones (label
  -- " nc"): strided (every other element), and (2+ dims) stored with the first and last dims
  -- swapped, then swapped back as a view: same shape and values, the innermost dim no longer
  -- the smallest stride. Both are built on the CPU and moved as contiguous tensors.
  local function layouts(x)
    local d = st.to_device(x)
    local out = {{"", d}, {" nc", strided(x)}}
    local nd = #x.shape
    if nd >= 2 then
      local t = st.to_device(x:transpose(0, nd - 1):contiguous())
      out[#out + 1] = {" nc", t:transpose(0, nd - 1)}
    end
    return out
  end

  -- Dim sets for a shape: all (nil), each single dim, first + last (non-adjacent with 3 dims).
  local function dim_sets(nd)
    local sets = {false}
    for d = 0, nd - 1 do sets[#sets + 1] = d end
    if nd >= 2 then sets[#sets + 1] = {0, nd - 1} end
    return sets
  end

  local function dims_arg(s) if s == false then return nil end return s end

  local function first(a) return a end -- max/min with one dim also return indices

  local function reduce_case(name, x, dt, tol, inputs)
    for _, lay in ipairs(inputs) do
      for k, s in ipairs(dim_sets(#x.shape)) do
        local keep = k % 2 == 0
        local dims = dims_arg(s)
        local want = first(x[name](x, dims, keep))
        local got = first(lay[2][name](lay[2], dims, keep))
        st.check(name .. lay[1], dt, got, want, tol)
      end
    end
  end

  local shapes = st.shapes()
  shapes[#shapes + 1] = {5, 1, 3}
  shapes[#shapes + 1] = {2, 65537}
  shapes[#shapes + 1] = {65537, 2}

  -- ---- reductions ------------------------------------------------------------------
  for _, shape in ipairs(shapes) do
    for _, dt in ipairs(FLOATS) do
      local x = st.rand(shape, dt, -1, 1)
      local inputs = layouts(x)
      for _, name in ipairs {"sum", "mean", "norm"} do reduce_case(name, x, dt, REDUCE_TOL[dt], inputs) end
      for _, name in ipairs {"max", "min"} do reduce_case(name, x, dt, 0, inputs) end
      local p = st.rand(shape, dt, 0.95, 1.05) -- products that stay in range
      reduce_case("prod", p, dt, REDUCE_TOL[dt], layouts(p))
      -- var, unbiased and not, over the same dim sets
      for _, lay in ipairs(inputs) do
        for k, s in ipairs(dim_sets(#shape)) do
          local corr = k % 2
          st.check("var" .. lay[1], dt, lay[2]:var(dims_arg(s), k % 3 == 0, corr), x:var(dims_arg(s), k % 3 == 0, corr),
                   REDUCE_TOL[dt])
        end
      end
      -- NaN wins max and min wherever it is
      local xn = x:clone()
      set_flat(xn, math.floor(numel(shape) / 2), 0 / 0)
      for _, name in ipairs {"max", "min"} do
        for k, s in ipairs(dim_sets(#shape)) do
          st.check(name .. " nan", dt, first(st.to_device(xn)[name](st.to_device(xn), dims_arg(s), k % 2 == 0)),
                   first(xn[name](xn, dims_arg(s), k % 2 == 0)), 0)
        end
      end
    end
    for _, dt in ipairs(INTS) do
      local lo, hi = dt == "u8" and 0 or -1000, dt == "u8" and 256 or 1000
      local x = st.rand(shape, dt, lo, hi)
      local inputs = layouts(x)
      for _, name in ipairs {"sum", "max", "min"} do reduce_case(name, x, dt, 0, inputs) end
      local p = st.rand(shape, dt, dt == "u8" and 0 or -3, 4) -- wraps in int64 on both sides
      reduce_case("prod", p, dt, 0, layouts(p))
    end
    local b = st.rand(shape, "i32", 0, 2):to("bool")
    for _, name in ipairs {"max", "min"} do reduce_case(name, b, "bool", 0, layouts(b)) end
  end

  -- empty: a reduced dim of 0 (sum 0, mean nan, prod 1, norm 0, var nan), no outputs at all
  for _, dt in ipairs(FLOATS) do
    for _, shape in ipairs {{4, 0}, {0, 5}, {3, 0, 2}, {0}} do
      local x = st.rand(shape, dt)
      local d = st.to_device(x)
      for _, name in ipairs {"sum", "mean", "prod", "norm"} do
        for _, s in ipairs(dim_sets(#shape)) do
          st.check(name .. " empty", dt, d[name](d, dims_arg(s)), x[name](x, dims_arg(s)), 0)
        end
      end
      st.check("var empty", dt, d:var(#shape - 1), x:var(#shape - 1), 0)
      local ok_cpu = pcall(x.max, x, 1)
      local ok_dev = pcall(d.max, d, 1)
      st.report("max empty refused", shape, dt, 0, 0, ok_cpu == ok_dev)
    end
  end

  -- ---- argmax / argmin -------------------------------------------------------------
  local function arg_cases(x, dt, label)
    for _, lay in ipairs(layouts(x)) do
      for _, name in ipairs {"argmax", "argmin"} do
        st.check(name .. label .. lay[1], dt, lay[2][name](lay[2], nil, false), x[name](x, nil, false), 0)
        st.check(name .. label .. lay[1], dt, lay[2][name](lay[2], nil, true), x[name](x, nil, true), 0)
        for d = 0, #x.shape - 1 do
          st.check(name .. label .. lay[1], dt, lay[2][name](lay[2], d, d % 2 == 1), x[name](x, d, d % 2 == 1), 0)
        end
      end
    end
  end
  for _, shape in ipairs(shapes) do
    for _, dt in ipairs {"f32", "f64", "bf16", "f16", "i32", "i64", "u8", "bool"} do
      -- few distinct values: ties everywhere, the first index must win
      local x = st.rand(shape, "i32", 0, dt == "bool" and 2 or 4):to(dt)
      arg_cases(x, dt, " ties")
      if dt == "f32" or dt == "bf16" then
        local xr = st.rand(shape, dt, -1, 1)
        arg_cases(xr, dt, "")
        local n = numel(shape)
        set_flat(xr, n - 1, 0 / 0) -- NaN wins; with two, the first
        if n > 2 then set_flat(xr, math.floor(n / 3), 0 / 0) end
        arg_cases(xr, dt, " nan")
      end
    end
  end

  -- ---- softmax, log_softmax, forward and backward ----------------------------------
  local F = lt.F
  for _, shape in ipairs(shapes) do
    local nd = #shape
    local dims = {nd - 1}
    if nd >= 2 then dims[#dims + 1] = 0 end
    if nd >= 3 then dims[#dims + 1] = 1 end
    for _, dt in ipairs(FLOATS) do
      local x = st.rand(shape, dt, -5, 5)
      local masked = x:clone() -- -inf entries (attention masks) and a NaN
      local n = numel(shape)
      for i = 0, n - 1, 3 do set_flat(masked, i, -1 / 0) end
      if n > 7 then set_flat(masked, 7, 0 / 0) end
      for _, dim in ipairs(dims) do
        for _, input in ipairs {{"", x}, {" inf/nan", masked}} do
          for _, lay in ipairs(layouts(input[2])) do
            local tag = input[1] .. lay[1]
            local s_want, l_want = input[2]:softmax(dim), input[2]:log_softmax(dim)
            st.check("softmax" .. tag, dt, lay[2]:softmax(dim), s_want, SOFTMAX_TOL[dt])
            st.check("log_softmax" .. tag, dt, lay[2]:log_softmax(dim), l_want, SOFTMAX_TOL[dt])
            if input[1] == "" then
              local g = st.rand(shape, dt, -1, 1)
              local gd = st.to_device(g)
              st.check("softmax_backward" .. tag, dt, F.softmax_backward(gd, st.to_device(s_want), dim),
                       F.softmax_backward(g, s_want, dim), BACKWARD_TOL[dt])
              st.check("log_softmax_backward" .. tag, dt, F.log_softmax_backward(gd, strided(l_want), dim),
                       F.log_softmax_backward(g, l_want, dim), BACKWARD_TOL[dt])
            end
          end
        end
      end
    end
  end
end
