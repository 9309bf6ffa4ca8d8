-- Tensor math through the methods and operators, against naive Lua references in
-- double computed from tolist() values: unary and binary elementwise (broadcasting,
-- scalars on either side, non-contiguous inputs, out and in-place forms),
-- comparisons, where, clamp, reductions, argmax/argmin, matmul, softmax.
local lt = require "lutra"
local T = require "lutra.testing"
local close, equal, fails = T.assert_close, T.assert_equal, T.assert_error

-- ---- a tiny ndarray in Lua: {shape = {...}, data = {...}} row-major ---------------------

local function numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

local function nd(t) -- from a tensor
  local shape, data = t.shape, {}
  local function flat(x)
    if type(x) == "table" then for i = 1, #x do flat(x[i]) end else data[#data + 1] = x end
  end
  flat(t:tolist())
  return {shape = shape, data = data}
end

local function nested(a) -- back to nested lists
  local pos = 0
  local function rec(d)
    if d > #a.shape then
      pos = pos + 1
      return a.data[pos]
    end
    local l = {}
    for i = 1, a.shape[d] do l[i] = rec(d + 1) end
    return l
  end
  if #a.shape == 0 then return a.data[1] end
  return rec(1)
end

local function unravel(k, shape) -- 0-based flat index -> 0-based index list
  local idx = {}
  for d = #shape, 1, -1 do
    idx[d] = k % shape[d]
    k = math.floor(k / shape[d])
  end
  return idx
end

local function ravel(idx, shape) -- index list -> 1-based flat position
  local k = 0
  for d = 1, #shape do k = k * shape[d] + idx[d] end
  return k + 1
end

