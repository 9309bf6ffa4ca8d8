-- lutra.selftest.nn_ops — the fused nn ops on st.device against the CPU on the same inputs:
-- cross-entropy (forward, backward), embedding (forward, backward), rope, and the counter-based
-- random numbers (kernels/cross_entropy.cu, embedding.cu, rope.cu, kernels/random.cu).
--
-- Tolerances (st.check passes when max abs err <= tol * max(1, max |want|)):
--   exact (0): embedding forward (a copy) and backward (the GPU sums each id's rows in position
--     order from 0, in f32 for 16-bit, as the CPU does: the same bits); the RNG's uniform, int
--     and bernoulli (the same integer and double operations through host/ops/philox.h); the error
--     messages of out-of-range indices.
--   normal RNG: its log and cos are libdevice's on the GPU and libm's on the CPU, both faithful
--     in double but not always equal in the last bit: f64 to 8 ulp; f32/bf16/f16 round that
--     double, so they agree unless it lies within an ulp of a rounding boundary (about 2^-29
--     per value for f32): one f32 ulp (2^-22 of the scale, values up to ~5), bf16/f16 exact.
--   cross-entropy forward: expf and a different summation order over V terms (the CPU sums 8
--     lanes sequentially, the GPU per thread then a tree): lse agrees to ~1e-6 relative for
--     V ~ 50k, and the loss (~log V) to 3e-5 of its scale; f64 to 1e-12.
--   cross-entropy backward (given the CPU's lse): only exp differs, by ~2 ulp: f32 1e-6; bf16
--     and f16 outputs may round the other way by one unit of values up to 1.5 (dl * (p - 1)):
--     2^-6 and 2^-9; f64 1e-14.
--   rope: frequencies and angles are the CPU's bits; cos/sin in double differ by ~1 ulp, which
--     survives rounding to f32 only next to a tie; the CPU build may fuse a product into an FMA
--     (-mfma) where the GPU rounds each: an ulp or two of values up to ~1.4, so f32 2^-21, bf16
--     2^-6, f16 2^-9 (one unit of the output either way), f64 1e-14.
local ffi = require "ffi"

return function(st)
  local lt, C, device = st.lt, st.C, st.device
  local FLOATS = {"f32", "f64", "bf16", "f16"}

  local function err() return ffi.string(C.lt_last_error()) end
  local function ok(rc) if rc ~= 0 then error(err(), 2) end end
  local function empty(shape, dtype, dev) return lt.empty(shape, {dtype = dtype, device = dev or "cpu"}) end
  local function numel(shape)
    local n = 1
    for _, d in ipairs(shape) do n = n * d end
    return n
  end
  -- a CPU integer tensor of `dtype` with values f(i), i = 0 .. numel - 1
  local function ints(shape, dtype, f)
    local n = numel(shape)
    local buf = ffi.new("double[?]", math.max(n, 1))
    for i = 0, n - 1 do buf[i] = f(i) end
    local t = empty(shape, dtype)
    ok(C.lt_copy_from_buffer(t, buf, C.LT_F64, n))
    return t
  end
  local function randint(lo, hi) return lo + math.floor(st.uniform() * (hi - lo)) end
  -- runs f(), reporting an error it raises as a failed row instead of ending the self-test
  local function guarded(op, shape, dtype, f)
    local fine, msg = pcall(f)
    if not fine then
      print(string.format("  %s %s: %s", op, dtype, tostring(msg)))
      st.report(op, shape, dtype, math.huge, math.huge, false)
    end
  end
  -- both sides fail with the same message (devices aside)
  local function same_error(op, shape, dtype, call_cpu, call_dev)
    local rc1 = call_cpu()
    local m1 = rc1 ~= 0 and err() or "(no error)"
    local rc2 = call_dev()
    local m2 = rc2 ~= 0 and err() or "(no error)"
    local fine = rc1 ~= 0 and m1 == m2
    if not fine then print(string.format("  %s: cpu says '%s', %s says '%s'", op, m1, device, m2)) end
    st.report(op, shape, dtype, fine and 0 or math.huge, 0, fine)
  end

  -- ---- cross-entropy ------------------------------------------------------------------------
  local CE_FWD_TOL = {f32 = 3e-5, bf16 = 3e-5, f16 = 3e-5, f64 = 1e-12}
  local CE_BWD_TOL = {f32 = 1e-6, bf16 = 2 ^ -6, f16 = 2 ^ -9, f64 = 1e-14}
  local IGNORE = -100
  for _, nv in ipairs {{3, 7}, {4, 50257}, {1, 1}, {9, 1000}, {2, 65537}, {5, 32}} do
    local N, V = nv[1], nv[2]
    for _, dt in ipairs(FLOATS) do
      guarded("cross_entropy", nv, dt, function()
        local x = st.rand({N, V}, dt, -6, 6)
        local tdt = V % 2 == 0 and "i32" or "i64"
        local tg = ints({N}, tdt, function(i) return i % 3 == 1 and IGNORE or randint(0, V) end)
        local dl = st.rand({N}, "f32", 0.5, 1.5)
        -- CPU reference
        local l_c, s_c = empty({N}, "f32"), empty({N}, "f32")
        ok(C.lt_cross_entropy_forward(l_c, s_c, x, tg, IGNORE))
        local g_c = empty({N, V}, dt)
        ok(C.lt_cross_entropy_backward(g_c, dl, x, tg, s_c, IGNORE))
        -- the device: contiguous logits, then a strided view of the same values
        for _, strided in ipairs {false, true} do
          local xd = st.to_device(x)
          if strided then xd = st.noncontig(xd) end
          local tgd = st.to_device(tg)
          local l_d, s_d = empty({N}, "f32", device), empty({N}, "f32", device)
          ok(C.lt_cross_entropy_forward(l_d, s_d, xd, tgd, IGNORE))
          local sfx = strided and " strided" or ""
          st.check("cross_entropy loss" .. sfx, dt, l_d, l_c, CE_FWD_TOL[dt])
          st.check("cross_entropy lse" .. sfx, dt, s_d, s_c, CE_FWD_TOL[dt])
          local g_d = empty({N, V}, dt, device)
          ok(C.lt_cross_entropy_backward(g_d, st.to_device(dl), xd, tgd, st.to_device(s_c), IGNORE))
          st.check("cross_entropy backward" .. sfx, dt, g_d, g_c, CE_BWD_TOL[dt])
        end
        if dt == "f32" and V > 1 then -- in place: dlogits written over the logits
          local xd = st.to_device(x)
          ok(C.lt_cross_entropy_backward(xd, st.to_device(dl), xd, st.to_device(tg), st.to_device(s_c), IGNORE))
          st.check("cross_entropy backward in place", dt, xd, g_c, CE_BWD_TOL[dt])
        end
      end)
    end
  end
  -- f64 logits with f64 losses and lse (the gradient-check precision)
  guarded("cross_entropy f64 out", {6, 333}, "f64", function()
    local x = st.rand({6, 333}, "f64", -3, 3)
    local tg = ints({6}, "i64", function(i) return i == 2 and IGNORE or randint(0, 333) end)
    local l_c, s_c, l_d, s_d = empty({6}, "f64"), empty({6}, "f64"), empty({6}, "f64", device), empty({6}, "f64", device)
    ok(C.lt_cross_entropy_forward(l_c, s_c, x, tg, IGNORE))
    ok(C.lt_cross_entropy_forward(l_d, s_d, st.to_device(x), st.to_device(tg), IGNORE))
    st.check("cross_entropy loss f64 out", "f64", l_d, l_c, 1e-12)
    st.check("cross_entropy lse f64 out", "f64", s_d, s_c, 1e-12)
  end)
  guarded("cross_entropy bad target", {3, 7}, "f32", function()
    local x, tg = st.rand({3, 7}, "f32"), ints({3}, "i64", function(i) return i == 2 and 7 or i end)
    local xd, tgd = st.to_device(x), st.to_device(tg)
    same_error("cross_entropy bad target", {3, 7}, "f32",
               function() return C.lt_cross_entropy_forward(empty({3}, "f32"), nil, x, tg, IGNORE) end,
               function() return C.lt_cross_entropy_forward(empty({3}, "f32", device), nil, xd, tgd, IGNORE) end)
  end)

  -- ---- embedding ------------------------------------------------------------------------------
  -- ids (2-d), V, C; `repeats` draws ids from a few values so that rows sum many times
  for _, case in ipairs {{{2, 37}, 7, 3, false}, {{4, 129}, 1000, 64, false}, {{4, 129}, 50257, 8, false},
                         {{3, 500}, 33, 48, true}, {{1, 1}, 1, 1, false}, {{8, 64}, 5, 257, true}} do
    local ishape, V, Cw, repeats = case[1], case[2], case[3], case[4]
    local oshape = {ishape[1], ishape[2], Cw}
    for _, dt in ipairs {"f32", "f64", "bf16", "f16", "i32"} do
      guarded("embedding", oshape, dt, function()
        local w = st.rand({V, Cw}, dt, -2, 2)
        local ids = ints(ishape, repeats and "i32" or "i64",
                         function() return repeats and randint(0, math.min(V, 4)) or randint(0, V) end)
        local o_c = empty(oshape, dt)
        ok(C.lt_embedding_forward(o_c, w, ids))
        for _, strided in ipairs {false, true} do
          local wd = st.to_device(w)
          if strided then wd = st.noncontig(wd) end
          local o_d = empty(oshape, dt, device)
          ok(C.lt_embedding_forward(o_d, wd, st.to_device(ids)))
          st.check("embedding" .. (strided and " strided" or ""), dt, o_d, o_c, 0)
        end
        if dt ~= "i32" then -- backward: floating dweight; exact (the same summation order)
          local dout = st.rand(oshape, dt, -1, 1)
          local g_c, g_d = empty({V, Cw}, dt), empty({V, Cw}, dt, device)
          ok(C.lt_embedding_backward(g_c, dout, ids))
          ok(C.lt_fill(g_d, 12345)) -- must be overwritten everywhere
          local doutd = st.noncontig(st.to_device(dout))
          ok(C.lt_embedding_backward(g_d, doutd, st.to_device(ids)))
          st.check("embedding backward" .. (repeats and " repeated ids" or ""), dt, g_d, g_c, 0)
        end
      end)
    end
  end
  guarded("embedding bad id", {2, 3}, "f32", function()
    local w, ids = st.rand({5, 4}, "f32"), ints({2, 3}, "i64", function(i) return i == 4 and 5 or i end)
    local wd, idsd = st.to_device(w), st.to_device(ids)
    same_error("embedding bad id", {2, 3}, "f32",
               function() return C.lt_embedding_forward(empty({2, 3, 4}, "f32"), w, ids) end,
               function() return C.lt_embedding_forward(empty({2, 3, 4}, "f32", device), wd, idsd) end)
    local neg = ints({2, 3}, "i32", function(i) return i == 1 and -1 or 0 end)
    local negd = st.to_device(neg)
    same_error("embedding_backward bad id", {2, 3}, "f32",
               function() return C.lt_embedding_backward(empty({5, 4}, "f32"), empty({2, 3, 4}, "f32"), neg) end,
               function()
                 return C.lt_embedding_backward(empty({5, 4}, "f32", device), empty({2, 3, 4}, "f32", device), negd)
               end)
  end)

  -- ---- rope -----------------------------------------------------------------------------------
  local ROPE_TOL = {f32 = 2 ^ -21, bf16 = 2 ^ -6, f16 = 2 ^ -9, f64 = 1e-14}
  for _, shape in ipairs {{2, 5, 3, 8}, {1, 17, 4, 64}, {3, 7, 2, 2}, {1, 1, 1, 128}, {2, 33, 5, 10}} do
    local B, T = shape[1], shape[2]
    for _, dt in ipairs(FLOATS) do
      guarded("rope", shape, dt, function()
        local x = st.rand(shape, dt, -1, 1)
        local pos_t = ints({T}, "i64", function(i) return 3 * i + 1 end)
        local pos_bt = ints({B, T}, "i32", function() return randint(0, 200000) end)
        for k, pos in ipairs {false, pos_t, pos_bt} do
          for inverse = 0, 1 do
            local theta = k == 3 and 500000 or 10000
            local o_c = empty(shape, dt)
            ok(C.lt_rope(o_c, x, pos or nil, theta, inverse))
            local xd = st.to_device(x)
            if k == 2 then xd = st.noncontig(xd) end -- strided input
            local o_d = empty(shape, dt, device)
            ok(C.lt_rope(o_d, xd, pos and st.to_device(pos) or nil, theta, inverse))
            local label = "rope" .. (pos and (k == 2 and " pos(T)" or " pos(B,T)") or "") .. (inverse == 1 and " inverse" or "")
            st.check(label, dt, o_d, o_c, ROPE_TOL[dt])
          end
        end
        -- in place on a permuted layout: x stored (B, H, T, D), seen as (B, T, H, D)
        local xp = st.rand({shape[1], shape[3], shape[2], shape[4]}, dt, -1, 1)
        local xv = xp:transpose(1, 2)
        local o_c = empty(shape, dt)
        ok(C.lt_rope(o_c, xv, nil, 10000, 0))
        local xdv = st.to_device(xp):transpose(1, 2)
        ok(C.lt_rope(xdv, xdv, nil, 10000, 0))
        st.check("rope in place permuted", dt, xdv, o_c, ROPE_TOL[dt])
      end)
    end
  end

  -- ---- random numbers -------------------------------------------------------------------------
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
