-- lutra.selftest.rope — rotary position embedding on st.device against the CPU on the same inputs
-- (kernels/rope.cu): positions none, (T) and (B, T), the inverse rotation (the backward), strided
-- input, and in place on a permuted layout, f32/f64/bf16/f16; lt_rope_freq (a caller's frequency
-- table, llama3-like, and a scale, as yarn's attention_scaling) forward and inverse.
--
-- Tolerances (st.check passes when max abs err <= tol * max(1, max |want|)): frequencies and
-- angles are the CPU's bits; cos/sin in double differ by ~1 ulp, which survives rounding to f32
-- only next to a tie; the CPU build may fuse a product into an FMA (-mfma) where the GPU rounds
-- each: an ulp or two of values up to ~1.4, so f32 2^-21, bf16 2^-6, f16 2^-9 (one unit of the
-- output either way), f64 1e-14.
return function(st)
  local C, device = st.C, st.device
  local ok, empty, ints, randint, guarded = st.ok, st.empty, st.ints, st.randint, st.guarded
  local FLOATS = {"f32", "f64", "bf16", "f16"}
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
        -- the caller's frequencies: theta 500000's, the lower ones divided by 8; scale 1.2
        local half, freqs = shape[4] / 2, {}
        for i = 0, half - 1 do
          local f = 500000 ^ (-2 * i / shape[4])
          freqs[i + 1] = 2 * math.pi / f > 64 and f / 8 or f
        end
        local inv = st.lt.tensor(freqs, "f64")
        for inverse = 0, 1 do
          local f_c, f_d = empty(shape, dt), empty(shape, dt, device)
          ok(C.lt_rope_freq(f_c, x, pos_bt, inv, 1.2, inverse))
          ok(C.lt_rope_freq(f_d, st.to_device(x), st.to_device(pos_bt), inv, 1.2, inverse))
          st.check("rope_freq scale 1.2" .. (inverse == 1 and " inverse" or ""), dt, f_d, f_c, ROPE_TOL[dt])
        end
      end)
    end
  end
end
