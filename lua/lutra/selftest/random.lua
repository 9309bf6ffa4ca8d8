-- lutra.selftest.random — the counter-based random numbers on st.device against the CPU with the
-- same seed and offset (kernels/random.cu; host/ops/philox.h on both sides): uniform, normal, int
-- and bernoulli over every dtype, offsets that are not a multiple of 4 or that wrap, strided
-- outputs, and i64 ints over the full range.
--
-- Tolerances (st.check passes when max abs err <= tol * max(1, max |want|)):
--   exact (0): uniform, int and bernoulli (the same integer and double operations).
--   normal: its log and cos are libdevice's on the GPU and libm's on the CPU, both faithful in
--     double but not always equal in the last bit: f64 to 8 ulp; f32/bf16/f16 round that double,
--     so they agree unless it lies within an ulp of a rounding boundary (about 2^-29 per value for
--     f32): one f32 ulp (2^-22 of the scale, values up to ~5), bf16/f16 exact.
local ffi = require "ffi"

return function(st)
  local C, device = st.C, st.device
  local ok, empty, guarded = st.ok, st.empty, st.guarded
  local ALL = {"f32", "f64", "bf16", "f16", "i32", "i64", "u8", "bool"}
  local NORMAL_TOL = {f32 = 2 ^ -22, f64 = 2 ^ -49, bf16 = 0, f16 = 0}
  local seeds = {0x123456789ABCDEFULL, 7ULL}
  local offsets = {3ULL, 0x100000005ULL, 0xFFFFFFFFFFFFFFFDULL} -- none a multiple of 4; the last wraps
  for si, shape in ipairs {{1}, {7}, {1023}, {65537}, {3, 5, 7}} do
    for _, dt in ipairs(ALL) do
      local float = dt == "f32" or dt == "f64" or dt == "bf16" or dt == "f16"
      guarded("rand", shape, dt, function()
        local seed, offset = seeds[si % 2 + 1], offsets[si % 3 + 1]
        local function both(label, fill, tol)
          local c = empty(shape, dt)
          ok(fill(c))
          local d = empty(shape, dt, device)
          ok(fill(d))
          st.check(label, dt, d, c, tol)
          if si == 5 then -- a strided out: element i is still counter offset + i
            local dv = st.noncontig(empty(shape, dt, device))
            ok(fill(dv))
            st.check(label .. " strided", dt, dv, c, tol)
          end
        end
        if float then
          both("rand_uniform", function(t) return C.lt_rand_uniform(t, seed, offset, -2.5, 3) end, 0)
          both("rand_uniform narrow", function(t) return C.lt_rand_uniform(t, seed, offset, 1, 1.0078125) end, 0)
          both("rand_normal", function(t) return C.lt_rand_normal(t, seed, offset, 0.5, 2) end, NORMAL_TOL[dt])
        end
        if dt ~= "bool" then
          local lo, hi = -1000, 777
          if dt == "u8" then lo, hi = 3, 250 end
          both("rand_int", function(t) return C.lt_rand_int(t, seed, offset, lo, hi) end, 0)
        end
        both("rand_bernoulli", function(t) return C.lt_rand_bernoulli(t, seed, offset, 0.3) end, 0)
      end)
    end
  end
  -- i64 over the full range: values past 2^53, compared as integers
  guarded("rand_int i64 full", {4097}, "i64", function()
    local lo, hi = -0x7FFFFFFFFFFFFFF0LL, 0x7FFFFFFFFFFFFFFFLL
    local c, d = empty({4097}, "i64"), empty({4097}, "i64", device)
    ok(C.lt_rand_int(c, 99ULL, 5ULL, lo, hi))
    ok(C.lt_rand_int(d, 99ULL, 5ULL, lo, hi))
    local dc = d:cpu():contiguous()
    local pc, pd = ffi.cast("const int64_t *", C.lt_data_ptr(c)), ffi.cast("const int64_t *", C.lt_data_ptr(dc))
    local bad = 0
    for i = 0, 4096 do if pc[i] ~= pd[i] then bad = bad + 1 end end
    st.report("rand_int i64 full range", {4097}, "i64", bad == 0 and 0 or math.huge, 0, bad == 0)
  end)
end
