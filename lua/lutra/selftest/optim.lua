-- lutra.selftest.optim — the optimizer kernels (kernels/adamw.cu, lion.cu, multi_tensor.cu) on st.device against the
-- CPU on the same inputs: AdamW one tensor at a time and multi-tensor (mixed dtypes, empty and
-- odd sizes, master weights), Lion, the multi-tensor sum of squares and scale, and clipping's
-- coefficient; Adafactor and LAMB (kernels/adafactor.cu, lamb.cu). Two or three steps each, so that
-- the later ones start from state the device wrote.
--
-- Tolerances (st.check: max abs error <= tol * max(1, max |want|)):
-- * AdamW, Lion, Adafactor, LAMB, scale, clip coefficient: exact (tol 0); Adafactor's and LAMB's
--   sums run in one order on both sides (kernels/adafactor.h, lamb.h). The kernels round every product, sum,
--   quotient and square root explicitly (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn, their
--   f64 forms), never contract them into an fma, take the lerp's one fma where the CPU does
--   (fmaf), get the scalars cast from the same doubles, and round 16-bit results with the
--   host's own conversions: the same IEEE operations in the same order as the CPU.
-- * sum of squares: both sides sum in f64 in different orders (per thread, a block tree, the
--   chunk sums), a difference of about n * 2^-53 of the sum (~1e-11 at 10^5 elements): tol
--   1e-12 relative for an f64 result; an f32 result rounds that once: 2 ulp, 2^-22.
local ffi = require "ffi"

local FLOATS = {"f32", "f64", "bf16", "f16"}

