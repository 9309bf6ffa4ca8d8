-- einsum, split, chunk, unbind, clamp with tensor bounds (clamp_min, clamp_max, clip),
-- repeat_interleave, bincount and histc without PyTorch: finite-difference gradient checks in f64
-- (inputs often non-contiguous), values against naive loops, the views' sharing of storage, and every
-- bad input with its message. (tests/lua/test_shape_ops_torch.lua compares them with PyTorch.)
local lt = require "lutra"
local T = require "lutra.testing"
local check, equal, fails, close = T.gradcheck, T.assert_equal, T.assert_error, T.assert_close

local leaf = T.random_leaf

local function f64(list) return lt.tensor(list, {dtype = "f64"}) end

-- ---- einsum -----------------------------------------------------------------------------------------

test("einsum: gradients of contractions, batches, diagonals, ellipses, broadcasts, three operands", function()
  local a, b = leaf({2, 3, 4, 5}, true), leaf({2, 3, 6, 5})
  check(function(x, y) return lt.einsum("bhtd,bhsd->bhts", x, y) end, {a, b})
  check(function(x, y) return lt.einsum("ij,jk", x, y) end, {leaf({3, 4}, true), leaf({4, 2})})
  check(function(x) return lt.einsum("ii->i", x), lt.einsum("ii", x), lt.einsum("ij->", x) end, {leaf({4, 4}, true)})
  check(function(x) return lt.einsum("iji->j", x), lt.einsum("ijk->kji", x) end, {leaf({3, 2, 3}, true)})
  check(function(x, y) return lt.einsum("...ij,...jk->...ik", x, y), lt.einsum("...ij,jk", x, y:select(0, 0)) end,
    {leaf({2, 3, 4}, true), leaf({2, 4, 3})})
  check(function(x, y) return lt.einsum("ij,jk->ik", x, y) end, {leaf({3, 1}), leaf({4, 2}, true)}) -- j: 1 broadcasts
  check(function(x, y, z) return lt.einsum("abc,cd,de->abe", x, y, z) end, {leaf({2, 3, 4}), leaf({4, 3}, true),
    leaf({3, 2})})
  check(function(x, y) return lt.einsum("ij,k->ik", x, y), lt.einsum("ij,k->i", x, y) end, {leaf({2, 3}), leaf({4})})
  check(function(x, y) return lt.einsum("i,i", x, y), lt.einsum("i,j", x, y) end, {leaf({5}), leaf({5})})
end)

test("einsum: values against loops (f64 and i64), implicit outputs, a list of operands", function()
  local a = f64(T.random_list({2, 3, 4}))
  local b = f64(T.random_list({2, 4, 5}))
  local y = lt.einsum("bij,bjk->bik", {a, b})
  local sq = lt.ones(3, 3)
  local list = {sq}
  lt.einsum("ii->i", list)
  assert(list[1] == sq, "the caller's list is left as it was")
  local al, bl, want = a:tolist(), b:tolist(), {}
  for p = 1, 2 do
    want[p] = {}
    for i = 1, 3 do
      want[p][i] = {}
      for k = 1, 5 do
        local s = 0
        for j = 1, 4 do s = s + al[p][i][j] * bl[p][j][k] end
        want[p][i][k] = s
      end
    end
  end
  close(y, want, {rtol = 1e-15, atol = 1e-15})
  local m = lt.arange(27):reshape(3, 3, 3) -- i64: m[i][j][k] = 9i + 3j + k
  equal(lt.einsum("iii->i", m):tolist(), {0, 13, 26})
  equal(lt.einsum("iij->j", m):tolist(), {0 + 12 + 24, 1 + 13 + 25, 2 + 14 + 26})
  equal(lt.einsum("iii", m):item(), 39)
  equal(lt.einsum("ba", lt.arange(6):reshape(2, 3)).shape, {3, 2}) -- implicit: alphabetical
  equal(lt.einsum("Ba,ab", lt.ones(2, 3), lt.ones(3, 4)).shape, {2, 4}) -- capitals first: B, then b
  equal(lt.einsum(" i j , j k -> i k ", lt.ones(2, 3), lt.ones(3, 4)).shape, {2, 4}) -- spaces ignored
  equal(lt.einsum("...ij->ij", lt.ones(5, 2, 3)):tolist(), {{5, 5, 5}, {5, 5, 5}}) -- ellipsis summed
  equal(lt.einsum("i->", lt.zeros(0)):item(), 0) -- an empty sum
  local x = lt.randn(3, 4)
  local v = lt.einsum("ij->ij", x)
  v[{0, 0}] = 7
  equal(x[{0, 0}]:item(), 7) -- a view, as torch's
end)

