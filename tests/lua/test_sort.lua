-- The ops along a dim: f64 finite-difference gradients of topk, sort, cumsum, cumprod (with
-- zeros), tril, triu, logsumexp and nan_to_num on odd shapes and non-contiguous inputs; the
-- order of ties and NaN against a naive stable sort; edge cases (k = 0, 0-d, empty rows,
-- +-inf rows); every refusal and its message. The comparison with torch is test_sort_torch.lua.
local lt = require "lutra"
local T = require "lutra.testing"
local check, equal, fails, close = T.gradcheck, T.assert_equal, T.assert_error, T.assert_close

local leaf = T.random_leaf

test("f64 gradients: topk, sort, cumsum, tril/triu, logsumexp", function()
  T.seed(15)
  check(function(x) return (x:topk(3, -1)) end, {leaf({4, 7})})
  check(function(x) return (x:topk(2, 0, false)) end, {leaf({5, 3, 2}, true)})
  check(function(x) return (x:sort(1, true)) end, {leaf({3, 6}, true)})
  check(function(x) return (x:sort(0)) end, {leaf({5, 2, 3})})
  check(function(x) return x:cumsum(-1) end, {leaf({3, 7}, true)})
  check(function(x) return x:cumsum(0) end, {leaf({6, 2, 3})})
  check(function(x) return x:tril(1) end, {leaf({2, 4, 5}, true)})
  check(function(x) return x:triu(-1) end, {leaf({5, 3})})
  check(function(x) return x:logsumexp(-1) end, {leaf({3, 9}, true)})
  check(function(x) return x:logsumexp({0, 2}, true) end, {leaf({4, 3, 5})})
  check(function(x) return x:nan_to_num() end, {leaf({3, 4})})
end)

test("f64 gradients: cumprod, also with one and with two zeros in a row", function()
  T.seed(16)
  check(function(x) return x:cumprod(-1) end, {leaf({3, 6}, true)})
  check(function(x) return x:cumprod(0) end, {leaf({5, 4})})
  for _, zeros in ipairs {{3}, {2, 5}, {1}, {7}} do
    local x = lt.tensor(T.random_list({2, 7}), {dtype = "f64"})
    for _, z in ipairs(zeros) do x[{1, z - 1}] = 0 end
    check(function(y) return y:cumprod(1) end, {x:requires_grad_()}, {eps = 1e-7})
  end
end)

-- the stable order: by value, NaN above everything, equal values by index
local function naive_order(row, descending)
  local idx = {}
  for i = 1, #row do idx[i] = i end
  table.sort(idx, function(a, b)
    local va, vb = row[a], row[b]
    local na, nb = va ~= va, vb ~= vb
    if na ~= nb then
      if descending then return na else return nb end
    end
    if not na and va ~= vb then
      if descending then return va > vb else return va < vb end
    end
    return a < b
  end)
  for i = 1, #idx do idx[i] = idx[i] - 1 end
  return idx
end

test("ties and NaN: the stable order on every dtype, and topk keeps the lower index", function()
  local nan = 0 / 0
  local row = {2, nan, -1, 2, 5, nan, -1, 0, 5, 2, -0.0, 0}
  for _, dt in ipairs {"f32", "f64", "bf16", "f16", "i32", "i64"} do
    local vals = {}
    for i, v in ipairs(row) do vals[i] = (v ~= v and dt:sub(1, 1) == "i") and 7 or v end
    local x = lt.tensor({vals, vals}, {dtype = dt}):t():contiguous():t() -- non-contiguous rows
    for _, desc in ipairs {false, true} do
      local _, i = x:sort(-1, desc)
      equal(i:tolist()[1], naive_order(vals, desc), dt .. " sort descending=" .. tostring(desc))
      local _, ki = x:topk(5, -1, desc)
      local want = naive_order(vals, desc)
      equal(ki:tolist()[2], {want[1], want[2], want[3], want[4], want[5]}, dt .. " topk largest=" .. tostring(desc))
    end
    equal(x:argsort(1, true):tolist()[1], naive_order(vals, true), dt .. " argsort")
  end
end)

