-- lutra.selftest.attention — attention forward and backward on st.device (kernels/attention_forward.cu,
-- kernels/attention_backward.cu) against the CPU op on the same inputs: bf16, f16, f32, f64; head dims 64 and
-- 128 (the tensor-core kernels for bf16/f16) and others (the CUDA-core kernels, up to 256; above,
-- the CUDA path runs the CPU op on copies); causal
-- or not, GQA and MQA, S < T (rows that see no key: out 0, lse -inf), S > T, segment ids (sorted
-- and not), sliding windows (alone, with segments, after a cache: S > T), T and S not multiples
-- of any tile; q, k, v as views of one fused qkv (strided, used in
-- place), with a strided head dim (copied first), and a strided out. The backward is given the
-- CPU's out and lse, so that it is checked alone, and is run twice to check that it is
-- deterministic (no atomics: the same bits).
--
-- Tolerances (st.check passes when max abs err <= tol * max(1, max |want|)); the same bounds hold
-- between the CPU op and the CPU emulation of these kernels (tests/c/test_attention_tiles.c):
--   f32: the GPU sums the q.k, P V and gradient products in another order and uses exp2f where
--     the CPU uses its own polynomial exp: a few ulps of the largest terms; out 2e-5, lse 1e-5
--     (relative to max(1, |lse|)), gradients (longer sums, dS = P (dP - delta) cancels) 1e-4.
--   bf16/f16: the results are f32 values rounded to 16 bits on both sides, which may round the
--     other way (one ulp), and the tensor-core forward rounds P to 16 bits before P V (relative
--     2^-9 in bf16, 2^-11 in f16 of each term): bf16 1.6e-2 (2^-6), f16 2e-3 (2^-9); lse 1e-5.
--   f64: sums in another order in double: 1e-10 (out and gradients); lse is f32 on both sides,
--     rounded from a double: 1e-6.
local ffi = require "ffi"