test("einsum: bad equations and operands are errors that name the index", function()
  local a, b = lt.ones(2, 3), lt.ones(4, 5)
  fails("einsum: 'j' has size 3 in operand 1 and 4 in operand 2", lt.einsum, "ij,jk->ik", a, b)
  fails("einsum: \"ij,jk\" has 2 operand subscripts, 1 tensors were given", lt.einsum, "ij,jk", a)
  fails("einsum: operand 1 has 2 dims, its subscript 'ijk' names 3", lt.einsum, "ijk->i", a)
  fails("einsum: operand 1 has 2 dims, its subscript '...ijk' names 3", lt.einsum, "...ijk->i", a)
  fails("einsum: '1' in \"i1->i\" is not a letter", lt.einsum, "i1->i", lt.ones(2, 2))
  fails("einsum: the output's 'k' is in no operand", lt.einsum, "ij->k", a)
  fails("einsum: 'i' twice in the output", lt.einsum, "ij->ii", a)
  fails("einsum: '...' twice in the subscript", lt.einsum, "...i...->i", a)
  fails("einsum: a '.' outside '...'", lt.einsum, "i.j->i", a)
  fails("einsum: 'i' repeats in operand 1 with sizes 2 and 3", lt.einsum, "ii->i", a)
  fails("einsum: operand 2 is f64 on cpu, operand 1 is f32 on cpu", lt.einsum, "ij,jk", a,
    lt.ones(3, 2, {dtype = "f64"}))
  fails("einsum: operand 2 must be a tensor, got number", lt.einsum, "ij,jk", a, 3)
  fails("einsum: the equation must be a string", lt.einsum, a, a)
  fails("einsum: no operands given", lt.einsum, "ij")
  fails("einsum: '...' (its dim 1) has size 2 in operand 1 and 4 in operand 2", lt.einsum, "...i,...i", lt.ones(2, 3),
    lt.ones(4, 3))
end)

-- ---- split, chunk, unbind ------------------------------------------------------------------------------

