-- Indexing and slicing, 0-based with negative indices from the end, checked against
-- the same selection done on the tolist() values in Lua; assignment through views.
local lt = require "lutra"
local T = require "lutra.testing"
local close, equal, fails = T.assert_close, T.assert_equal, T.assert_error

-- Python-style range of a dim of size n: {a, b, step} with defaults and clamping.
local function range_of(r, n)
  local a, b, s = r[1] or 0, r[2] or n, r[3] or 1
  if a < 0 then a = a + n end
  if b < 0 then b = b + n end
  a, b = math.max(0, math.min(a, n)), math.max(0, math.min(b, n))
  local idx = {}
  for i = a, b - 1, s do idx[#idx + 1] = i end
  return idx
end

-- The reference of t[key] on nested lists `list` of shape `shape`.
local function ref_index(list, shape, key)
  if type(key) == "number" then key = {key} end
  local function rec(l, d, k)
    local e = key[k]
    if e == nil then return l end -- remaining dims whole
    if type(e) == "number" then
      local i = e < 0 and e + shape[d] or e
      return rec(l[i + 1], d + 1, k + 1)
    end
    local out = {}
    for _, i in ipairs(range_of(e, shape[d])) do out[#out + 1] = rec(l[i + 1], d + 1, k + 1) end
    return out
  end
  return rec(list, 1, 1)
end

local function ref_shape(shape, key)
  if type(key) == "number" then key = {key} end
  local s = {}
  for d = 1, #shape do
    local e = key[d]
    if e == nil then s[#s + 1] = shape[d]
    elseif type(e) == "table" then s[#s + 1] = #range_of(e, shape[d]) end
  end
  return s
end

local KEYS = {
  0, 2, -1, -3,
  {1}, {-1}, {0, 1}, {-2, -1, 0},
  {{}}, {{1}}, {{1, 3}}, {{0, 4, 2}}, {{-3}}, {{-3, -1}}, {{1, 100}}, {{5, 2}},
  {{}, 2}, {{}, -1, {1, 5, 3}}, {1, {0, 3, 2}}, {{1, 4, 2}, {}, {2, 6, 2}}, {{}, {}, {}}, {-1, -1, {-2}},
  {{0, 0}},
}

test("t[key] against references, contiguous and not", function()
  local shape = {4, 3, 6}
  local list = T.random_list(shape)
  local bases = {
    {lt.tensor(list), list},
    -- the same values held in a transposed layout
    {lt.tensor(list):permute(2, 0, 1):contiguous():permute(1, 2, 0), list},
  }
  for b, base in ipairs(bases) do
    local x, l = base[1], base[2]
    if b == 2 then equal(x:is_contiguous(), false) end
    for _, key in ipairs(KEYS) do
      local got = x[key]
      local what = "key " .. T.show(key) .. " on base " .. b
      equal(got.shape, ref_shape(shape, key), what)
      close(got, T.map(T.f32, ref_index(l, shape, key)), {rtol = 0, atol = 0, msg = what})
    end
  end
end)

test("indexing returns views", function()
  local x = lt.zeros(3, 4)
  local row = x[1]
  row[2] = 5
  equal(x[{1, 2}]:item(), 5)
  local cols = x[{{}, {1, 4, 2}}]
  equal(cols:is_contiguous(), false)
  cols:fill_(7)
  equal(x:tolist(), {{0, 7, 0, 7}, {0, 7, 5, 7}, {0, 7, 0, 7}})
  equal(x[-1][-1]:item(), 7)
  equal(x[0][0].shape, {})
end)

test("assignment: numbers, tensors (broadcast, converted), lists", function()
  local x = lt.zeros(3, 4)
  x[0] = 1
  x[{-1, {1, 3}}] = 2
  x[{{}, 3}] = lt.tensor({10, 20, 30}, {dtype = "i64"})
  equal(x:tolist(), {{1, 1, 1, 10}, {0, 0, 0, 20}, {0, 2, 2, 30}})
  x[{{0, 2}, {0, 2}}] = lt.tensor({{-1, -2}, {-3, -4}})
  equal(x:tolist(), {{-1, -2, 1, 10}, {-3, -4, 0, 20}, {0, 2, 2, 30}})
  x[{{}, {0, 4, 2}}] = lt.tensor({8, 9}) -- (2) broadcasts over rows
  equal(x:tolist(), {{8, -2, 9, 10}, {8, -4, 9, 20}, {8, 2, 9, 30}})
  x[1] = {5, 6, 7, 8}
  equal(x[1]:tolist(), {5, 6, 7, 8})
  x[{2, {1, 3}}] = true
  equal(x[2]:tolist(), {8, 1, 1, 30})
  -- element assignment on a vector, including negative indices and a strided vector
  local v = lt.zeros(5, "i32")
  v[0], v[-1], v[2] = 3, 4, 5.9
  equal(v:tolist(), {3, 0, 5, 0, 4})
  local sv = lt.zeros(2, 4)[{1, {0, 4, 2}}]
  sv[1] = 6
  equal(sv:tolist(), {0, 6})
  -- through a transposed base
  local y = lt.zeros(2, 3)
  local yt = y:t()
  yt[{2, 0}] = 9
  equal(y:tolist(), {{0, 0, 9}, {0, 0, 0}})
end)

test("assignment errors", function()
  local x = lt.zeros(2, 3)
  fails("does not broadcast", function() x[0] = lt.ones(2) end)
  fails("cannot assign a string", function() x[0] = "a" end)
  fails("too many indices", function() x[{0, 0, 0}] = 1 end)
  equal(x:tolist(), {{0, 0, 0}, {0, 0, 0}})
end)

test("0-d tensors and len", function()
  local s = lt.tensor(5)
  fails("cannot index a 0-d tensor", function() return s[0] end)
  equal(#lt.zeros(7, 2), 7)
  equal(s[{}]:item(), 5)
end)