return function(st)
  local lt, C = st.lt, st.C

  local function ok(rc) assert(rc == 0, ffi.string(C.lt_last_error())) end
  local function state_dtype(dt) return dt == "f64" and "f64" or "f32" end
  local function grad_dtype(dt, k) return (dt == "bf16" or dt == "f16") and k % 2 == 0 and "f32" or dt end
  local function arr(list)
    local a = ffi.new("lt_tensor*[?]", math.max(#list, 1))
    for i, t in ipairs(list) do a[i - 1] = t end
    return a
  end

  -- runs fn(); an error (a refused call) is one failing row, not the end of the selftest
  local function case(op, shape, dt, fn)
    local good, err = pcall(fn)
    if not good then st.report(op .. ": " .. tostring(err), shape, dt, math.huge, math.huge, false) end
  end

  -- ---- AdamW and Lion, one tensor ---------------------------------------------------------------
  for k, shape in ipairs(st.shapes()) do
    for _, dt in ipairs(FLOATS) do case("adamw/lion", shape, dt, function()
      local sd, gd = state_dtype(dt), grad_dtype(dt, k)
      local p, m, v = st.rand(shape, dt), st.rand(shape, sd, -0.1, 0.1), st.rand(shape, sd, 0, 0.01)
      local dp, dm, dv = st.to_device(p), st.to_device(m), st.to_device(v)
      for step = 1, 2 do
        local g = st.rand(shape, gd)
        -- a non-contiguous grad on every other shape (read through a contiguous copy)
        local dg = k % 2 == 1 and st.noncontig(st.to_device(g)) or st.to_device(g)
        ok(C.lt_adamw_step(dp, dg, dm, dv, 1e-2, 0.9, 0.95, 1e-6, 0.1, step))
        ok(C.lt_adamw_step(p, g, m, v, 1e-2, 0.9, 0.95, 1e-6, 0.1, step))
      end
      st.check("adamw param", dt .. (gd ~= dt and "/" .. gd or ""), dp, p, 0)
      st.check("adamw m", dt, dm, m, 0)
      st.check("adamw v", dt, dv, v, 0)

      local lp, lm = st.rand(shape, dt), st.rand(shape, sd, -0.1, 0.1)
      local dlp, dlm = st.to_device(lp), st.to_device(lm)
      for _ = 1, 2 do
        local g = st.rand(shape, gd)
        ok(C.lt_lion_step(dlp, st.to_device(g), dlm, 1e-2, 0.9, 0.99, 0.1))
        ok(C.lt_lion_step(lp, g, lm, 1e-2, 0.9, 0.99, 0.1))
      end
      st.check("lion param", dt .. (gd ~= dt and "/" .. gd or ""), dlp, lp, 0)
      st.check("lion m", dt, dlm, lm, 0)
    end) end
  end

  -- ---- Adafactor (factored for 2+ dims) and LAMB, f32 and f64, three steps: exact ---------------------
  for _, shape in ipairs(st.shapes()) do
    for _, dt in ipairs{"f32", "f64"} do case("adafactor/lamb", shape, dt, function()
      local n, nd = 1, #shape
      for _, d in ipairs(shape) do n = n * d end
      local factored = nd >= 2
      local function zeros(k) return lt.zeros({k}, {dtype = dt}) end
      local cpu = {p = st.rand(shape, dt), m = zeros(n), m2 = zeros(n), v = zeros(n)}
      if factored then cpu.row, cpu.col = zeros(math.floor(n / shape[nd])), zeros(math.floor(n / shape[nd - 1])) end
      local dev = {}
      for k, t in pairs(cpu) do dev[k] = st.to_device(t) end
      for step = 1, 3 do
        local g = st.rand(shape, dt)
        local beta2t, rel = 1 - step ^ -0.8, math.min(1e-2, 1 / math.sqrt(step))
        for _, x in ipairs{{cpu, g}, {dev, st.to_device(g)}} do
          local s, gx = x[1], x[2]
          ok(C.lt_adafactor_step(s.p, gx, s.m, s.row, s.col, not factored and s.v or nil, rel, 1, 1e-30, 1e-3, 1, beta2t,
            0.9, 0.1))
          ok(C.lt_lamb_step(s.p, gx, s.m2, s.v, 1e-2, 0.9, 0.99, 1e-6, 0.01, step))
        end
      end
      for _, k in ipairs{"p", "m", "m2", "v", "row", "col"} do
        if cpu[k] then st.check("adafactor/lamb " .. k, dt, dev[k], cpu[k], 0) end
      end
    end) end
  end

  -- ---- LAMB over every shape in one call (f32 and f64 mixed), three steps: exact ---------------------
  case("lamb_multi", {0}, "mixed", function()
    local cpu, dev, dts = {p = {}, m = {}, v = {}}, {p = {}, m = {}, v = {}}, {}
    for k, shape in ipairs(st.shapes()) do
      for j, dt in ipairs{"f32", "f64"} do
        local i = #dts + 1
        dts[i] = dt
        cpu.p[i], cpu.m[i], cpu.v[i] = st.rand(shape, dt), lt.zeros(shape, {dtype = dt}), lt.zeros(shape, {dtype = dt})
        if (k + j) % 5 == 0 then cpu.p[i]:zero_() end -- trust 1
        for _, key in ipairs{"p", "m", "v"} do dev[key][i] = st.to_device(cpu[key][i]) end
      end
    end
    local n = #dts
    for step = 1, 3 do
      local gc, gdv = {}, {}
      for i = 1, n do
        gc[i] = st.rand(cpu.p[i].shape, dts[i])
        gdv[i] = st.to_device(gc[i])
      end
      ok(C.lt_lamb_step_multi(n, arr(dev.p), arr(gdv), arr(dev.m), arr(dev.v), 1e-2, 0.9, 0.99, 1e-6, 0.01, step))
      ok(C.lt_lamb_step_multi(n, arr(cpu.p), arr(gc), arr(cpu.m), arr(cpu.v), 1e-2, 0.9, 0.99, 1e-6, 0.01, step))
    end
    for i = 1, n do
      for _, key in ipairs{"p", "m", "v"} do st.check("lamb_multi " .. key, dts[i], dev[key][i], cpu[key][i], 0) end
    end
  end)

  -- ---- Adafactor over every shape in one call (factored and 1-d, f32 and f64), three steps -------------
  case("adafactor_multi", {0}, "mixed", function()
    local kind = require "lutra.optim.adafactor"
    local names = {"p", "m", "row", "col", "v"}
    local cpu, dev, dts = {}, {}, {}
    for _, key in ipairs(names) do cpu[key], dev[key] = {}, {} end
    for _, shape in ipairs(st.shapes()) do
      for _, dt in ipairs{"f32", "f64"} do
        local i = #dts + 1
        dts[i] = dt
        cpu.p[i], cpu.m[i] = st.rand(shape, dt), lt.zeros(shape, {dtype = dt})
        if #shape >= 2 then
          cpu.row[i] = lt.zeros(kind.state_shape(shape, "exp_avg_sq_row"), {dtype = dt})
          cpu.col[i] = lt.zeros(kind.state_shape(shape, "exp_avg_sq_col"), {dtype = dt})
        else
          cpu.v[i] = lt.zeros(shape, {dtype = dt})
        end
        for _, key in ipairs(names) do if cpu[key][i] then dev[key][i] = st.to_device(cpu[key][i]) end end
      end
    end
    local n = #dts
    local function sparse(list) -- an array with NULL where a tensor has no such state
      local a = ffi.new("lt_tensor*[?]", n)
      for i = 1, n do if list[i] then a[i - 1] = list[i] end end
      return a
    end
    for step = 1, 3 do
      local gc, gdv = {}, {}
      for i = 1, n do
        gc[i] = st.rand(cpu.p[i].shape, dts[i])
        gdv[i] = st.to_device(gc[i])
      end
      local beta2t = 1 - step ^ -0.8
      for _, x in ipairs{{dev, gdv}, {cpu, gc}} do
        local s = x[1]
        ok(C.lt_adafactor_step_multi(n, arr(s.p), arr(x[2]), arr(s.m), sparse(s.row), sparse(s.col), sparse(s.v), 1e-2, 1,
          1e-30, 1e-3, 1, beta2t, 0.9, 0.1))
      end
    end
    for i = 1, n do
      for _, key in ipairs(names) do
        if cpu[key][i] then st.check("adafactor_multi " .. key, dts[i], dev[key][i], cpu[key][i], 0) end
      end
    end
  end)

  case("multi-tensor ops", {0}, "mixed", function()
    -- ---- multi-tensor AdamW: every shape and dtype in one call, some with masters ---------------------
    local cpu, dev = {p = {}, m = {}, v = {}, master = {}}, {p = {}, m = {}, v = {}, master = {}}
    local kinds = {}
    for k, shape in ipairs(st.shapes()) do
      for j, dt in ipairs(FLOATS) do
        local i = #kinds + 1
        local half = dt == "bf16" or dt == "f16"
        kinds[i] = {shape = shape, dt = dt, master = half and (k + j) % 2 == 0, gd = grad_dtype(dt, k + j)}
        local sd = state_dtype(dt)
        cpu.p[i], cpu.m[i], cpu.v[i] = st.rand(shape, dt), st.rand(shape, sd, -0.1, 0.1), st.rand(shape, sd, 0, 0.01)
        dev.p[i], dev.m[i], dev.v[i] = st.to_device(cpu.p[i]), st.to_device(cpu.m[i]), st.to_device(cpu.v[i])
        if kinds[i].master then
          cpu.master[i] = cpu.p[i]:to("f32")
          dev.master[i] = st.to_device(cpu.master[i])
        end
      end
    end
    local n = #kinds
    local function masters(side)
      local a = ffi.new("lt_tensor*[?]", n)
      for i = 1, n do if side.master[i] then a[i - 1] = side.master[i] end end
      return a
    end
    for step = 1, 2 do
      local gc, gdv = {}, {}
      for i, kd in ipairs(kinds) do
        gc[i] = st.rand(kd.shape, kd.gd)
        gdv[i] = st.to_device(gc[i])
      end
      ok(C.lt_adamw_step_multi(n, arr(dev.p), arr(gdv), arr(dev.m), arr(dev.v), masters(dev), 3e-2, 0.9, 0.999, 1e-8,
        0.05, step))
      ok(C.lt_adamw_step_multi(n, arr(cpu.p), arr(gc), arr(cpu.m), arr(cpu.v), masters(cpu), 3e-2, 0.9, 0.999, 1e-8,
        0.05, step))
    end
    for i, kd in ipairs(kinds) do
      local tag = kd.dt .. (kd.master and " master" or "")
      st.check("adamw_multi param", tag, dev.p[i], cpu.p[i], 0)
      st.check("adamw_multi m", tag, dev.m[i], cpu.m[i], 0)
      st.check("adamw_multi v", tag, dev.v[i], cpu.v[i], 0)
      if kd.master then st.check("adamw_multi master", tag, dev.master[i], cpu.master[i], 0) end
    end

    -- ---- sum of squares, scale, clip coefficient over the same list ------------------------------------
    local hs, ds = {}, {}
    for i, kd in ipairs(kinds) do
      hs[i] = st.rand(kd.shape, kd.dt, -2, 2)
      ds[i] = st.to_device(hs[i])
    end
    for _, out_dt in ipairs {"f64", "f32"} do
      local want = lt.zeros({1}, {dtype = out_dt})
      local got = st.to_device(want)
      ok(C.lt_multi_tensor_sumsq(got, n, arr(ds)))
      ok(C.lt_multi_tensor_sumsq(want, n, arr(hs)))
      st.check("multi_tensor_sumsq", out_dt, got, want, out_dt == "f64" and 1e-12 or 2 ^ -22)
      -- clipping: the coefficient from that sum, then the scale by it (0.37 of it: clips)
      local norm = math.sqrt(want:item())
      local cw, cg = lt.zeros({1}, {dtype = out_dt}), st.to_device(lt.zeros({1}, {dtype = out_dt}))
      ok(C.lt_clip_coef(cg, st.to_device(want), 0.37 * norm))
      ok(C.lt_clip_coef(cw, want, 0.37 * norm))
      st.check("clip_coef", out_dt, cg, cw, 0)
      ok(C.lt_multi_tensor_scale(n, arr(ds), cg))
      ok(C.lt_multi_tensor_scale(n, arr(hs), cw))
    end
    for i, kd in ipairs(kinds) do st.check("multi_tensor_scale", kd.dt, ds[i], hs[i], 0) end
    local empty = st.to_device(lt.full({1}, 5, {dtype = "f64"}))
    ok(C.lt_multi_tensor_sumsq(empty, 0, nil))
    st.check("multi_tensor_sumsq (none)", "f64", empty, lt.zeros({1}, {dtype = "f64"}), 0)
    for _, case in ipairs {{4, 1}, {4, 10}, {0 / 0, 1}, {math.huge, 1}} do
      local s = lt.full({1}, case[1], {dtype = "f64"})
      local cw, cg = lt.zeros({1}, {dtype = "f64"}), st.to_device(lt.zeros({1}, {dtype = "f64"}))
      ok(C.lt_clip_coef(cg, st.to_device(s), case[2]))
      ok(C.lt_clip_coef(cw, s, case[2]))
      st.check("clip_coef " .. tostring(case[1]), "f64", cg, cw, 0)
    end
  end)
end
