-- The tensor type: creation, properties, views (against references computed on the
-- tolist() values in Lua), conversions, copies, cat/stack, the random generator.
local lt = require "lutra"
local T = require "lutra.testing"
local close, equal, fails = T.assert_close, T.assert_equal, T.assert_error

local DTYPES = {"f32", "f64", "bf16", "f16", "i32", "i64", "u8", "bool"}

-- Element at a 0-based index list in nested lists.
local function at(list, idx)
  for _, i in ipairs(idx) do list = list[i + 1] end
  return list
end

-- Every 0-based index of a shape, in row-major order.
local function indices(shape)
  local all, idx = {}, {}
  local function rec(d)
    if d > #shape then
      all[#all + 1] = {unpack(idx)}
      return
    end
    for i = 0, shape[d] - 1 do
      idx[d] = i
      rec(d + 1)
    end
  end
  rec(1)
  return all
end

-- A reference tensor as nested lists: ref[i][j]... = f(i, j, ...) (0-based).
local function build(shape, f)
  local t = {}
  for _, idx in ipairs(indices(shape)) do
    local l = t
    for d = 1, #idx - 1 do
      l[idx[d] + 1] = l[idx[d] + 1] or {}
      l = l[idx[d] + 1]
    end
    l[idx[#idx] + 1] = f(unpack(idx))
  end
  return t
end

test("creation and properties", function()
  local t = lt.zeros(2, 3)
  equal(t.shape, {2, 3})
  equal(t:size(), {2, 3})
  equal(t:size(1), 3)
  equal(t:size(-2), 2)
  equal(t:dim(), 2)
  equal(t.ndim, 2)
  equal(t:numel(), 6)
  equal(t.dtype, "f32")
  equal(t.device, "cpu")
  equal(t:is_contiguous(), true)
  equal(t:stride(), {3, 1})
  equal(#t, 2)
  close(t, {{0, 0, 0}, {0, 0, 0}})
  close(lt.ones{2, 2}, {{1, 1}, {1, 1}})
  close(lt.full({3}, 2.5), {2.5, 2.5, 2.5})
  close(lt.full({2}, 7, {dtype = "i32"}), {7, 7})
  fails("full: the shape must be a list", function() lt.full(2, 7) end)
  equal(lt.full({2}, true).dtype, "bool")
  equal(lt.empty(4, 5, "f64").shape, {4, 5})
  equal(lt.empty(4, 5, "f64").dtype, "f64")
  equal(lt.zeros(3, {dtype = "bf16"}).dtype, "bf16")
  equal(lt.zeros({}).shape, {})
  equal(lt.zeros({}):numel(), 1)
  local x = lt.ones(2, 3, "i64")
  equal(lt.zeros_like(x).dtype, "i64")
  close(lt.ones_like(x), {{1, 1, 1}, {1, 1, 1}})
  equal(lt.empty_like(x, {dtype = "f16"}).dtype, "f16")
  close(lt.full_like(x, 4), {{4, 4, 4}, {4, 4, 4}})
  equal(lt.float32, "f32")
  equal(lt.long, "i64")
end)

test("tensor() from Lua values, tolist() and item() for every dtype", function()
  local values = {{0, 1, 2}, {3, 100, 5}}
  for _, dt in ipairs(DTYPES) do
    local t = lt.tensor(values, {dtype = dt})
    equal(t.dtype, dt)
    equal(t.shape, {2, 3})
    local want = dt == "bool" and T.map(function(v) return v ~= 0 end, values) or values
    equal(t:tolist(), want)
    equal(t[{1, 1}]:item(), dt == "bool" and true or 100)
  end
  equal(lt.tensor(3.5):item(), 3.5)
  equal(lt.tensor(3.5).shape, {})
  equal(lt.tensor(3.5):tolist(), 3.5)
  equal(lt.tensor({true, false}).dtype, "bool")
  equal(lt.tensor({true, false}):tolist(), {true, false})
  equal(lt.tensor({}).shape, {0})
  equal(lt.tensor({1.5, -2}).dtype, "f32")
  local big = lt.tensor({2 ^ 40 + 1}, {dtype = "i64"})
  equal(big:item(), 2 ^ 40 + 1)
  -- from a tensor: a copy
  local a = lt.tensor({1, 2})
  local b = lt.tensor(a, {dtype = "f64"})
  a[0] = 9
  equal(b:tolist(), {1, 2})
  equal(b.dtype, "f64")
end)

test("dtype conversion round trips", function()
  local ints = {0, 1, 2, 3, 100, 5, 0, 7}
  local function convert(v, dt)
    if dt == "bool" then return v ~= 0 and 1 or 0 end
    return v
  end
  for _, src in ipairs(DTYPES) do
    for _, dst in ipairs(DTYPES) do
      local t = lt.tensor(ints, {dtype = src})
      local there = t:to(dst)
      equal(there.dtype, dst)
      local back = there:to(src)
      equal(back.dtype, src)
      local want = {}
      for i, v in ipairs(ints) do want[i] = convert(convert(convert(v, src), dst), src) end
      if src == "bool" then want = T.map(function(v) return v ~= 0 end, want) end
      equal(back:tolist(), want, src .. " -> " .. dst .. " -> " .. src)
    end
  end
  -- floats: f32 <-> f64 exact; 16-bit formats round to their precision
  local vals = T.random_list({50})
  local x = lt.tensor(vals, {dtype = "f64"})
  close(x:float():double(), T.map(T.f32, vals), {rtol = 0, atol = 0})
  close(x:bf16():float(), vals, {rtol = 2 ^ -8, atol = 1e-30})
  close(x:half():float(), vals, {rtol = 2 ^ -11, atol = 6e-8})
  equal(x:long().dtype, "i64")
  equal(x:int().dtype, "i32")
  equal(x:byte().dtype, "u8")
  equal(x:bool().dtype, "bool")
  -- float -> int truncates toward zero
  equal(lt.tensor({-2.7, 2.7, 0.5}):to("i32"):tolist(), {-2, 2, 0})
  -- to() with nothing to change returns the tensor itself
  equal(rawequal(x:to("f64"), x), true)
  equal(rawequal(x:to{dtype = "f64", device = "cpu"}, x), true)
  equal(x:to(lt.zeros(1, "bf16")).dtype, "bf16")
  equal(x:cpu() == x, true)
  equal(x:type_as(lt.zeros(1, "i32")).dtype, "i32")
end)

test("views against references", function()
  local base = T.random_list({4, 5, 6})
  local x = lt.tensor(base)
  local function same(view, want_shape, f)
    equal(view.shape, want_shape)
    close(view, build(want_shape, f), {rtol = 0, atol = 0})
  end
  same(x:transpose(0, 2), {6, 5, 4}, function(i, j, k) return T.f32(at(base, {k, j, i})) end)
  same(x:permute(2, 0, 1), {6, 4, 5}, function(i, j, k) return T.f32(at(base, {j, k, i})) end)
  same(x:permute{1, 2, 0}, {5, 6, 4}, function(i, j, k) return T.f32(at(base, {k, i, j})) end)
  same(x:narrow(1, 1, 3), {4, 3, 6}, function(i, j, k) return T.f32(at(base, {i, j + 1, k})) end)
  same(x:slice(2, 1, 6, 2), {4, 5, 3}, function(i, j, k) return T.f32(at(base, {i, j, 1 + 2 * k})) end)
  same(x:slice(0, -2), {2, 5, 6}, function(i, j, k) return T.f32(at(base, {i + 2, j, k})) end)
  same(x:select(1, -1), {4, 6}, function(i, k) return T.f32(at(base, {i, 4, k})) end)
  same(x:view(20, 6), {20, 6}, function(i, k) return T.f32(at(base, {math.floor(i / 5), i % 5, k})) end)
  same(x:view(-1), {120}, function(i) return T.f32(at(base, {math.floor(i / 30), math.floor(i / 6) % 5, i % 6})) end)
  same(x:reshape{4, -1}, {4, 30}, function(i, r) return T.f32(at(base, {i, math.floor(r / 6), r % 6})) end)
  same(x:flatten(1), {4, 30}, function(i, r) return T.f32(at(base, {i, math.floor(r / 6), r % 6})) end)
  same(x:flatten(), {120}, function(i) return T.f32(at(base, {math.floor(i / 30), math.floor(i / 6) % 5, i % 6})) end)
  same(x:unsqueeze(1), {4, 1, 5, 6}, function(i, _, j, k) return T.f32(at(base, {i, j, k})) end)
  same(x:unsqueeze(-1), {4, 5, 6, 1}, function(i, j, k) return T.f32(at(base, {i, j, k})) end)
  same(x:unsqueeze(0):squeeze(0), {4, 5, 6}, function(i, j, k) return T.f32(at(base, {i, j, k})) end)
  same(x:narrow(0, 0, 1):squeeze(), {5, 6}, function(j, k) return T.f32(at(base, {0, j, k})) end)
  local row = x[{0, 0}]:unsqueeze(0) -- (1, 6)
  same(row:expand(3, 6), {3, 6}, function(_, k) return T.f32(at(base, {0, 0, k})) end)
  same(row:expand(2, -1, -1), {2, 1, 6}, function(_, _, k) return T.f32(at(base, {0, 0, k})) end)
  same(row:expand_as(lt.zeros(5, 6)), {5, 6}, function(_, k) return T.f32(at(base, {0, 0, k})) end)
  local m = x[0]
  same(m:t(), {6, 5}, function(i, j) return T.f32(at(base, {0, j, i})) end)
  same(m.T, {6, 5}, function(i, j) return T.f32(at(base, {0, j, i})) end)
  equal(lt.ones(3):t().shape, {3})
  -- views share storage: writes show through
  local v = x:transpose(0, 1)
  v[{2, 3, 4}] = 42
  equal(x[{3, 2, 4}]:item(), 42)
  -- non-contiguous views: contiguous() copies, reshape copies, view refuses
  local nc = x:transpose(1, 2)
  equal(nc:is_contiguous(), false)
  equal(nc:stride(), {30, 1, 6})
  local c = nc:contiguous()
  equal(c:is_contiguous(), true)
  close(c, nc, {rtol = 0, atol = 0})
  equal(rawequal(c:contiguous(), c), true)
  close(nc:reshape(4, 30), c:view(4, 30), {rtol = 0, atol = 0})
  -- view_as / reshape_as
  equal(x:view_as(lt.zeros(2, 60)).shape, {2, 60})
  equal(nc:reshape_as(lt.zeros(120)).shape, {120})
end)

test("clone, copy_, fill_, zero_", function()
  local a = lt.tensor({{1, 2}, {3, 4}})
  local b = a:clone()
  b[0] = 7
  equal(a:tolist(), {{1, 2}, {3, 4}})
  equal(b:tolist(), {{7, 7}, {3, 4}})
  local nc = lt.tensor({{1, 2, 3}, {4, 5, 6}}):t()
  local cl = nc:clone()
  equal(cl:is_contiguous(), true)
  equal(cl:tolist(), {{1, 4}, {2, 5}, {3, 6}})
  -- copy_ broadcasts and converts
  local dst = lt.zeros(3, 2, "f64")
  dst:copy_(lt.tensor({10, 20}, {dtype = "i32"}))
  equal(dst:tolist(), {{10, 20}, {10, 20}, {10, 20}})
  -- into a non-contiguous view
  local big = lt.zeros(2, 3)
  big:t():copy_(lt.tensor({{1, 2}, {3, 4}, {5, 6}}))
  equal(big:tolist(), {{1, 3, 5}, {2, 4, 6}})
  equal(big:fill_(2.5):tolist(), {{2.5, 2.5, 2.5}, {2.5, 2.5, 2.5}})
  big:select(1, 1):fill_(-1)
  equal(big:tolist(), {{2.5, -1, 2.5}, {2.5, -1, 2.5}})
  equal(big:zero_():tolist(), {{0, 0, 0}, {0, 0, 0}})
  equal(lt.zeros(2, "bool"):fill_(true):tolist(), {true, true})
  fails("copy_: expected a tensor", function() big:copy_("x") end)
end)

test("ranges", function()
  equal(lt.arange(5):tolist(), {0, 1, 2, 3, 4})
  equal(lt.arange(5).dtype, "i64")
  equal(lt.arange(2, 8, 3):tolist(), {2, 5})
  equal(lt.arange(5, 0, -2):tolist(), {5, 3, 1})
  equal(lt.arange(0, 1, 0.25).dtype, "f32")
  close(lt.arange(0, 1, 0.25), {0, 0.25, 0.5, 0.75})
  equal(lt.arange(3, {dtype = "f64"}).dtype, "f64")
  close(lt.linspace(0, 1, 5), {0, 0.25, 0.5, 0.75, 1})
  equal(lt.linspace(0, 1, 5, "f64").dtype, "f64")
end)

test("cat and stack", function()
  local a, b = lt.tensor({{1, 2}, {3, 4}}), lt.tensor({{5, 6}})
  equal(lt.cat({a, b}):tolist(), {{1, 2}, {3, 4}, {5, 6}})
  equal(lt.cat({a, a:t()}, 1):tolist(), {{1, 2, 1, 3}, {3, 4, 2, 4}})
  equal(lt.cat({a, a}, -1).shape, {2, 4})
  equal(lt.stack({a, a}).shape, {2, 2, 2})
  equal(lt.stack({a, a * 2}, 1):tolist(), {{{1, 2}, {2, 4}}, {{3, 4}, {6, 8}}})
  equal(lt.stack({a, a}, -1):tolist(), {{{1, 1}, {2, 2}}, {{3, 3}, {4, 4}}})
  fails("cat: tensor 2", function() lt.cat({a, lt.ones(2, 3, "f64")}) end)
  fails("stack: tensor 2 has shape", function() lt.stack({a, b}) end)
end)

test("random numbers: seeds, offsets, state", function()
  lt.manual_seed(5)
  local a = lt.rand(10)
  equal(lt.get_rng_state(), {seed = 5, offset = 10})
  lt.manual_seed(5)
  local b = lt.rand(13)
  close(a, b[{{0, 10}}], {rtol = 0, atol = 0})
  -- a draw at offset 10 continues the stream: element i uses counter offset + i
  lt.set_rng_state({seed = 5, offset = 10})
  close(lt.rand(3), b[{{10, 13}}], {rtol = 0, atol = 0})
  equal(lt.get_rng_state().offset, 13)
  for _, v in ipairs(b:tolist()) do assert(v >= 0 and v < 1, "rand out of [0, 1)") end
  -- randn: mean ~ 0, variance ~ 1 over 20000 draws (5 sigma bounds)
  local n = lt.randn(20000):double():tolist()
  local s, s2 = 0, 0
  for _, v in ipairs(n) do s, s2 = s + v, s2 + v * v end
  local mean, var = s / #n, s2 / #n - (s / #n) ^ 2
  assert(math.abs(mean) < 5 / math.sqrt(#n), "randn mean " .. mean)
  assert(math.abs(var - 1) < 5 * math.sqrt(2 / #n), "randn variance " .. var)
  -- randint: [lo, hi), i64 by default
  local r = lt.randint(3, 7, {1000})
  equal(r.dtype, "i64")
  local seen = {}
  for _, v in ipairs(r:tolist()) do
    assert(v >= 3 and v < 7 and v == math.floor(v), "randint value " .. v)
    seen[v] = true
  end
  equal(seen, {[3] = true, [4] = true, [5] = true, [6] = true})
  equal(lt.randint(5, {2, 2}).shape, {2, 2})
  equal(lt.randint(5, {2}, {dtype = "i32"}).dtype, "i32")
  equal(lt.rand(2, 3, {dtype = "f64"}).dtype, "f64")
  equal(lt.randn_like(lt.zeros(2, 2, "f64")).dtype, "f64")
  equal(lt.rand_like(lt.zeros(4)).shape, {4})
  -- in-place fills
  local u = lt.empty(1000):uniform_(-2, -1)
  for _, v in ipairs(u:tolist()) do assert(v >= -2 and v < -1, "uniform_ value " .. v) end
  local bern = lt.empty(1000):bernoulli_(0.25):tolist()
  local ones = 0
  for _, v in ipairs(bern) do ones = ones + v end
  assert(ones > 150 and ones < 350, "bernoulli_(0.25) gave " .. ones .. " ones of 1000")
end)

test("data_ptr reads the same memory", function()
  local t = lt.tensor({1.5, 2.5, 3.5})
  local p = lt.ffi.cast("float *", t:data_ptr())
  equal(p[2], 3.5)
  p[0] = 9
  equal(t[0]:item(), 9)
  equal(t[{{1}}]:data_ptr() ~= t:data_ptr(), true)
end)

test("equality compares identity, eq compares elements", function()
  local a = lt.tensor({1, 2})
  local b = lt.tensor({1, 2})
  equal(a == a, true)
  equal(a == b, false)
  equal(a:eq(b):tolist(), {true, true})
end)
