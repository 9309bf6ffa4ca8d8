-- tostring(t): the exact layout PyTorch prints, with the dtype always shown and the
-- shape added when elided.
local lt = require "lutra"
local T = require "lutra.testing"
local equal = T.assert_equal

test("floats: 4 decimals, aligned columns", function()
  equal(tostring(lt.tensor({{0.1234, -1.2}, {3, 4.5}})),
    "tensor([[ 0.1234, -1.2000],\n        [ 3.0000,  4.5000]], dtype=f32)")
  equal(tostring(lt.tensor({0.5, 12.25}, {dtype = "f64"})), "tensor([ 0.5000, 12.2500], dtype=f64)")
  equal(tostring(lt.tensor({1.5, -2.25}, {dtype = "bf16"})), "tensor([ 1.5000, -2.2500], dtype=bf16)")
end)

test("integral floats print with a trailing dot", function()
  equal(tostring(lt.tensor({1, 2, 3})), "tensor([1., 2., 3.], dtype=f32)")
  equal(tostring(lt.tensor({-1, 20})), "tensor([-1., 20.], dtype=f32)")
  equal(tostring(lt.zeros(2)), "tensor([0., 0.], dtype=f32)")
end)

test("scientific notation for wide ranges", function()
  equal(tostring(lt.tensor({1e-5, 1}, {dtype = "f64"})), "tensor([1.0000e-05, 1.0000e+00], dtype=f64)")
  equal(tostring(lt.tensor({1, 1e9}, {dtype = "f64"})), "tensor([1.0000e+00, 1.0000e+09], dtype=f64)")
  equal(tostring(lt.tensor({0.5, 2000}, {dtype = "f64"})), "tensor([5.0000e-01, 2.0000e+03], dtype=f64)")
end)

test("nan and inf", function()
  equal(tostring(lt.tensor({0 / 0, 1 / 0, -1 / 0, 1.5})), "tensor([   nan,    inf,   -inf, 1.5000], dtype=f32)")
end)

test("integers and bools", function()
  equal(tostring(lt.tensor({1, 20, -3}, {dtype = "i64"})), "tensor([ 1, 20, -3], dtype=i64)")
  equal(tostring(lt.tensor({{1, 2}, {300, 4}}, {dtype = "i32"})), "tensor([[  1,   2],\n        [300,   4]], dtype=i32)")
  equal(tostring(lt.tensor({255, 0}, {dtype = "u8"})), "tensor([255,   0], dtype=u8)")
  equal(tostring(lt.tensor({true, false})), "tensor([ true, false], dtype=bool)")
  -- i64 prints exactly beyond 2^53
  local big = lt.zeros(1, "i64")
  lt.ffi.cast("int64_t *", big:data_ptr())[0] = 9007199254740993LL
  equal(tostring(big), "tensor([9007199254740993], dtype=i64)")
end)

test("scalars and empty tensors", function()
  equal(tostring(lt.tensor(3.5)), "tensor(3.5000, dtype=f32)")
  equal(tostring(lt.tensor(7, {dtype = "i32"})), "tensor(7, dtype=i32)")
  equal(tostring(lt.tensor(true)), "tensor(true, dtype=bool)")
  equal(tostring(lt.tensor({})), "tensor([], dtype=f32)")
  equal(tostring(lt.zeros(0, 3)), "tensor([], shape=[0, 3], dtype=f32)")
end)

test("3-d layout and non-contiguous tensors", function()
  equal(tostring(lt.arange(8):view(2, 2, 2)),
    "tensor([[[0, 1],\n         [2, 3]],\n\n        [[4, 5],\n         [6, 7]]], dtype=i64)")
  equal(tostring(lt.tensor({{1, 2}, {3, 4}}):t()), "tensor([[1., 3.],\n        [2., 4.]], dtype=f32)")
end)

test("long rows wrap at 80 columns", function()
  -- 30 values of width 3 ("29."): (80 - 7) // 5 = 14 per line
  local parts = {}
  for i = 0, 29 do parts[#parts + 1] = string.format("%3s", i .. ".") end
  local lines = {}
  for i = 1, 30, 14 do lines[#lines + 1] = table.concat(parts, ", ", i, math.min(i + 13, 30)) end
  equal(tostring(lt.arange(30):float()), "tensor([" .. table.concat(lines, ",\n        ") .. "], dtype=f32)")
end)

test("elision past 1000 elements", function()
  equal(tostring(lt.arange(1000)):find("...", 1, true), nil)
  equal(tostring(lt.arange(2000)), "tensor([   0,    1,    2,  ..., 1997, 1998, 1999], shape=[2000], dtype=i64)")
  equal(tostring(lt.arange(2000):view(40, 50)), table.concat({
    "tensor([[   0,    1,    2,  ...,   47,   48,   49],",
    "        [  50,   51,   52,  ...,   97,   98,   99],",
    "        [ 100,  101,  102,  ...,  147,  148,  149],",
    "        ...,",
    "        [1850, 1851, 1852,  ..., 1897, 1898, 1899],",
    "        [1900, 1901, 1902,  ..., 1947, 1948, 1949],",
    "        [1950, 1951, 1952,  ..., 1997, 1998, 1999]], shape=[40, 50], dtype=i64)"}, "\n"))
  -- a dim of 4 is not elided, the long one is
  local head = "tensor([[   0,    1,    2,  ...,  997,  998,  999],\n        [1000, "
  equal(tostring(lt.arange(4000):view(4, 1000)):sub(1, #head), head)
  -- the formatter only reads the shown edges: values in the elided middle do not widen columns
  local x = lt.zeros(2000)
  x[1000] = 123456
  equal(tostring(x), "tensor([0., 0., 0.,  ..., 0., 0., 0.], shape=[2000], dtype=f32)")
end)

test("tostring works inside tidy and does not leak", function()
  collectgarbage()
  local before = lt.memory_stats().allocated
  local s = lt.tidy(function() return tostring(lt.arange(5000):view(50, 100)) end)
  equal(type(s), "string")
  collectgarbage()
  equal(lt.memory_stats().allocated, before)
end)