test("split, chunk, unbind: torch's pieces, views of x, gradients through each", function()
  local x = lt.arange(10, {dtype = "f32"})
  local sizes = function(list)
    local s = {}
    for i, t in ipairs(list) do s[i] = t:numel() end
    return s
  end
  equal(sizes(x:split(3)), {3, 3, 3, 1})
  equal(sizes(x:split(20)), {10})
  equal(sizes(x:split({2, 0, 8})), {2, 0, 8})
  equal(sizes(x:chunk(3)), {4, 4, 2})
  equal(sizes(lt.ones(6):chunk(4)), {2, 2, 2}) -- fewer than asked, as torch
  equal(sizes(lt.zeros(0):chunk(3)), {0, 0, 0})
  equal(sizes(lt.zeros(0):split(2)), {0})
  equal(sizes(lt.zeros(0):split(0)), {0})
  equal(x:split(3)[4]:tolist(), {9})
  local m = lt.arange(12, {dtype = "f32"}):reshape(3, 4)
  equal(m:split(3, -1)[2]:tolist(), {{3}, {7}, {11}})
  equal(m:unbind(1)[3]:tolist(), {2, 6, 10})
  equal(#lt.unbind(m), 3)
  local piece = m:split({1, 2}, 0)[2]
  piece:fill_(-1) -- a view: writes reach m
  equal(m:sum():item(), 0 + 1 + 2 + 3 - 8)
  check(function(a)
    local out = {}
    for _, t in ipairs(a:split(2, 1)) do out[#out + 1] = t end
    for _, t in ipairs(a:chunk(2, 0)) do out[#out + 1] = t end
    for _, t in ipairs(a:unbind(-1)) do out[#out + 1] = t end
    for _, t in ipairs(a:split({1, 3, 1}, 1)) do out[#out + 1] = t:exp() end
    return out
  end, {leaf({3, 5}, true)})
  local a = leaf({4, 3})
  local parts = a:unbind(0)
  parts[2]:sum():backward() -- only one piece used: the others' places get 0
  equal(a.grad:tolist(), {{0, 0, 0}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0}})
end)

test("split, chunk, unbind: bad arguments", function()
  local x = lt.ones(4, 6)
  fails("split: the sizes {2, 3} sum to 5, expected dim 1's size 6", x.split, x, {2, 3}, 1)
  fails("split: size 2 is -1, expected a non-negative integer", x.split, x, {7, -1}, 0)
  fails("split: size must be non-negative, got -2", x.split, x, -2)
  fails("split: size can be 0 only where dim 0 is empty (it has 4)", x.split, x, 0)
  fails("split: size (a number or a list of sizes) must be an integer, got 1.5", x.split, x, 1.5)
  fails("split: dim 2 out of range for a 2-d tensor", x.split, x, 2, 2)
  fails("split: expects a tensor with at least one dim", lt.split, lt.tensor(1), 1)
  fails("chunk: chunks must be at least 1, got 0", x.chunk, x, 0)
  fails("chunk: dim -3 out of range for a 2-d tensor", x.chunk, x, 2, -3)
  fails("unbind: dim 5 out of range for a 2-d tensor", x.unbind, x, 5)
  fails("split: x must be a tensor, got table", lt.F.split, {}, 2)
end)

-- ---- clamp ---------------------------------------------------------------------------------------------

test("clamp with tensor bounds: values, broadcasting, torch's gradients (ties, NaN, min > max)", function()
  local x = f64({{-2, -1, 0, 1, 2}, {0 / 0, 0.5, 3, -3, 1}}):requires_grad_()
  local lo = f64({-1, -1, -1, 0, 0}):requires_grad_()
  local hi = f64({{1}, {0.75}}):requires_grad_()
  local y = x:clamp(lo, hi)
  local yl = y:tolist()
  equal(yl[1], {-1, -1, 0, 1, 1})
  assert(yl[2][1] ~= yl[2][1], "NaN stays NaN")
  equal({yl[2][2], yl[2][3], yl[2][4], yl[2][5]}, {0.5, 0.75, 0, 0.75})
  y:backward(lt.ones(2, 5, {dtype = "f64"}))
  -- x passes where lo <= x <= hi (ties included, NaN not); lo takes x < lo < hi; hi takes x > hi
  equal(x.grad:tolist(), {{0, 1, 1, 1, 0}, {0, 1, 0, 0, 0}})
  equal(lo.grad:tolist(), {1, 0, 0, 1, 0})
  equal(hi.grad:tolist(), {{1}, {2}})
  -- min > max: the result is max, whose gradient it is
  local a, l, h = f64({0, 5}):requires_grad_(), f64({2, 2}):requires_grad_(), f64({1, 1}):requires_grad_()
  local r = a:clamp(l, h)
  equal(r:tolist(), {1, 1})
  r:sum():backward()
  equal({a.grad:tolist(), l.grad:tolist(), h.grad:tolist()}, {{0, 0}, {0, 0}, {1, 1}})
  -- the result takes the broadcast shape; a number beside a tensor bound
  equal(lt.clamp(lt.zeros(3), lt.zeros(2, 3)).shape, {2, 3})
  equal(lt.tensor({-1, 0.2, 3}):clamp(lt.tensor({0, 0, 0}), 1):tolist(), {0, T.f32(0.2), 1})
  equal(lt.tensor({-1, 0.2, 3}):clamp(nil, lt.tensor(0)):tolist(), {-1, 0, 0})
  check(function(v, p, q) return v:clamp_min(p), v:clamp_max(q:t()), v:clip(p, 0.3), v:clamp(p, q:t()) end,
    {leaf({3, 4}, true), leaf({3, 4}), leaf({4, 3}, true)})
end)

test("clamp with numbers: NaN takes no gradient (as torch), clamp_min, clamp_max, clip, in place", function()
  local x = f64({0 / 0, -2, 0.5, 2}):requires_grad_()
  x:clamp(-1, 1):sum():backward()
  equal(x.grad:tolist(), {0, 0, 1, 0})
  x.grad = nil
  x:clamp_min(-1):sum():backward()
  equal(x.grad:tolist(), {0, 0, 1, 1})
  x.grad = nil
  x:clamp_max(1):sum():backward()
  equal(x.grad:tolist(), {0, 1, 1, 0})
  equal(lt.tensor({-2, 0, 2}):clamp_min(-1):tolist(), {-1, 0, 2})
  equal(lt.tensor({-2, 0, 2}):clamp_max(1):tolist(), {-2, 0, 1})
  equal(lt.clip(lt.tensor({-2, 0, 2}), -1, 1):tolist(), {-1, 0, 1})
  local t = lt.tensor({-2, 0, 2})
  equal(t:clamp_min_(0):tolist(), {0, 0, 2})
  equal(t:clamp_max_(1):tolist(), {0, 0, 1})
  equal(t:clip_(0.5, 0.75):tolist(), {0.5, 0.5, 0.75})
  local out = lt.empty(3)
  equal(lt.clamp(lt.tensor({-2, 0, 2}), lt.tensor({0, 0, 0}), 1, out):tolist(), {0, 0, 1})
  equal(out:tolist(), {0, 0, 1})
  -- in place with tensor bounds: gradients reach x's old value and the bounds
  local base, lo = leaf({5}), f64({0, 0, 0, 0, 0}):requires_grad_()
  local v = base * 1
  v:clamp_(lo, 0.25)
  v:sum():backward()
  local bl, gl, ll = base:tolist(), base.grad:tolist(), lo.grad:tolist()
  for i = 1, 5 do
    equal(gl[i], (bl[i] >= 0 and bl[i] <= 0.25) and 1 or 0, "x's gradient " .. i)
    equal(ll[i], bl[i] < 0 and 1 or 0, "min's gradient " .. i)
  end
  check(function(p, q)
    local w = p * 1
    w:clamp_min_(q)
    return w
  end, {leaf({2, 3}, true), leaf({2, 3})})
end)

test("clamp: bad bounds", function()
  local x = lt.ones(2, 3)
  fails("clamp: at least one of min and max must be given", x.clamp, x)
  fails("clamp_: at least one of min and max must be given", x.clamp_, x)
  fails("clamp_min: min must be a number or a tensor, got nil", x.clamp_min, x)
  fails("clamp_max_: max must be a number or a tensor, got nil", x.clamp_max_, x)
  fails("clamp: min must be a number, a tensor or nil, got string", x.clamp, x, "0")
  fails("clamp: min is f64 on cpu, expected x's dtype and device (f32 on cpu)", x.clamp, x,
    lt.zeros(3, {dtype = "f64"}))
  fails("clip: max is i64 on cpu", x.clip, x, 0, lt.ones(3, {dtype = "i64"}))
  fails("clamp_: the bounds broadcast x [2,3] to [4,2,3]; in place, x's shape must not change", x.clamp_, x,
    lt.zeros(4, 2, 3))
  fails("clamp: out has shape [3], expected [2,3]", x.clamp, x, lt.zeros(3), nil, lt.empty(3))
end)

-- ---- repeat_interleave ---------------------------------------------------------------------------------

test("repeat_interleave: numbers, counts per slice, flattening, the one-argument form, gradients", function()
  local m = lt.arange(6, {dtype = "f32"}):reshape(2, 3)
  equal(m:repeat_interleave(2, 1):tolist(), {{0, 0, 1, 1, 2, 2}, {3, 3, 4, 4, 5, 5}})
  equal(m:repeat_interleave(2, -2):tolist(), {{0, 1, 2}, {0, 1, 2}, {3, 4, 5}, {3, 4, 5}})
  equal(m:repeat_interleave(2):tolist(), {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5})
  equal(m:repeat_interleave(lt.tensor({1, 0, 2}, {dtype = "i64"}), 1):tolist(), {{0, 2, 2}, {3, 5, 5}})
  equal(m:repeat_interleave({3}, 0):tolist(), {{0, 1, 2}, {0, 1, 2}, {0, 1, 2}, {3, 4, 5}, {3, 4, 5}, {3, 4, 5}})
  equal(m:repeat_interleave(lt.tensor(1, {dtype = "i32"}), 1):tolist(), m:tolist())
  equal(m:repeat_interleave(0, 1).shape, {2, 0})
  equal(m:repeat_interleave(2, 0, 4).shape, {4, 3})
  equal(lt.repeat_interleave(lt.tensor({2, 0, 1}, {dtype = "i64"})):tolist(), {0, 0, 2})
  check(function(a, r)
    return a:repeat_interleave(3, 1), a:repeat_interleave(r, 0), a:repeat_interleave({2, 0, 1, 1}, 1),
      a:repeat_interleave(2)
  end, {leaf({3, 4}, true), lt.tensor({1, 0, 3}, {dtype = "i64"})})
end)

test("repeat_interleave: bad repeats", function()
  local x = lt.ones(2, 3)
  fails("repeat_interleave: repeats must be non-negative, got -1", x.repeat_interleave, x, -1, 0)
  fails("repeat_interleave: repeats[1] is -2, expected a non-negative integer", x.repeat_interleave, x, {1, -2, 1}, 1)
  fails("repeat_interleave: 2 repeats for 3 slices along dim", x.repeat_interleave, x, {1, 1}, 1)
  fails("repeat_interleave: repeats must be an i32 or i64 tensor, got f32", x.repeat_interleave, x, lt.ones(3), 1)
  fails("repeat_interleave: repeats must be 0-d or 1-d, got 2 dims", x.repeat_interleave, x,
    lt.ones(1, 3, {dtype = "i64"}), 1)
  fails("repeat_interleave: dim 2 out of range for a 2-d tensor", x.repeat_interleave, x, 2, 2)
  fails("repeat_interleave: output_size is 5, the repeats make 6", x.repeat_interleave, x, 2, 1, 5)
  fails("repeat_interleave: repeats must be a number, a tensor or a list of counts, got string", x.repeat_interleave,
    x, "2", 1)
end)

-- ---- bincount, histc -----------------------------------------------------------------------------------

test("bincount: counts and weighted sums against a loop; dtypes as torch's", function()
  T.seed(7)
  local vals, w = {}, {}
  for i = 1, 40 do vals[i], w[i] = T.randint(0, 9), T.uniform() - 0.5 end
  local want, wsum = {}, {}
  for v = 0, 8 do want[v + 1], wsum[v + 1] = 0, 0 end
  for i = 1, 40 do
    want[vals[i] + 1] = want[vals[i] + 1] + 1
    wsum[vals[i] + 1] = wsum[vals[i] + 1] + w[i] -- in x's order, as index_add adds
  end
  local x = lt.tensor(vals, {dtype = "i64"})
  local c = lt.bincount(x)
  equal(c.dtype, "i64")
  local n = #c:tolist()
  for v = n + 1, 9 do want[v] = nil end
  equal(c:tolist(), want)
  equal(lt.bincount(x:to("i32")):tolist(), want)
  equal(lt.bincount(x:to("u8")):tolist(), want)
  local cw = x:bincount(f64(w))
  equal(cw.dtype, "f64")
  for v = n + 1, 9 do wsum[v] = nil end
  equal(cw:tolist(), wsum)
  equal(lt.bincount(x, lt.tensor(w)).dtype, "f32")
  equal(lt.bincount(x, lt.tensor(w, {dtype = "bf16"})).dtype, "f64")
  equal(#lt.bincount(x, nil, 20):tolist(), 20)
  equal(lt.bincount(lt.zeros(0, {dtype = "i64"}), nil, 3):tolist(), {0, 0, 0})
  equal(lt.bincount(lt.zeros(0, {dtype = "i64"}), lt.zeros(0)).dtype, "i64") -- as torch
  local g = lt.tensor(w, {dtype = "f64"}):requires_grad_()
  equal(lt.bincount(x, g).requires_grad, false) -- counts are not differentiable
end)

test("histc: bins against a loop in every float dtype; outside values, NaN and inf left out", function()
  T.seed(11)
  local vals = {}
  for i = 1, 200 do vals[i] = math.floor((T.uniform() * 6 - 3) * 64) / 64 end -- exact in every dtype
  for _, v in ipairs {-2, 3, 2.5, -2.5, 0 / 0, math.huge, -math.huge} do vals[#vals + 1] = v end
  local function loop(lo, hi, bins, n)
    local counts = {}
    for b = 1, bins do counts[b] = 0 end
    for i = 1, n or #vals do
      local v = vals[i]
      if v >= lo and v <= hi then
        local b = math.min(math.floor((v - lo) * bins / (hi - lo)), bins - 1) -- these values: no rounding near edges
        counts[b + 1] = counts[b + 1] + 1
      end
    end
    return counts
  end
  for _, dt in ipairs {"f64", "f32", "bf16", "f16"} do
    local x = lt.tensor(vals, {dtype = "f64"}):to(dt)
    equal(x:histc(5, -2, 3):tolist(), loop(-2, 3, 5), dt .. " range")
    equal(lt.histc(x:narrow(0, 0, 200):reshape(20, 10):t(), 8):to("f64"):tolist(), (function()
      local lo, hi = math.huge, -math.huge
      for i = 1, 200 do lo, hi = math.min(lo, vals[i]), math.max(hi, vals[i]) end
      return loop(lo, hi, 8, 200) -- the data's range, a transposed input
    end)(), dt .. " data range")
    equal(x:histc(5, -2, 3).dtype, dt)
  end
  equal(lt.histc(lt.tensor({2.5, 2.5}), 4):tolist(), {0, 0, 2, 0}) -- one value v: [v - 1, v + 1]
  equal(lt.histc(lt.zeros(0), 3):tolist(), {0, 0, 0})
  equal(lt.histc(lt.tensor({0, 1, 2, 3}), 1, 0, 3):tolist(), {4})
  equal(lt.histc(leaf({4, 3}), 3).requires_grad, false) -- counts are not differentiable
end)

test("bincount and histc: bad input", function()
  fails("bincount: x must be non-negative, it holds -1", lt.bincount, lt.tensor({1, -1}, {dtype = "i64"}))
  fails("bincount: x must be a 1-d tensor of non-negative integers, got 1-d f32", lt.bincount, lt.tensor({1, 2}))
  fails("bincount: x must be a 1-d tensor of non-negative integers, got 2-d i64", lt.bincount,
    lt.zeros(2, 2, {dtype = "i64"}))
  fails("bincount: weights must be 1-d with x's length 2 on cpu, got [3] on cpu", lt.bincount,
    lt.tensor({1, 2}, {dtype = "i64"}), lt.ones(3))
  fails("bincount: minlength must be non-negative, got -1", lt.bincount, lt.tensor({1}, {dtype = "i64"}), nil, -1)
  fails("histc: bins must be at least 1, got 0", lt.histc, lt.ones(3), 0)
  fails("histc: max must be larger than min (got min 2, max 1)", lt.histc, lt.ones(3), 4, 2, 1)
  fails("histc: the range [1, inf] is not finite", lt.histc, lt.tensor({1, math.huge}), 4)
  fails("histc: the range [nan, nan] is not finite", lt.histc, lt.tensor({1, 0 / 0}), 4)
  fails("histc: x must be a float tensor (f32, f64, bf16, f16), got i64", lt.histc, lt.ones(3, {dtype = "i64"}), 4)
  fails("histc: min and max must be numbers", lt.histc, lt.ones(3), 4, "0", 1)
end)
