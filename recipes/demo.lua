-- recipes/demo.lua — the main job until the pretraining recipe exists: a short tour of
-- lutra's tensors. Run it with
--
--   ./build/lutra recipes/demo.lua
--
-- It makes tensors, multiplies matrices, prints them, shows the error a shape mismatch
-- gives (caught with pcall), and says which device did the work.
local lt = require "lutra"

lt.manual_seed(1234) -- the same numbers on every run (and on CPU and GPU)

-- Matmul and most ops run on the CPU so far; the GPU has copies, conversions, fill and add.
local device = "cpu"
print(string.format("lutra %s; compute device: %s (CUDA: %d devices, %s)", lt.version, device,
                    lt.cuda.device_count(), lt.cuda.status()))

-- A tensor from Lua values, and one from the random generator.
local a = lt.tensor({{1, 2, 3}, {4, 5, 6}})
local x = lt.randn(3, 4)
print("\na =")
print(a)
print("\nx = lt.randn(3, 4) =")
print(x)

-- (2, 3) @ (3, 4) -> (2, 4)
local y = a:matmul(x)
print(string.format("\ny = a:matmul(x): shape {%s}, dtype %s, device %s", table.concat(y.shape, ", "), y.dtype,
                    y.device))
print(y)

-- Indexing is 0-based, as in PyTorch: y[0] is the first row, y[{0, -1}] the last element.
print(string.format("\ny[0][1] = %.4f, y[{1, -1}] = %.4f", y[0][1]:item(), y[{1, -1}]:item()))

-- A bigger product, in bf16 storage (computed in f32), against the f32 result.
local p = lt.randn(64, 128)
local q = lt.randn(128, 32)
local exact = p:matmul(q)
local approx = p:bf16():matmul(q:bf16()):float()
print(string.format("\n(64, 128) @ (128, 32): bf16 vs f32 max abs difference %.4f (of values up to %.1f)",
                    (approx - exact):abs():max():item(), exact:abs():max():item()))

-- Errors name the op and the shapes, and point at this file's line.
local ok, err = pcall(function() return a:matmul(a) end)
print("\na:matmul(a) fails, as it should:\n  " .. tostring(err))
assert(not ok and tostring(err):find("matmul"), "the shape mismatch was not reported")

-- With a GPU, the same numbers go through it and come back unchanged.
if lt.cuda.is_available() then
  local g = x:cuda()
  local back = (g + g):cpu()
  local same = (back - (x + x)):abs():max():item() == 0
  print(string.format("\nx + x on %s matches the CPU: %s", g.device, tostring(same)))
end

print("\ndemo: done")