return function(st)
  local lt, C, device = st.lt, st.C, st.device
  local TOL = {f32 = 2e-5, bf16 = 1.6e-2, f16 = 2e-3, f64 = 1e-10}
  local GRAD_TOL = {f32 = 1e-4, bf16 = 1.6e-2, f16 = 2e-3, f64 = 1e-10}
  local LSE_TOL = {f32 = 1e-5, bf16 = 1e-5, f16 = 1e-5, f64 = 1e-6}

  local function err() return ffi.string(C.lt_last_error()) end
  local function ok(rc) if rc ~= 0 then error(err(), 2) end end
  local function empty(shape, dtype, dev) return lt.empty(shape, {dtype = dtype, device = dev or "cpu"}) end
  local function guarded(op, shape, dtype, f)
    local fine, msg = pcall(f)
    if not fine then
      print(string.format("  %s %s: %s", op, dtype, tostring(msg)))
      st.report(op, shape, dtype, math.huge, math.huge, false)
    end
  end
  -- (B, T) segment ids: sorted runs (packed documents) or unsorted ids in 0..2
  local function segments(B, T, kind)
    local n = B * T
    local buf = ffi.new("double[?]", math.max(n, 1))
    for b = 0, B - 1 do
      local id = 0
      for t = 0, T - 1 do
        if kind == "sorted" and st.uniform() < 0.06 then id = id + 1 end
        buf[b * T + t] = kind == "sorted" and id or math.floor(st.uniform() * 3)
      end
    end
    local s = empty({B, T}, (T % 2 == 0) and "i32" or "i64")
    ok(C.lt_copy_from_buffer(s, buf, C.LT_F64, n))
    return s
  end

  -- layout: "plain", "fused" (q, k, v narrowed from one (B, T, H + 2 Hkv, D) qkv; needs S == T),
  -- "strided" (every other element of the last dim: D not dense), "out" (a strided out)
  local CASES = {
    {B = 2, T = 77, S = 77, H = 4, Hkv = 2, D = 64, causal = true, layout = "fused"},
    {B = 1, T = 130, S = 200, H = 2, Hkv = 1, D = 128, causal = true, layout = "plain"},
    {B = 2, T = 90, S = 50, H = 3, Hkv = 3, D = 64, causal = true, layout = "plain"},
    {B = 1, T = 64, S = 64, H = 2, Hkv = 2, D = 40, causal = false, layout = "strided"},
    {B = 2, T = 100, S = 100, H = 4, Hkv = 1, D = 64, causal = true, seg = "sorted", layout = "out"},
    {B = 1, T = 33, S = 33, H = 2, Hkv = 1, D = 256, causal = true, seg = "unsorted", layout = "plain"},
    {B = 1, T = 70, S = 45, H = 2, Hkv = 1, D = 128, causal = false, layout = "strided"},
    {B = 1, T = 1, S = 1, H = 1, Hkv = 1, D = 1, causal = true, layout = "plain"},
    {B = 1, T = 9, S = 12, H = 2, Hkv = 1, D = 300, causal = true, layout = "plain"}, -- D > 256: the CPU op's
    -- sliding windows: across key tiles, with packed segments, queries after a cache (S > T)
    {B = 2, T = 150, S = 150, H = 4, Hkv = 2, D = 64, causal = true, window = 40, layout = "fused"},
    {B = 1, T = 130, S = 130, H = 2, Hkv = 1, D = 128, causal = true, window = 70, seg = "sorted", layout = "plain"},
    {B = 1, T = 20, S = 170, H = 2, Hkv = 2, D = 64, causal = true, window = 64, layout = "plain"},
    {B = 1, T = 77, S = 77, H = 3, Hkv = 1, D = 48, causal = true, window = 9, seg = "unsorted", layout = "strided"},
    {B = 1, T = 1, S = 90, H = 2, Hkv = 1, D = 128, causal = true, window = 33, layout = "plain"},
  }

  for _, c in ipairs(CASES) do
    for _, dt in ipairs {"bf16", "f16", "f32", "f64"} do
      local qshape, kshape = {c.B, c.T, c.H, c.D}, {c.B, c.S, c.Hkv, c.D}
      local tag = string.format("%s%s%s%s", c.causal and " causal" or "", c.window and " window " .. c.window or "",
                                c.seg and " seg " .. c.seg or "", c.layout ~= "plain" and " " .. c.layout or "")
      guarded("attention" .. tag, qshape, dt, function()
        local scale = (0.5 + 2 * st.uniform()) / math.sqrt(c.D)
        local causal, window = c.causal and 1 or 0, c.window or 0
        -- inputs on the CPU, and the same values laid out on the device
        local q, k, v, qd, kd, vd
        if c.layout == "fused" then
          local qkv = st.rand({c.B, c.T, c.H + 2 * c.Hkv, c.D}, dt)
          local qkvd = st.to_device(qkv)
          q, k, v = qkv:narrow(2, 0, c.H), qkv:narrow(2, c.H, c.Hkv), qkv:narrow(2, c.H + c.Hkv, c.Hkv)
          qd, kd, vd = qkvd:narrow(2, 0, c.H), qkvd:narrow(2, c.H, c.Hkv), qkvd:narrow(2, c.H + c.Hkv, c.Hkv)
        else
          q, k, v = st.rand(qshape, dt), st.rand(kshape, dt), st.rand(kshape, dt)
          qd, kd, vd = st.to_device(q), st.to_device(k), st.to_device(v)
          if c.layout == "strided" then qd, kd, vd = st.noncontig(qd), st.noncontig(kd), st.noncontig(vd) end
        end
        local seg = c.seg and segments(c.B, c.T, c.seg) or nil
        local segd = seg and st.to_device(seg) or nil
        local dout = st.rand(qshape, dt)

        -- CPU reference
        local out, lse = empty(qshape, dt), empty({c.B, c.H, c.T}, "f32")
        ok(C.lt_attention_forward(out, lse, q, k, v, seg, scale, causal, window))
        local dq, dk, dv = empty(qshape, dt), empty(kshape, dt), empty(kshape, dt)
        ok(C.lt_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, seg, scale, causal, window))

        -- device
        local outd = empty(qshape, dt, device)
        if c.layout == "out" then outd = st.noncontig(outd) end
        local lsed = empty({c.B, c.H, c.T}, "f32", device)
        ok(C.lt_attention_forward(outd, lsed, qd, kd, vd, segd, scale, causal, window))
        st.check("attention_fwd out" .. tag, dt, outd, out, TOL[dt])
        st.check("attention_fwd lse" .. tag, dt, lsed, lse, LSE_TOL[dt])

        local doutd, outc, lsec = st.to_device(dout), st.to_device(out), st.to_device(lse)
        local grads = {}
        for run = 1, 2 do
          local g = {empty(qshape, dt, device), empty(kshape, dt, device), empty(kshape, dt, device)}
          ok(C.lt_attention_backward(g[1], g[2], g[3], doutd, qd, kd, vd, outc, lsec, segd, scale, causal,
            window))
          grads[run] = g
        end
        st.check("attention_bwd dq" .. tag, dt, grads[1][1], dq, GRAD_TOL[dt])
        st.check("attention_bwd dk" .. tag, dt, grads[1][2], dk, GRAD_TOL[dt])
        st.check("attention_bwd dv" .. tag, dt, grads[1][3], dv, GRAD_TOL[dt])
        for i, name in ipairs {"dq", "dk", "dv"} do -- deterministic: the same bits twice
          st.check("attention_bwd rerun " .. name, dt, grads[2][i], grads[1][i]:cpu(), 0)
        end
      end)
    end
  end

  -- bad input gets the CPU's messages on the device too (the checks run before any kernel)
  guarded("attention errors", {1}, "f32", function()
    local q, k = st.to_device(st.rand({1, 4, 3, 8}, "f32")), st.to_device(st.rand({1, 4, 2, 8}, "f32"))
    local out, lse = empty({1, 4, 3, 8}, "f32", device), empty({1, 3, 4}, "f32", device)
    local rc = C.lt_attention_forward(out, lse, q, k, k, nil, 1.0, 1, 0)
    local fine = rc ~= 0 and err():find("H % Hkv == 0", 1, true) ~= nil
    if not fine then print("  attention errors: got '" .. (rc ~= 0 and err() or "(no error)") .. "'") end
    st.report("attention bad GQA", {1, 4, 3, 8}, "f32", fine and 0 or math.huge, 0, fine)
  end)
end
