-- lutra.selftest.rms_norm — RMSNorm on st.device against the CPU on the same inputs
-- (kernels/layer_norm.cu, center = 0): plain and fused with the residual add (lt_add_rms_norm_forward,
-- lt_rms_norm_backward_add), forward (res, y, rstd) and backward (dx with and without dres,
-- dweight), f32/f64/bf16/f16, weights of x's dtype or f32 or none, widths 1, 7, 769, 4097, 65537,
-- non-contiguous x, and the fused op in place (the residual stream updated). The backward runs on
-- both sides from the CPU's statistics, so that each output is compared on identical inputs.
-- Tolerances: as selftest/layer_norm.lua's (the same sums, without the mean).
return function(st)
  local C, device = st.C, st.device
  local ok, empty, randint, guarded = st.ok, st.empty, st.randint, st.guarded
  local FLOATS = {"f32", "f64", "bf16", "f16"}
  local TOL = {f32 = 1e-5, f64 = 1e-12, bf16 = 2 ^ -7, f16 = 2 ^ -10}
  local EPS = 1e-5

  -- forward on one side: returns res (or nil), y, rstd
  local function forward(fused, dev, x, r, w, shape, dt)
    local N = 1
    for i = 1, #shape - 1 do N = N * shape[i] end
    local res = fused and empty(shape, dt, dev) or nil
    local y, rstd = empty(shape, dt, dev), empty({N}, "f32", dev)
    if fused then
      ok(C.lt_add_rms_norm_forward(res, y, rstd, x, r, w, EPS))
    else
      ok(C.lt_rms_norm_forward(y, rstd, x, w, EPS))
    end
    return res, y, rstd
  end

  -- backward on one side: dx (+ dres), and dweight when there is a weight
  local function backward(dev, dy, dres, x, w, rstd, shape, dt)
    local dx = empty(shape, dt, dev)
    local dw = w and empty(w.shape, w.dtype, dev) or nil
    ok(C.lt_rms_norm_backward_add(dx, dw, dy, dres, x, w, rstd))
    return dx, dw
  end

  local shapes = {{1}, {7}, {3, 5, 7}, {2, 769}, {3, 4097}, {65537}, {2, 3, 1}, {randint(1, 9), randint(1, 300)},
                  {randint(1, 4), randint(1, 6), randint(1, 1100)}}
  for si, shape in ipairs(shapes) do
    for _, dt in ipairs(FLOATS) do
      for _, fused in ipairs {false, true} do
        local op = fused and "add_rms_norm" or "rms_norm"
        guarded(op, shape, dt, function()
          local Cw = shape[#shape]
          local wdt = (si % 3 == 0) and nil or (si % 3 == 1 and dt or "f32") -- none, x's dtype, or f32
          local x, r = st.rand(shape, dt, -2, 3), fused and st.rand(shape, dt, -1, 1) or nil
          local w = wdt and st.rand({Cw}, wdt, 0.5, 1.5) or nil
          local dy, dres = st.rand(shape, dt), fused and st.rand(shape, dt) or nil
          -- the CPU's results
          local res_c, y_c, rstd_c = forward(fused, "cpu", x, r, w, shape, dt)
          local xin_c = fused and res_c or x
          local dx_c, dw_c = backward("cpu", dy, dres, xin_c, w, rstd_c, shape, dt)
          -- the device's, from the same inputs (x non-contiguous every other shape)
          local xd = st.to_device(x)
          if si % 2 == 0 then xd = st.noncontig(xd) end
          local rd, wd = r and st.to_device(r), w and st.to_device(w)
          local res_d, y_d, rstd_d = forward(fused, device, xd, rd, wd, shape, dt)
          local tol = TOL[dt]
          if fused then st.check(op .. " res", dt, res_d, res_c, 0) end
          st.check(op .. " y", dt, y_d, y_c, tol)
          st.check(op .. " rstd", dt, rstd_d, rstd_c, TOL[dt == "f64" and "f64" or "f32"])
          -- backward from the CPU's statistics and norm input
          local dyd = st.to_device(dy)
          if si % 2 == 1 then dyd = st.noncontig(dyd) end
          local dx_d, dw_d = backward(device, dyd, dres and st.to_device(dres), st.to_device(xin_c), wd,
            st.to_device(rstd_c), shape, dt)
          st.check(op .. " dx", dt, dx_d, dx_c, tol)
          if dw_c then st.check(op .. " dweight", wdt, dw_d, dw_c, TOL[wdt]) end
        end)
      end
    end
  end

  -- in place on the device: res_out = x (the residual stream updated), dx = dres
  for _, dt in ipairs(FLOATS) do
    local shape = {3, 257}
    guarded("add_rms_norm in place", shape, dt, function()
      local x, r, w = st.rand(shape, dt, -2, 3), st.rand(shape, dt), st.rand({257}, "f32", 0.5, 1.5)
      local dy, dres = st.rand(shape, dt), st.rand(shape, dt)
      local res_c, y_c, rstd_c = forward(true, "cpu", x, r, w, shape, dt)
      local dx_c = backward("cpu", dy, dres, res_c, w, rstd_c, shape, dt)
      local xd, yd, rstd_d = st.to_device(x), empty(shape, dt, device), empty({3}, "f32", device)
      ok(C.lt_add_rms_norm_forward(xd, yd, rstd_d, xd, st.to_device(r), st.to_device(w), EPS))
      st.check("add_rms_norm in place res", dt, xd, res_c, 0)
      st.check("add_rms_norm in place y", dt, yd, y_c, TOL[dt])
      local dresd = st.to_device(dres)
      ok(C.lt_rms_norm_backward_add(dresd, nil, st.to_device(dy), dresd, st.to_device(res_c), st.to_device(w),
        st.to_device(rstd_c)))
      st.check("add_rms_norm in place dx", dt, dresd, dx_c, TOL[dt])
    end)
  end
end