test("edge cases: k = 0, 0-d tensors, empty rows, infinite rows of logsumexp", function()
  local x = lt.tensor({{1, 2, 3}, {4, 5, 6}})
  local v, i = x:topk(0, 1)
  equal(v.shape, {2, 0})
  equal(i.shape, {2, 0})
  local s = lt.tensor(3.5)
  local sv, si = s:sort()
  equal(sv:item(), 3.5)
  equal(si:item(), 0)
  equal(s:cumsum(0):item(), 3.5)
  equal(lt.zeros(0, 4):cumsum(0).shape, {0, 4})
  equal(lt.zeros(3, 0):sort(-1).shape, {3, 0})
  local inf = math.huge
  local r = lt.tensor({{-inf, -inf}, {inf, 1}, {0 / 0, 1}}):logsumexp(1):tolist()
  equal(r[1], -inf)
  equal(r[2], inf)
  equal(r[3] ~= r[3], true)
  close(lt.tensor({{1000, 1000}}):logsumexp(1), lt.tensor({1000 + math.log(2)}))
  equal(lt.tensor({1, 0 / 0, inf, -inf}):isfinite():tolist(), {true, false, false, false})
  equal(lt.tensor({1, 0 / 0, inf, -inf}):isinf():tolist(), {false, false, true, true})
  equal(lt.tensor({1, 0 / 0, inf, -inf}, {dtype = "f16"}):nan_to_num():tolist(), {1, 0, 65504, -65504})
  equal(lt.tensor({0 / 0, inf}):nan_to_num(1, 2, 3):tolist(), {1, 2})
  equal(lt.tensor({3, 4}, {dtype = "i32"}):isfinite():tolist(), {true, true})
  equal(lt.ones(2, 3, 3):tril():tolist()[2], {{1, 0, 0}, {1, 1, 0}, {1, 1, 1}})
  equal(lt.ones(3, 4):triu(1):tolist(), {{0, 1, 1, 1}, {0, 0, 1, 1}, {0, 0, 0, 1}})
end)

test("bf16 backward of exp under a sum: the broadcast gradient reaches every element", function()
  local x = lt.tensor({{-2, -1, 0}}, {dtype = "bf16"}):requires_grad_()
  x:exp():sum(-1):backward(lt.tensor({1}, {dtype = "bf16"}))
  close(x.grad:float(), lt.tensor({{-2, -1, 0}}):exp(), {atol = 4e-3})
end)

test("refusals name the op and the problem", function()
  local x = lt.tensor({{1, 2, 3}})
  fails("topk: k 4 out of range for dim -1 of size 3", function() x:topk(4) end)
  fails("topk: k -1 out of range", function() x:topk(-1) end)
  fails("topk: k must be an integer", function() x:topk(1.5) end)
  fails("sort: dim 2 out of range for a 2-d tensor", function() x:sort(2) end)
  fails("sort: x must be a float or integer tensor", function() x:gt(1):sort() end)
  fails("cumsum: x must be a float tensor", function() x:to("i32"):cumsum(0) end)
  fails("cumsum: dim must be an integer", function() x:cumsum() end)
  fails("cumprod: dim 3 out of range", function() x:cumprod(3) end)
  fails("tril: x must have at least 2 dims", function() lt.tensor({1, 2}):tril() end)
  fails("triu: diagonal must be an integer", function() x:triu(0.5) end)
  fails("logsumexp: dims must be a dim or a list of dims", function() x:logsumexp() end)
  fails("logsumexp: x must be a float tensor", function() x:to("i64"):logsumexp(1) end)
  fails("nan_to_num: nan must be a number or nil", function() x:nan_to_num("a") end)
  fails("sort_backward: indices must be i64", function() lt.F.sort_backward(x, x, 1, 3) end)
end)
