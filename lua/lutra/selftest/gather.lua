-- lutra.selftest.gather — gather, scatter, scatter_add, scatter_reduce (amax, amin), index_select,
-- index_add and index_copy on st.device against the CPU on the same inputs (kernels/gather.cu):
-- odd shapes, every dim, index i32 and i64 with repeats, contiguous and strided device inputs,
-- f32/f64/bf16/f16/i32, and an out-of-range index refused with the CPU's message.
--
-- Exact (0): gather and index_select copy; scatter_add and index_add sum each output element's
-- contributions one thread per line in index order, rounding as the CPU row does (no atomics):
-- the same bits; amax and amin pick. scatter / index_copy with repeated indices keep the last
-- write on both.
return function(st)
  local C, device = st.C, st.device
  local ok, empty, ints, randint, guarded, same_error = st.ok, st.empty, st.ints, st.randint, st.guarded,
    st.same_error

  -- x's shape, dim, the index's length along dim
  for _, case in ipairs {{{3, 5, 7}, 2, 4}, {{6, 1, 33}, 0, 11}, {{2, 300, 9}, 1, 500}, {{1, 1, 1}, 0, 1},
                         {{64, 8, 40}, 0, 300}} do
    local xs, dim, n = case[1], case[2], case[3]
    local is = {xs[1], xs[2], xs[3]}
    is[dim + 1] = n
    for _, dt in ipairs {"f32", "f64", "bf16", "f16", "i32"} do
      guarded("gather", is, dt, function()
        local x, src = st.rand(xs, dt, -2, 2), st.rand(is, dt, -2, 2)
        local idt = dt == "f64" and "i32" or "i64"
        local index = ints(is, idt, function() return randint(0, math.min(xs[dim + 1], 3)) end)
        local sel = ints({n}, idt, function() return randint(0, xs[dim + 1]) end)
        for _, strided in ipairs {false, true} do
          local xd, sd = st.to_device(x), st.to_device(src)
          if strided then xd, sd = st.noncontig(xd), st.noncontig(sd) end
          local id, seld = st.to_device(index), st.to_device(sel)
          local tag = strided and " strided" or ""
          local function both(name, shape, fc, fd)
            local oc, od = empty(shape, dt), empty(shape, dt, device)
            ok(fc(oc))
            ok(fd(od))
            st.check(name .. tag, dt, od, oc, 0)
          end
          both("gather", is, function(o) return C.lt_gather(o, x, dim, index) end,
               function(o) return C.lt_gather(o, xd, dim, id) end)
          both("scatter_add", xs, function(o) return C.lt_scatter_add(o, x, dim, index, src) end,
               function(o) return C.lt_scatter_add(o, xd, dim, id, sd) end)
          both("scatter", xs, function(o) return C.lt_scatter(o, x, dim, index, src) end,
               function(o) return C.lt_scatter(o, xd, dim, id, sd) end)
          for _, reduce in ipairs {"amax", "amin"} do
            both("scatter_reduce " .. reduce, xs,
                 function(o) return C.lt_scatter_reduce(o, x, dim, index, src, reduce) end,
                 function(o) return C.lt_scatter_reduce(o, xd, dim, id, sd, reduce) end)
          end
          both("index_select", is, function(o) return C.lt_index_select(o, x, dim, sel) end,
               function(o) return C.lt_index_select(o, xd, dim, seld) end)
          both("index_add", xs, function(o) return C.lt_index_add(o, x, dim, sel, src) end,
               function(o) return C.lt_index_add(o, xd, dim, seld, sd) end)
          both("index_copy", xs, function(o) return C.lt_index_copy(o, x, dim, sel, src) end,
               function(o) return C.lt_index_copy(o, xd, dim, seld, sd) end)
        end
      end)
    end
  end
  guarded("gather bad index", {2, 3}, "f32", function()
    local x, index = st.rand({2, 3}, "f32"), ints({2, 3}, "i64", function(i) return i == 4 and 3 or 0 end)
    local xd, id = st.to_device(x), st.to_device(index)
    same_error("gather bad index", {2, 3}, "f32",
               function() return C.lt_gather(empty({2, 3}, "f32"), x, 1, index) end,
               function() return C.lt_gather(empty({2, 3}, "f32", device), xd, 1, id) end)
  end)
end
