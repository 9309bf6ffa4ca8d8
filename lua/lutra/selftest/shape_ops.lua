-- lutra.selftest.shape_ops — the ops made of other ops (lutra/functional/einsum.lua, split.lua,
-- clamp.lua, repeat_interleave.lua, histogram.lua) on st.device against the CPU on the same inputs,
-- values and input gradients: they have no kernel of their own, so this checks that every op they
-- are made of runs on the device in their dtypes (where, comparisons, conversions, index_select,
-- index_add, reductions, matmul).
--
-- Tolerances (st.check: max abs err <= tol * max(1, max |want|)): split, chunk, unbind, clamp,
-- repeat_interleave (its gradient an index_add, in order on both devices) and the counts of bincount
-- and histc move or add the same bits (0); einsum is matmul's (lutra/selftest/matmul.lua's MATMUL_TOL).
return function(st)
  local lt = st.lt
  local TOL = {f64 = 1e-12, f32 = 1e-5, bf16 = 1.6e-2, f16 = 2e-3}

  -- fn(inputs...) -> a list of results on both devices; compares results and the inputs' gradients of
  -- sum_k sum(result_k * g_k) (g: the same random tensors on both sides)
  local function compare(op, dt, tol, inputs, fn)
    local function run(xs)
      local leaves = {}
      for i, x in ipairs(xs) do
        if lt.is_tensor(x) and x:is_floating_point() then leaves[i] = x:requires_grad_() end
      end
      local ys = fn(unpack(xs))
      return ys, leaves
    end
    local dev_inputs = {}
    for i, x in ipairs(inputs) do dev_inputs[i] = lt.is_tensor(x) and st.to_device(x) or x end
    local ys_c, leaves_c = run(inputs)
    local ys_d, leaves_d = run(dev_inputs)
    local loss_c, loss_d
    for k, y in ipairs(ys_c) do
      st.check(op .. " y" .. k, dt, ys_d[k], y, tol)
      if y:is_floating_point() and y.requires_grad then
        local g = st.rand(y.shape, "f64", -1, 1):to(y.dtype)
        loss_c = (loss_c or 0) + (y * g):sum()
        loss_d = (loss_d or 0) + (ys_d[k] * st.to_device(g)):sum()
      end
    end
    if loss_c == nil then return end
    loss_c:backward()
    loss_d:backward()
    for i, leaf in pairs(leaves_c) do st.check(op .. " grad " .. i, dt, leaves_d[i].grad, leaf.grad, tol) end
  end

  for _, dt in ipairs {"f32", "f64", "bf16", "f16"} do
    local function r(shape, lo, hi) return st.rand(shape, "f64", lo, hi):to(dt) end
    local function eighths(shape) -- multiples of 1/8: ties with the clamp bounds below
      return st.ints(shape, "f64", function() return st.randint(-16, 17) / 8 end):to(dt)
    end
    for _, case in ipairs {
      {"bhtd,bhsd->bhts", {2, 3, 5, 8}, {2, 3, 7, 8}}, {"ij,jk", {9, 33}, {33, 5}}, {"ii->i", {6, 6}},
      {"...ij,...jk->...ik", {2, 3, 4, 5}, {5, 6}}, {"abc,cd,de->abe", {2, 3, 4}, {4, 5}, {5, 3}},
      {"ij,k->i", {3, 4}, {5}}, {"ij,j->i", {4, 1}, {6}},
    } do
      local ins = {}
      for i = 2, #case do ins[i - 1] = r(case[i]) end
      st.guarded("einsum", case[2], dt, function()
        compare("einsum " .. case[1], dt, TOL[dt], ins, function(...) return {lt.einsum(case[1], ...)} end)
      end)
    end
    st.guarded("split", {7, 10}, dt, function()
      compare("split chunk unbind", dt, 0, {r({7, 10})}, function(x)
        local out = {}
        for _, t in ipairs(x:split(3, 1)) do out[#out + 1] = t end
        for _, t in ipairs(x:split({2, 4, 1}, 0)) do out[#out + 1] = t end
        for _, t in ipairs(x:chunk(3, 0)) do out[#out + 1] = t end
        for _, t in ipairs(x:unbind(1)) do out[#out + 1] = t end
        return out
      end)
    end)
    st.guarded("clamp", {6, 9}, dt, function()
      compare("clamp tensors", dt, 0, {eighths({6, 9}), eighths({6, 9}), eighths({6, 9})}, function(x, lo, hi)
        return {x:clamp(lo, hi), x:clamp_min(lo), x:clamp_max(hi), x:clamp(-0.5, 0.75)}
      end)
      compare("clamp broadcast", dt, 0, {eighths({6, 9}), eighths({9}), eighths({6, 1})}, function(x, lo, hi)
        return {x:detach():clamp(lo:detach(), hi:detach())} -- values: the broadcast's gradients are sums
      end)
    end)
    st.guarded("repeat_interleave", {5, 4}, dt, function()
      local counts = lt.tensor({2, 0, 1, 3}, {dtype = "i64"})
      compare("repeat_interleave", dt, 0, {r({5, 4}), counts}, function(x, c)
        return {x:repeat_interleave(3, 0), x:repeat_interleave(c, 1), x:repeat_interleave(2)}
      end)
    end)
    st.guarded("histc", {300}, dt, function()
      local x = st.ints({300}, "f64", function() return (st.randint(-200, 200) + 0.5) / 64 end):to(dt)
      compare("histc", dt, 0, {x}, function(v)
        v = v:detach()
        return {v:histc(7, -2, 2.5), v:histc(16)}
      end)
      local ids = st.ints({200}, "i64", function() return st.randint(0, 13) end)
      compare("bincount", dt, 0, {ids, r({200})}, function(i, w)
        return {i:bincount(), i:bincount(w:detach(), 20)}
      end)
    end)
  end
end
