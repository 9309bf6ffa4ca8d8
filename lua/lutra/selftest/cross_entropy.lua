-- lutra.selftest.cross_entropy — cross-entropy on st.device against the CPU on the same inputs
-- (kernels/cross_entropy.cu): forward (losses, lse) and backward, contiguous and strided logits,
-- i32/i64 targets with ignored rows, the backward in place over the logits, f64 losses, and the
-- error of an out-of-range target.
--
-- Tolerances (st.check passes when max abs err <= tol * max(1, max |want|)):
--   forward: expf and a different summation order over V terms (the CPU sums 8 lanes
--     sequentially, the GPU per thread then a tree): lse agrees to ~1e-6 relative for V ~ 50k,
--     and the loss (~log V) to 3e-5 of its scale; f64 to 1e-12.
--   backward (given the CPU's lse): only exp differs, by ~2 ulp: f32 1e-6; bf16 and f16 outputs
--     may round the other way by one unit of values up to 1.5 (dl * (p - 1)): 2^-6 and 2^-9;
--     f64 1e-14.
--   the error message of an out-of-range target: the same on both sides.
return function(st)
  local C, device = st.C, st.device
  local ok, empty, ints, randint, guarded, same_error = st.ok, st.empty, st.ints, st.randint, st.guarded,
    st.same_error
  local FLOATS = {"f32", "f64", "bf16", "f16"}
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
end
