-- lutra.selftest.layer_norm — LayerNorm on st.device against the CPU on the same inputs
-- (kernels/layer_norm.cu): plain and fused with the residual add (lt_add_layer_norm_forward,
-- lt_layer_norm_backward_add), forward (res, y, mean, rstd) and backward (dx with and without
-- dres, dweight, dbias), f32/f64/bf16/f16, weights of x's dtype or f32 or none, widths 1, 7, 769,
-- 4097, 65537, non-contiguous x. The backward runs on both sides from the CPU's statistics, so
-- that each output is compared on identical inputs. RMSNorm: selftest/rms_norm.lua.
--
-- Tolerances (st.check passes when max abs err <= tol * max(1, max |want|)):
--   res = x + residual: one f32 (f64) add rounded to the dtype on both sides: exact.
--   mean, rstd, y, dx: the same formulas in the same compute type (f32 for f32/bf16/f16, f64
--     for f64); only the order of the row sums differs (a block tree instead of a sequential
--     simd sum) and the GPU may contract a*b+c into an fma. For C up to 65537 terms of size ~1
--     the sums agree to ~sqrt(C) ulp, ~1e-6 relative in f32, and the statistics move y and dx
--     by as much: f32 1e-5, f64 1e-12. bf16/f16 results round those f32 values, so they may
--     land one unit apart: bf16 2^-7, f16 2^-10 of the scale (one ulp at |values| up to ~3).
--   dweight, dbias: N-row sums, chunked differently (per-chunk f32 partials, chunks added in
--     double on both sides): f32 1e-5, f64 1e-12; bf16/f16 (a weight of that dtype) one unit.
return function(st)
  local C, device = st.C, st.device
  local ok, empty, randint, guarded = st.ok, st.empty, st.randint, st.guarded
  local FLOATS = {"f32", "f64", "bf16", "f16"}
  local TOL = {f32 = 1e-5, f64 = 1e-12, bf16 = 2 ^ -7, f16 = 2 ^ -10}
  local EPS = 1e-5

  -- forward on one side: returns res (or nil), y, mean, rstd
  local function forward(fused, dev, x, r, w, b, shape, dt)
    local N = 1
    for i = 1, #shape - 1 do N = N * shape[i] end
    local res = fused and empty(shape, dt, dev) or nil
    local y, mean, rstd = empty(shape, dt, dev), empty({N}, "f32", dev), empty({N}, "f32", dev)
    if fused then
      ok(C.lt_add_layer_norm_forward(res, y, mean, rstd, x, r, w, b, EPS))
    else
      ok(C.lt_layer_norm_forward(y, mean, rstd, x, w, b, EPS))
    end
    return res, y, mean, rstd
  end

  -- backward on one side: dx (+ dres), dweight and dbias when there is a weight
  local function backward(dev, dy, dres, x, w, mean, rstd, shape, dt)
    local dx = empty(shape, dt, dev)
    local dw = w and empty(w.shape, w.dtype, dev) or nil
    local db = w and empty(w.shape, w.dtype, dev) or nil
    ok(C.lt_layer_norm_backward_add(dx, dw, db, dy, dres, x, w, mean, rstd))
    return dx, dw, db
  end

  local shapes = {{1}, {7}, {3, 5, 7}, {2, 769}, {3, 4097}, {65537}, {2, 3, 1}, {randint(1, 9), randint(1, 300)},
                  {randint(1, 4), randint(1, 6), randint(1, 1100)}}
  for si, shape in ipairs(shapes) do
    for _, dt in ipairs(FLOATS) do
      for _, fused in ipairs {false, true} do
        local op = fused and "add_layer_norm" or "layer_norm"
        guarded(op, shape, dt, function()
          local Cw = shape[#shape]
          local wdt = (si % 3 == 0) and nil or (si % 3 == 1 and dt or "f32") -- none, x's dtype, or f32
          local x, r = st.rand(shape, dt, -2, 3), fused and st.rand(shape, dt, -1, 1) or nil
          local w = wdt and st.rand({Cw}, wdt, 0.5, 1.5) or nil
          local b = wdt and st.rand({Cw}, wdt, -1, 1) or nil
          local dy, dres = st.rand(shape, dt), fused and st.rand(shape, dt) or nil
          -- the CPU's results
          local res_c, y_c, mean_c, rstd_c = forward(fused, "cpu", x, r, w, b, shape, dt)
          local xin_c = fused and res_c or x
          local dx_c, dw_c, db_c = backward("cpu", dy, dres, xin_c, w, mean_c, rstd_c, shape, dt)
          -- the device's, from the same inputs (x non-contiguous every other shape)
          local xd = st.to_device(x)
          if si % 2 == 0 then xd = st.noncontig(xd) end
          local rd, wd, bd = r and st.to_device(r), w and st.to_device(w), b and st.to_device(b)
          local res_d, y_d, mean_d, rstd_d = forward(fused, device, xd, rd, wd, bd, shape, dt)
          local tol, stat_tol = TOL[dt], TOL[dt == "f64" and "f64" or "f32"]
          if fused then st.check(op .. " res", dt, res_d, res_c, 0) end
          st.check(op .. " y", dt, y_d, y_c, tol)
          st.check(op .. " rstd", dt, rstd_d, rstd_c, stat_tol)
          st.check(op .. " mean", dt, mean_d, mean_c, stat_tol)
          -- backward from the CPU's statistics and norm input
          local dyd = st.to_device(dy)
          if si % 2 == 1 then dyd = st.noncontig(dyd) end
          local dx_d, dw_d, db_d = backward(device, dyd, dres and st.to_device(dres), st.to_device(xin_c), wd,
            st.to_device(mean_c), st.to_device(rstd_c), shape, dt)
          st.check(op .. " dx", dt, dx_d, dx_c, tol)
          if dw_c then st.check(op .. " dweight", wdt, dw_d, dw_c, TOL[wdt]) end
          if db_c then st.check(op .. " dbias", wdt, db_d, db_c, TOL[wdt]) end
        end)
      end
    end
  end
end
