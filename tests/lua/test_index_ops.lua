-- The indexing ops (lutra.functional.gather, index_select, masked_fill, one_hot): values against
-- naive loops, f64 gradients against finite differences (contiguous and permuted inputs), and the
-- refusals of bad indices and shapes, each naming the op, the value and its position.
local lt = require "lutra"
local T = require "lutra.testing"
local F = lt.F

local function ids(list, dt) return lt.tensor(list, {dtype = dt or "i64"}) end

test("gather and scatter_add against naive loops, i32 and i64 index, negative dim", function()
  local x = T.random_leaf({3, 4, 5}, true):detach()
  for _, dt in ipairs {"i32", "i64"} do
    local index = lt.tensor(T.random_list({2, 4, 3}, function() return T.randint(0, 5) end), {dtype = dt})
    local y = x:gather(-1, index)
    T.assert_equal(y.shape, {2, 4, 3})
    for i = 0, 1 do
      for j = 0, 3 do
        for k = 0, 2 do
          T.assert_equal(y[{i, j, k}]:item(), x[{i, j, index[{i, j, k}]:item()}]:item())
        end
      end
    end
    local src = T.random_leaf({2, 4, 3}):detach()
    local s = lt.zeros({3, 4, 5}, {dtype = "f64"}):scatter_add(2, index, src)
    local want = {}
    for i = 0, 1 do
      for j = 0, 3 do
        for k = 0, 2 do
          local key = i .. "," .. j .. "," .. index[{i, j, k}]:item()
          want[key] = (want[key] or 0) + src[{i, j, k}]:item()
        end
      end
    end
    for i = 0, 2 do
      for j = 0, 3 do
        for v = 0, 4 do T.assert_close(s[{i, j, v}]:item(), want[i .. "," .. j .. "," .. v] or 0) end
      end
    end
  end
end)

test("index_select, index_add, index_copy against naive loops; masked_fill; one_hot", function()
  local x = T.random_leaf({4, 3}, true):detach()
  local index = ids({3, 0, 3}, "i32")
  local y = x:index_select(0, index)
  for r = 0, 2 do
    for c = 0, 2 do T.assert_equal(y[{r, c}]:item(), x[{index[r]:item(), c}]:item()) end
  end
  local src = lt.tensor({{1, 2, 3}, {4, 5, 6}, {7, 8, 9}}, {dtype = "f64"})
  local a = x:index_add(0, index, src)
  local c = x:index_copy(0, ids({2, 0, 1}), src)
  for col = 0, 2 do
    T.assert_close(a[{3, col}]:item(), x[{3, col}]:item() + src[{0, col}]:item() + src[{2, col}]:item())
    T.assert_close(a[{0, col}]:item(), x[{0, col}]:item() + src[{1, col}]:item())
    T.assert_equal(a[{1, col}]:item(), x[{1, col}]:item())
    T.assert_equal(c[{2, col}]:item(), src[{0, col}]:item())
    T.assert_equal(c[{3, col}]:item(), x[{3, col}]:item())
  end
  local m = x:masked_fill(lt.tensor({true, false, true}), 7)
  T.assert_equal(m[{1, 0}]:item(), 7)
  T.assert_equal(m[{1, 1}]:item(), x[{1, 1}]:item())
  T.assert_equal(F.one_hot(ids({2, 0}), 4):tolist(), {{0, 0, 1, 0}, {1, 0, 0, 0}})
end)

