-- lutra.selftest.embedding — the embedding lookup on st.device against the CPU on the same inputs
-- (kernels/embedding.cu): forward from a contiguous and a strided table, backward with repeated
-- ids, f32/f64/bf16/f16 (i32 tables forward only), and the errors of out-of-range ids.
--
-- Exact (0): the forward is a copy; the backward sums each id's rows in position order from 0 (in
-- f32 for 16-bit) on the GPU as the CPU does: the same bits. The error messages match.
return function(st)
  local C, device = st.C, st.device
  local ok, empty, ints, randint, guarded, same_error = st.ok, st.empty, st.ints, st.randint, st.guarded,
    st.same_error

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
end
