-- lutra.ops — tensor math as methods: elementwise, comparisons, reductions, matmul,
-- softmax. Each wraps one C call; the optional last argument `out` is written in
-- place (the C convention), else a new tensor is returned.
--
-- The binary ops take a tensor or a number on either side; both tensors must have
-- the same dtype (no implicit promotion: convert with t:to(dtype) first).
--
-- The parts: lutra/ops/elementwise.lua (binary, comparisons, unary, clamp, where),
-- reduce.lua (reductions, var/std, softmax), matmul.lua (matmul, gemm); write.lua says how
-- every op writes its result and records itself for autograd.
local W = require "lutra.ops.write"

local M = {}

for _, part in ipairs {"lutra.ops.elementwise", "lutra.ops.reduce", "lutra.ops.matmul"} do
  for name, fn in pairs(require(part)) do M[name] = fn end
end
M.is_tensor, M.before_write = W.is_tensor, W.before_write

return M