test("gradients against finite differences (f64, contiguous and permuted)", function()
  for _, nc in ipairs {false, true} do
    local x = T.random_leaf({3, 4, 5}, nc)
    local index = lt.tensor(T.random_list({3, 2, 5}, function() return T.randint(0, 4) end), {dtype = "i64"})
    local src = T.random_leaf({3, 2, 5}, nc)
    T.gradcheck(function(a) return a:gather(1, index) end, {x}, {msg = "gather"})
    T.gradcheck(function(a, s) return a:scatter_add(1, index, s) end, {x, src}, {msg = "scatter_add"})
    local perm = ids({0, 3, 1}):reshape({3, 1, 1}):expand({3, 2, 5}):contiguous()
    T.gradcheck(function(a, s) return a:scatter(0, perm:narrow(0, 0, 3), s) end,
      {T.random_leaf({4, 2, 5}, nc), T.random_leaf({3, 2, 5}, nc)}, {msg = "scatter"})
    local sel = ids({2, 0, 2, 3})
    T.gradcheck(function(a) return a:index_select(1, sel) end, {x}, {msg = "index_select"})
    T.gradcheck(function(a, s) return a:index_add(1, sel, s) end, {x, T.random_leaf({3, 4, 5}, nc)},
      {msg = "index_add"})
    T.gradcheck(function(a, s) return a:index_copy(-1, ids({4, 1}), s) end, {x, T.random_leaf({3, 4, 2}, nc)},
      {msg = "index_copy"})
    for _, reduce in ipairs {"sum", "mean", "amax", "amin"} do
      for _, inc in ipairs {true, false} do
        T.gradcheck(function(a, s) return a:scatter_reduce(1, index, s, reduce, {include_self = inc}) end, {x, src},
          {msg = "scatter_reduce " .. reduce})
      end
    end
    local mask = lt.tensor(T.random_list({4, 5}, function() return T.uniform() < 0.5 end), {dtype = "bool"})
    T.gradcheck(function(a) return a:masked_fill(mask, 0.25) end, {x}, {msg = "masked_fill"})
  end
end)

test("bad indices and shapes are refused with the op, the value and its position", function()
  local x = lt.zeros({2, 3})
  T.assert_error("gather: index 3 out of range [0, 3) of dim 1, at index[1,0]",
    function() return x:gather(1, ids({{0, 1}, {3, 0}})) end)
  T.assert_error("gather: index -1 out of range [0, 3) of dim 1, at index[0,1]",
    function() return x:gather(-1, ids({{0, -1}}, "i32")) end)
  T.assert_error("scatter_add: index 2 out of range [0, 2) of dim 0, at index[0,0]",
    function() return x:scatter_add(0, ids({{2}}), lt.ones({1, 1})) end)
  T.assert_error("index_select: index 5 out of range [0, 3) of dim 1, at index[2]",
    function() return x:index_select(1, ids({0, 1, 5})) end)
  T.assert_error("index_add: index -2 out of range [0, 2) of dim 0, at index[0]",
    function() return x:index_add(0, ids({-2}), lt.ones({1, 3})) end)
  T.assert_error("index_copy: src is [2,2] f32 cpu, expected [2,3]",
    function() return x:index_copy(0, ids({0, 1}), lt.ones({2, 2})) end)
  T.assert_error("gather: index is [1,2] f32 cpu, expected i32 or i64",
    function() return x:gather(0, lt.zeros({1, 2})) end)
  T.assert_error("gather: index is [2] i64 cpu, expected as many dims as x",
    function() return x:gather(0, ids({0, 1})) end)
  T.assert_error("is larger than x", function() return x:gather(0, ids({{0, 1, 0, 1}})) end)
  T.assert_error("index_select: index is [1,1] i64 cpu, expected 1-d",
    function() return x:index_select(0, ids({{0}})) end)
  T.assert_error("masked_fill: mask must be a bool tensor", function() return x:masked_fill(lt.zeros({3}), 1) end)
  T.assert_error("masked_fill: mask of shape [4] does not broadcast", function()
    return x:masked_fill(lt.tensor({true, false, true, true}), 1)
  end)
  T.assert_error("scatter_reduce: reduce is prod, expected", function()
    return x:scatter_reduce(0, ids({{0}}), lt.ones({1, 1}), "prod")
  end)
  T.assert_error("one_hot: index value 4 out of range [0, 3)", function() return F.one_hot(ids({4}), 3) end)
  T.assert_error("one_hot: index value -1 is negative", function() return F.one_hot(ids({-1}), 3) end)
end)
