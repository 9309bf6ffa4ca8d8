-- lutra.selftest.sort — the ops along a dim on st.device against the CPU on the same inputs:
-- sort and topk (kernels/sort.cu: values and indices exact, integer-valued inputs so that ties
-- abound, both directions, a strided input), the backward's scatter, cumsum (also reversed),
-- cumprod and its backward with zeros in the rows (kernels/cumsum.cu), tril and triu
-- (kernels/tril.cu: exact).
--
-- Tolerances (st.check passes when max abs err <= tol * max(1, max |want|)): sorting, the
-- scatter and the triangles move bits (0). Scans add in double on both sides, in another order
-- on the GPU: one rounding of the output, so f32 2^-22, bf16 2^-7, f16 2^-10, f64 1e-13 (the
-- running sums of long rows); cumprod's backward 8 times that.
return function(st)
  local C, device = st.C, st.device
  local ok, empty, guarded = st.ok, st.empty, st.guarded
  local lt = st.lt
  local SCAN_TOL = {f32 = 2 ^ -22, bf16 = 2 ^ -7, f16 = 2 ^ -10, f64 = 1e-13}

  local new = require("lutra.memory").new -- an undefined tensor: the op allocates it

  for _, case in ipairs {{{4, 37}, -1, 5}, {{9, 3, 5}, 0, 9}, {{2, 3000}, 1, 64}, {{1, 4096}, 1, 4096}} do
    local shape, dim, k = case[1], case[2], case[3]
    for _, dt in ipairs {"f32", "f64", "bf16", "f16", "i32", "i64"} do
      guarded("sort", shape, dt, function()
        local x = st.ints(shape, dt, function() return st.randint(-8, 8) end)
        local xd = st.noncontig(st.to_device(x))
        for desc = 0, 1 do
          local v_c, i_c, v_d, i_d = new(), new(), new(), new()
          ok(C.lt_sort(v_c, i_c, x, dim, desc))
          ok(C.lt_sort(v_d, i_d, xd, dim, desc))
          st.check("sort desc " .. desc, dt, v_d, v_c, 0)
          st.check("sort indices desc " .. desc, "i64", i_d, i_c, 0)
          v_c, i_c, v_d, i_d = new(), new(), new(), new()
          ok(C.lt_topk(v_c, i_c, x, k, dim, desc))
          ok(C.lt_topk(v_d, i_d, xd, k, dim, desc))
          st.check("topk largest " .. desc, dt, v_d, v_c, 0)
          st.check("topk indices largest " .. desc, "i64", i_d, i_c, 0)
          local g = st.rand(v_c.shape, "f64", -2, 2):to(dt)
          local n = x:size(dim)
          local b_c, b_d = new(), new()
          ok(C.lt_sort_backward(b_c, g, i_c, dim, n))
          ok(C.lt_sort_backward(b_d, st.to_device(g), i_d, dim, n))
          st.check("sort_backward", dt, b_d, b_c, 0)
        end
      end)
    end
  end

  for _, case in ipairs {{{5, 33}, -1}, {{7, 4, 3}, 0}, {{3, 2000}, 1}} do
    local shape, dim = case[1], case[2]
    for _, dt in ipairs {"f32", "f64", "bf16", "f16"} do
      guarded("cumsum", shape, dt, function()
        local x, g = st.rand(shape, dt, -1, 1), st.rand(shape, dt, -1, 1)
        local z = st.ints(shape, dt, function() return st.randint(-1, 2) end) -- -1, 0, 1
        local xd, gd, zd = st.noncontig(st.to_device(x)), st.to_device(g), st.to_device(z)
        local tol = SCAN_TOL[dt]
        for reverse = 0, 1 do
          local o_c, o_d = new(), new()
          ok(C.lt_cumsum(o_c, x, dim, reverse))
          ok(C.lt_cumsum(o_d, xd, dim, reverse))
          st.check("cumsum reverse " .. reverse, dt, o_d, o_c, tol)
        end
        for _, pair in ipairs {{x, xd, ""}, {z, zd, " zeros"}} do
          local o_c, o_d = new(), new()
          ok(C.lt_cumprod(o_c, pair[1], dim))
          ok(C.lt_cumprod(o_d, pair[2], dim))
          st.check("cumprod" .. pair[3], dt, o_d, o_c, tol)
          o_c, o_d = new(), new()
          ok(C.lt_cumprod_backward(o_c, g, pair[1], dim))
          ok(C.lt_cumprod_backward(o_d, gd, pair[2], dim))
          st.check("cumprod_backward" .. pair[3], dt, o_d, o_c, 8 * tol)
        end
      end)
    end
  end

  for _, shape in ipairs {{5, 7}, {2, 3, 9, 4}, {1, 64, 64}} do
    for _, dt in ipairs {"f32", "f64", "bf16", "f16", "i32", "i64"} do
      guarded("tril", shape, dt, function()
        local x = st.ints(shape, dt, function() return st.randint(-50, 50) / (dt:sub(1, 1) == "i" and 1 or 8) end)
        local xd = st.noncontig(st.to_device(x))
        for diag = -2, 2 do
          for _, name in ipairs {"lt_tril", "lt_triu"} do
            local o_c, o_d = new(), empty(shape, dt, device)
            ok(C[name](o_c, x, diag))
            ok(C[name](o_d, xd, diag))
            st.check(name:sub(4) .. " " .. diag, dt, o_d, o_c, 0)
          end
        end
      end)
    end
  end
end
