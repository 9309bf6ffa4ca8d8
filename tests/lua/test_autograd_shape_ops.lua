-- Autograd, reductions and shape ops: finite-difference gradient checks in f64 for sum, mean,
-- max, min, prod (with zeros), norm, var, std over all dims, one dim, several dims, keepdim
-- or not; softmax and log_softmax; every view (view, reshape, flatten, squeeze, unsqueeze,
-- transpose, t, T, permute, narrow, slice with steps, select, indexing, expand); cat and
-- stack; index assignment. Inputs have random shapes and are often non-contiguous.
local lt = require "lutra"
local T = require "lutra.testing"
local check, equal, fails = T.gradcheck, T.assert_equal, T.assert_error

local function ri(lo, hi) return T.randint(lo, hi + 1) end

local leaf = T.random_leaf

test("sum and mean over all, one, several and negative dims, keepdim or not", function()
  for trial = 1, 3 do
    local x = leaf({ri(2, 3), ri(1, 3), ri(2, 4)}, trial == 2)
    check(function(a)
      return a:sum(), a:sum(0), a:sum(-1, true), a:sum({0, 2}), a:sum({2, 0}, true), a:mean(), a:mean(1),
        a:mean({0, 1}, true), lt.sum(a, 2)
    end, {x}, {msg = "trial " .. trial})
  end
  check(function(a) return a:sum(), a:mean() end, {lt.tensor(2.5, {dtype = "f64"}):requires_grad_()}) -- 0-d
end)

test("max and min (tensor and along dims), ties split evenly", function()
  local x = leaf({3, 4}, true)
  check(function(a)
    local v = a:max(1) -- values (indices are not differentiable)
    return a:max(), a:min(), v, (a:min(0, true)), a:max({0, 1}), lt.max(a, -1)
  end, {x})
  local y = lt.tensor({{1, 3, 3}, {2, 0, 1}}, {dtype = "f64", requires_grad = true})
  y:max():backward()
  equal(y.grad:tolist(), {{0, 0.5, 0.5}, {0, 0, 0}})
  y.grad = nil
  local m = y:max(1)
  m:sum():backward()
  equal(y.grad:tolist(), {{0, 0.5, 0.5}, {1, 0, 0}})
end)

test("prod, including slices with one or two zeros", function()
  check(function(a) return a:prod(), a:prod(0), a:prod(1, true) end, {leaf({3, 4})})
  local z = lt.tensor({{2, 0, 3}, {0, 0, 5}, {1, 2, 3}}, {dtype = "f64", requires_grad = true})
  check(function(a) return a:prod(1), a:prod(0, true) end, {z})
  z:prod(1):sum():backward()
  equal(z.grad:tolist(), {{0, 6, 0}, {0, 0, 0}, {6, 3, 2}})
end)

test("norm, var and std (corrections 0 and 1)", function()
  local x = leaf({3, 5}, true)
  check(function(a)
    return a:norm(), a:norm(1), a:norm({0, 1}, true), a:var(), a:var(1, true), a:var(0, false, 0), a:std(),
      a:std(1), a:std(nil, false, false)
  end, {x})
  -- norm of zeros: gradient 0, not nan
  local z = lt.zeros(3, {dtype = "f64", requires_grad = true})
  z:norm():backward()
  equal(z.grad:tolist(), {0, 0, 0})
end)

test("softmax and log_softmax along every dim", function()
  local x = leaf({2, 3, 4}, true)
  check(function(a) return a:softmax(), a:softmax(0), a:log_softmax(1), lt.F.log_softmax(a, -1) end, {x})
end)

test("views: reshape family, transpose, permute", function()
  local x = leaf({2, 3, 4}, true)
  check(function(a)
    return a:reshape(6, 4), a:reshape{4, -1}, a:contiguous():view(24), a:flatten(), a:flatten(1), a:unsqueeze(1),
      a:unsqueeze(-1):squeeze(-1), a:narrow(0, 0, 1):squeeze(), a:transpose(0, 2), a:permute(1, 2, 0),
      a:sum(0):t(), a.T, a:contiguous():view_as(lt.empty(4, 6)), a:reshape_as(lt.empty(24))
  end, {x})
end)

test("views: narrow, slice with steps, select, indexing, expand", function()
  local x = leaf({4, 5}, true)
  check(function(a)
    return a:narrow(1, 1, 3), a:slice(0, 1, nil, 2), a:slice(1, 0, 5, 3), a:select(0, 2), a:select(1, -1),
      a[1], a[{{1, 3}, {0, 5, 2}}], a[{-1, {2}}], a:unsqueeze(0):expand(3, 4, 5), a[{{}, {0, 1}}]:expand(4, 6),
      a:expand_as(lt.empty(2, 4, 5))
  end, {x})
  -- overlapping views of one tensor accumulate
  local y = lt.tensor({1, 2, 3, 4}, {dtype = "f64", requires_grad = true})
  local s = y:narrow(0, 0, 3):sum() + y:narrow(0, 1, 3):sum() * 2 + y[3]
  s:backward()
  equal(y.grad:tolist(), {1, 3, 3, 3})
end)

test("cat and stack, along several dims, some inputs without grad", function()
  local a, b = leaf({2, 3}, true), leaf({2, 2})
  local c = lt.tensor(T.random_list({2, 1}), {dtype = "f64"}) -- no grad
  check(function(x, y) return lt.cat({x, y, c}, 1), lt.cat({x, x}, 0), lt.cat({x:t(), y:t()}, -2) end, {a, b})
  check(function(x, y) return lt.stack({x, y}), lt.stack({x, y}, 2), lt.stack({x, x:exp()}, -1) end,
    {leaf({2, 3}), leaf({2, 3}, true)})
end)

test("index assignment: the target keeps the gradient outside the key, the value gets the rest", function()
  check(function(a, v)
    local t = a * 1
    t[{0, {1, 3}}] = v
    t[{{}, 0}] = 0.5
    return t
  end, {leaf({3, 4}), leaf({2})})
  check(function(v)
    local t = lt.zeros(3, 4, "f64")
    t[1] = v -- broadcast into a row
    return t
  end, {leaf({1})})
  local y = lt.ones(3, {dtype = "f64", requires_grad = true})
  fails("leaf tensor that requires grad", function() y[0] = 2 end)
end)

test("grad_fn names the op; views and reductions of leaves are not leaves", function()
  local x = lt.ones(2, 3, {requires_grad = true})
  equal(x:sum().grad_fn, "SumBackward")
  equal(x:t().grad_fn, "TransposeBackward")
  equal(x:select(0, 1).grad_fn, "SelectBackward")
  equal(x[0].grad_fn, "IndexBackward")
  equal(x[{0, {0, 2}}].grad_fn, "IndexBackward")
  equal(lt.cat({x, x}).grad_fn, "CatBackward")
  equal(x:softmax().grad_fn, "SoftmaxBackward")
  equal(x:t().is_leaf, false)
  equal(x:detach():t().requires_grad, false)
end)