local function broadcast_shape(sa, sb)
  local n, out = math.max(#sa, #sb), {}
  for i = 1, n do
    local x, y = sa[#sa - n + i] or 1, sb[#sb - n + i] or 1
    out[i] = x == 1 and y or x
  end
  return out
end

-- The element of a at the broadcast index idx (of a shape with #idx dims).
local function bget(a, idx)
  local sub = {}
  for d = 1, #a.shape do
    local i = idx[#idx - #a.shape + d]
    sub[d] = a.shape[d] == 1 and 0 or i
  end
  return a.data[ravel(sub, a.shape)]
end

local function ref_binary(a, b, f)
  local shape = broadcast_shape(a.shape, b.shape)
  local out = {shape = shape, data = {}}
  for k = 0, numel(shape) - 1 do
    local idx = unravel(k, shape)
    out.data[k + 1] = f(bget(a, idx), bget(b, idx))
  end
  return out
end

local function ref_map(a, f)
  local out = {shape = a.shape, data = {}}
  for i, v in ipairs(a.data) do out.data[i] = f(v) end
  return out
end

-- Reduces a over the dims in `dims` (0-based list; nil = all) with f(list of values).
local function ref_reduce(a, dims, keepdim, f)
  local rank = #a.shape
  local red = {}
  if dims == nil then for d = 0, rank - 1 do red[d] = true end
  else for _, d in ipairs(dims) do red[d < 0 and d + rank or d] = true end end
  local oshape, kshape = {}, {}
  for d = 0, rank - 1 do
    if red[d] then kshape[#kshape + 1] = 1 else kshape[#kshape + 1] = a.shape[d + 1]; oshape[#oshape + 1] = a.shape[d + 1] end
  end
  local groups = {}
  for k = 0, numel(a.shape) - 1 do
    local idx = unravel(k, a.shape)
    local key = {}
    for d = 0, rank - 1 do key[d + 1] = red[d] and 0 or idx[d + 1] end
    local g = ravel(key, kshape)
    groups[g] = groups[g] or {}
    table.insert(groups[g], a.data[k + 1])
  end
  local out = {shape = keepdim and kshape or oshape, data = {}}
  for g = 1, numel(kshape) do out.data[g] = f(groups[g]) end
  return out
end

local function rand_tensor(shape, dt, lo, hi)
  lo, hi = lo or -1, hi or 1
  return lt.tensor(T.random_list(shape, function() return lo + (hi - lo) * T.uniform() end), {dtype = dt or "f32"})
end

-- Same values, non-contiguous layout: a transposed copy transposed back.
local function noncontig(t)
  if t.ndim == 0 then return t end
  if t.ndim < 2 then return t:unsqueeze(1):expand(-1, 2):select(1, 1) end
  return t:transpose(0, -1):contiguous():transpose(0, -1)
end

local TOL = {f32 = {rtol = 1e-5, atol = 1e-6}, f64 = {rtol = 1e-12, atol = 1e-14}, bf16 = {rtol = 2e-2, atol = 1e-2},
             f16 = {rtol = 2e-3, atol = 1e-3}}

-- ---- unary ----------------------------------------------------------------------------------

local sqrt2pi = math.sqrt(2 / math.pi)
-- erf by its Maclaurin series, 2/sqrt(pi) sum (-1)^n x^(2n+1) / (n! (2n+1)): on [-2, 2] the
-- largest term is ~3, so double keeps ~15 digits.
local function erf_series(x)
  local sum, term, n = 0, x, 0 -- term = (-1)^n x^(2n+1) / n!
  while math.abs(term) > 1e-300 and n < 200 do
    sum = sum + term / (2 * n + 1)
    n = n + 1
    term = -term * x * x / n
  end
  return 2 / math.sqrt(math.pi) * sum
end
local UNARY = {
  neg = {function(x) return -x end},
  exp = {math.exp, -3, 3},
  log = {math.log, 0.1, 4},
  sqrt = {math.sqrt, 0, 4},
  rsqrt = {function(x) return 1 / math.sqrt(x) end, 0.1, 4},
  tanh = {function(x) return (math.exp(2 * x) - 1) / (math.exp(2 * x) + 1) end, -3, 3},
  sigmoid = {function(x) return 1 / (1 + math.exp(-x)) end, -5, 5},
  relu = {function(x) return x > 0 and x or 0 end},
  gelu = {function(x) local u = sqrt2pi * (x + 0.044715 * x ^ 3) return 0.5 * x * (1 + (math.exp(2 * u) - 1) / (math.exp(2 * u) + 1)) end, -3, 3},
  silu = {function(x) return x / (1 + math.exp(-x)) end, -5, 5},
  abs = {math.abs},
  sin = {math.sin, -3, 3},
  cos = {math.cos, -3, 3},
  square = {function(x) return x * x end},
  reciprocal = {function(x) return 1 / x end, 0.5, 3},
  erf = {erf_series},
  gelu_erf = {function(x) return 0.5 * x * (1 + erf_series(x / math.sqrt(2))) end},
}

test("unary ops against references, every float dtype, non-contiguous, out and in-place", function()
  for name, spec in pairs(UNARY) do
    local f, lo, hi = spec[1], spec[2] or -2, spec[3] or 2
    for _, dt in ipairs {"f32", "f64", "bf16", "f16"} do
      local x = rand_tensor({3, 5}, dt, lo, hi)
      local want = nested(ref_map(nd(x), f))
      local what = name .. " " .. dt
      local tol = {rtol = TOL[dt].rtol, atol = TOL[dt].atol, msg = what}
      close(x[name](x), want, tol)
      close(lt[name](noncontig(x)), want, tol)
      local out = lt.empty(3, 5, dt)
      equal(rawequal(x[name](x, out), out), true)
      close(out, want, tol)
      local y = x:clone()
      y[name .. "_"](y)
      close(y, want, tol)
    end
  end
  close(-lt.tensor({1, -2}), {-1, 2})
  -- integer neg/abs/relu/square
  equal(lt.tensor({-3, 4}, {dtype = "i32"}):abs():tolist(), {3, 4})
  equal(lt.tensor({-3, 4}, {dtype = "i64"}):neg():tolist(), {3, -4})
  equal(lt.tensor({-3, 4}, {dtype = "i32"}):relu():tolist(), {0, 4})
  equal(lt.tensor({-3, 4}, {dtype = "i32"}):square():tolist(), {9, 16})
end)

-- ---- binary ------------------------------------------------------------------------------------

local BINARY = {
  add = function(a, b) return a + b end,
  sub = function(a, b) return a - b end,
  mul = function(a, b) return a * b end,
  div = function(a, b) return a / b end,
  pow = function(a, b) return a ^ b end,
  maximum = math.max,
  minimum = math.min,
}
local COMPARE = {
  eq = function(a, b) return a == b end, ne = function(a, b) return a ~= b end,
  lt = function(a, b) return a < b end, le = function(a, b) return a <= b end,
  gt = function(a, b) return a > b end, ge = function(a, b) return a >= b end,
}
local SHAPES = {{{3, 4}, {3, 4}}, {{3, 1, 4}, {2, 4}}, {{4}, {2, 3, 4}}, {{2, 1}, {1, 3}}, {{}, {2, 2}}}

test("binary ops with broadcasting against references", function()
  for name, f in pairs(BINARY) do
    for _, dt in ipairs {"f32", "f64", "bf16"} do
      for _, shapes in ipairs(SHAPES) do
        local a = rand_tensor(shapes[1], dt, 0.5, 2)
        local b = rand_tensor(shapes[2], dt, 0.5, 2)
        local want = nested(ref_binary(nd(a), nd(b), f))
        local tol = {rtol = TOL[dt].rtol * 4, atol = TOL[dt].atol, msg = name .. " " .. dt .. " " .. T.show(shapes)}
        close(a[name](a, b), want, tol)
        close(lt[name](noncontig(a), noncontig(b)), want, tol)
      end
    end
  end
end)

test("operators and scalars on either side", function()
  local a = rand_tensor({2, 3}, "f64", 0.5, 2)
  local A = nd(a)
  local tol = TOL.f64
  close(a + 2, nested(ref_map(A, function(x) return x + 2 end)), tol)
  close(2 + a, nested(ref_map(A, function(x) return 2 + x end)), tol)
  close(a - 2, nested(ref_map(A, function(x) return x - 2 end)), tol)
  close(2 - a, nested(ref_map(A, function(x) return 2 - x end)), tol)
  close(a * 3, nested(ref_map(A, function(x) return x * 3 end)), tol)
  close(3 * a, nested(ref_map(A, function(x) return 3 * x end)), tol)
  close(a / 4, nested(ref_map(A, function(x) return x / 4 end)), tol)
  close(4 / a, nested(ref_map(A, function(x) return 4 / x end)), tol)
  close(a ^ 2, nested(ref_map(A, function(x) return x ^ 2 end)), tol)
  close(2 ^ a, nested(ref_map(A, function(x) return 2 ^ x end)), tol)
  close(-a, nested(ref_map(A, function(x) return -x end)), tol)
  close(a + a * a - a / 2, nested(ref_map(A, function(x) return x + x * x - x / 2 end)), tol)
  close(a:maximum(1), nested(ref_map(A, function(x) return math.max(x, 1) end)), tol)
  close(a:sub(1, lt.empty(2, 3, "f64")), nested(ref_map(A, function(x) return x - 1 end)), tol)
  -- in place
  local b = a:clone()
  b:add_(1):mul_(2)
  close(b, nested(ref_map(A, function(x) return (x + 1) * 2 end)), tol)
  b:sub_(a)
  close(b, nested(ref_map(A, function(x) return (x + 1) * 2 - x end)), tol)
  -- into a non-contiguous out
  local big = lt.zeros(3, 2, "f64")
  a:mul(10, big:t())
  close(big:t(), nested(ref_map(A, function(x) return x * 10 end)), tol)
  -- booleans and int64 cdata as scalars
  equal((lt.tensor({1, 2}) + true):tolist(), {2, 3})
  equal((lt.tensor({1, 2}) * 3LL):tolist(), {3, 6})
  -- integer tensors
  equal((lt.tensor({1, 2}, {dtype = "i32"}) + lt.tensor({10, 20}, {dtype = "i32"})):tolist(), {11, 22})
  equal((lt.tensor({7, -7}, {dtype = "i64"}) * 3):tolist(), {21, -21})
end)

test("comparisons give bool tensors", function()
  for name, f in pairs(COMPARE) do
    local a = lt.tensor({{1, 2, 3}, {3, 2, 1}})
    local b = lt.tensor({2, 2, 2})
    local r = a[name](a, b)
    equal(r.dtype, "bool")
    equal(r:tolist(), nested(ref_binary(nd(a), nd(b), f)), name)
    equal(a[name](a, 2):tolist(), nested(ref_map(nd(a), function(x) return f(x, 2) end)), name .. " scalar")
  end
  equal(lt.tensor({1, 5}):gt(lt.tensor({3, 3})):tolist(), {false, true})
end)

test("where and clamp", function()
  local c = lt.tensor({true, false, true})
  local a, b = lt.tensor({1, 2, 3}), lt.tensor({-1, -2, -3})
  equal(lt.where(c, a, b):tolist(), {1, -2, 3})
  equal(lt.where(c, a, 0):tolist(), {1, 0, 3})
  equal(lt.where(c, 7, b):tolist(), {7, -2, 7})
  equal(lt.where(c, 1, 0):tolist(), {1, 0, 1})
  equal(a:where(c, b):tolist(), {1, -2, 3})
  -- broadcasting cond (2, 1) against (3)
  equal(lt.where(lt.tensor({{true}, {false}}), a, b):tolist(), {{1, 2, 3}, {-1, -2, -3}})
  local x = lt.tensor({-2, -0.5, 0.5, 2})
  equal(x:clamp(-1, 1):tolist(), {-1, -0.5, 0.5, 1})
  equal(x:clamp(0):tolist(), {0, 0, 0.5, 2})
  equal(x:clamp(nil, 0):tolist(), {-2, -0.5, 0, 0})
  x:clamp_(-1, 1)
  equal(x:tolist(), {-1, -0.5, 0.5, 1})
end)

-- ---- reductions -----------------------------------------------------------------------------------

local function sum(l) local s = 0 for _, v in ipairs(l) do s = s + v end return s end
local REDUCE = {
  sum = sum,
  mean = function(l) return sum(l) / #l end,
  max = function(l) return math.max(unpack(l)) end,
  min = function(l) return math.min(unpack(l)) end,
  prod = function(l) local p = 1 for _, v in ipairs(l) do p = p * v end return p end,
  norm = function(l) local s = 0 for _, v in ipairs(l) do s = s + v * v end return math.sqrt(s) end,
  var = function(l) local m = sum(l) / #l local s = 0 for _, v in ipairs(l) do s = s + (v - m) ^ 2 end return s / (#l - 1) end,
}
local DIMS = {false, {0}, {1}, {-1}, {0, 2}, {2, 0, 1}}

test("reductions over all, one and several dims, keepdim, non-contiguous", function()
  for name, f in pairs(REDUCE) do
    for _, dt in ipairs {"f32", "f64"} do
      local x = rand_tensor({3, 4, 5}, dt, 0.5, 1.5)
      local X = nd(x)
      for _, dims in ipairs(DIMS) do
        for _, keepdim in ipairs {false, true} do
          local arg = dims and (#dims == 1 and dims[1] or dims) or nil
          local want = ref_reduce(X, dims or nil, keepdim, f)
          local what = string.format("%s %s dims %s keepdim %s", name, dt, T.show(dims), tostring(keepdim))
          local tol = {rtol = dt == "f32" and 1e-4 or 1e-10, atol = 1e-6, msg = what}
          local got = x[name](x, arg, keepdim)
          equal(got.shape, want.shape, what)
          close(got, nested(want), tol)
          close(noncontig(x)[name](noncontig(x), arg, keepdim), nested(want), tol)
        end
      end
    end
  end
  -- integer sums stay exact
  equal(lt.arange(10):sum():item(), 45)
  -- std is the square root of var
  local x = rand_tensor({10}, "f64")
  close(x:std(), math.sqrt(x:var():item()), TOL.f64)
  close(x:var(0, false, 0), REDUCE.var(nd(x).data) * 9 / 10, TOL.f64)
end)

test("max/min with a dim return values and indices; argmax/argmin", function()
  local x = lt.tensor({{1, 9, 3}, {7, 2, 8}})
  local v, i = x:max(1)
  equal(v:tolist(), {9, 8})
  equal(i:tolist(), {1, 2})
  equal(i.dtype, "i64")
  v, i = x:min(0, true)
  equal(v:tolist(), {{1, 2, 3}})
  equal(i:tolist(), {{0, 1, 0}})
  equal(x:max():item(), 9)
  equal(x:argmax():item(), 1)
  equal(x:argmin():item(), 0)
  equal(x:argmax(0):tolist(), {1, 0, 1})
  equal(x:argmin(-1):tolist(), {0, 1})
  equal(x:argmax(1, true).shape, {2, 1})
  equal(x:max(lt.tensor({5, 5, 5})):tolist(), {{5, 9, 5}, {7, 5, 8}})
end)

-- ---- matmul and softmax ----------------------------------------------------------------------

local function ref_matmul(a, b) -- a (..., M, K), b (..., K, N), batch dims broadcast
  local ra, rb = #a.shape, #b.shape
  local M, K, N = a.shape[ra - 1], a.shape[ra], b.shape[rb]
  local batch = broadcast_shape({unpack(a.shape, 1, ra - 2)}, {unpack(b.shape, 1, rb - 2)})
  local shape = {unpack(batch)}
  shape[#shape + 1], shape[#shape + 2] = M, N
  local out = {shape = shape, data = {}}
  for k = 0, numel(shape) - 1 do
    local idx = unravel(k, shape)
    local s = 0
    for kk = 0, K - 1 do
      local ia, ib = {unpack(idx)}, {unpack(idx)}
      ia[#ia] = kk
      ib[#ib - 1] = kk
      s = s + bget(a, ia) * bget(b, ib)
    end
    out.data[k + 1] = s
  end
  return out
end

test("matmul: 2-d, batched with broadcasting, transposed inputs, out", function()
  local cases = {{{3, 4}, {4, 2}}, {{2, 3, 4}, {2, 4, 5}}, {{2, 1, 3, 4}, {5, 4, 2}}, {{3, 4}, {2, 4, 3}}, {{1, 1}, {1, 1}}}
  for _, dt in ipairs {"f32", "f64", "bf16"} do
    for _, c in ipairs(cases) do
      local a, b = rand_tensor(c[1], dt), rand_tensor(c[2], dt)
      local want = ref_matmul(nd(a), nd(b))
      local tol = {rtol = dt == "bf16" and 3e-2 or (dt == "f32" and 1e-5 or 1e-12), atol = dt == "bf16" and 3e-2 or 1e-6,
                   msg = "matmul " .. dt .. " " .. T.show(c)}
      local got = a:matmul(b)
      equal(got.shape, want.shape, tol.msg)
      close(got, nested(want), tol)
      close(lt.matmul(noncontig(a), noncontig(b)), nested(want), tol)
    end
  end
  local a, b = rand_tensor({4, 3}, "f64"), rand_tensor({2, 4}, "f64")
  close(a:t():matmul(b:t()), nested(ref_matmul(nd(a:t():contiguous()), nd(b:t():contiguous()))), TOL.f64)
  local out = lt.empty(3, 2, "f64")
  equal(rawequal(lt.matmul(a:t(), b:t(), out), out), true)
  -- gemm: alpha, beta and transposes
  local acc = lt.ones(3, 2, "f64")
  lt.gemm(a, b, {trans_a = true, trans_b = true, alpha = 2, beta = 1, out = acc})
  close(acc, nested(ref_map(ref_matmul(nd(a:t():contiguous()), nd(b:t():contiguous())), function(v) return 2 * v + 1 end)), TOL.f64)
  fails("matmul", function() return a:matmul(a) end)
end)

test("softmax and log_softmax over any dim", function()
  for _, dt in ipairs {"f32", "f64"} do
    local x = rand_tensor({3, 4, 5}, dt, -3, 3)
    local X = nd(x)
    for _, dim in ipairs {0, 1, 2, -1} do
      local d = dim < 0 and dim + 3 or dim
      -- reference: exp(x - max) / sum over the dim
      local m = ref_reduce(X, {d}, true, REDUCE.max)
      local e = ref_binary(X, m, function(v, mx) return math.exp(v - mx) end)
      local s = ref_reduce(e, {d}, true, sum)
      local sm = ref_binary(e, s, function(v, tot) return v / tot end)
      local tol = {rtol = dt == "f32" and 1e-5 or 1e-12, atol = 1e-7, msg = "softmax " .. dt .. " dim " .. dim}
      close(x:softmax(dim), nested(sm), tol)
      close(noncontig(x):softmax(dim), nested(sm), tol)
      close(x:log_softmax(dim), nested(ref_map(sm, math.log)), tol)
    end
  end
  close(lt.tensor({1, 1}):softmax(), {0.5, 0.5})
end)
