-- lutra.ops.matmul — matmul and the general gemm, one C call each (see lutra/ops/init.lua).
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local S = require "lutra.autograd.state"
local W = require "lutra.ops.write"
local C = lt.C

local M = {}

local records = require("lutra.autograd.op").records
local before_write, recording, check_out = W.before_write, W.recording, W.check_out
local new, fail = memory.new, errors.fail
local tensor_arg = errors.tensor_arg
local AC = require "lutra.autocast"
local fields = require "lutra.tensor.fields"
local is_tracked = fields.is_tracked

-- a (..., M, K) @ b (..., K, N) -> (..., M, N), batch dims broadcast.
function M.matmul(a, b, out)
  tensor_arg("matmul", a, "a")
  tensor_arg("matmul", b, "b")
  check_out("matmul", out)
  if AC.dtype and out == nil then a, b = AC.low(a), AC.low(b) end -- autocast: compute in bf16/f16
  local given = out
  if given ~= nil then before_write("matmul", given, a, b) end
  if out == nil then out = new() end
  if C.lt_matmul(out, a, b, 0, 0, 1.0, 0.0) ~= 0 then fail() end
  if recording(given, out, is_tracked(a) or is_tracked(b)) then
    records.gemm(out, a, b, false, false, 1.0, 0.0)
    S.dest = nil
  end
  return out
end

-- The general form: out = alpha * op(a) @ op(b) + beta * out (opts: trans_a, trans_b,
-- alpha, beta, out). With beta ~= 0 `out` must be given.
function M.gemm(a, b, opts)
  opts = opts or {}
  local out = opts.out
  tensor_arg("gemm", a, "a")
  tensor_arg("gemm", b, "b")
  check_out("gemm", out)
  local given = out
  if given ~= nil then before_write("gemm", given, a, b) end
  if out == nil then out = new() end
  local alpha, beta = opts.alpha or 1.0, opts.beta or 0.0
  local old = beta ~= 0 and given ~= nil and is_tracked(given) and given or nil -- out's old value takes part
  local rc = C.lt_matmul(out, a, b, opts.trans_a and 1 or 0, opts.trans_b and 1 or 0, alpha, beta)
  if rc ~= 0 then fail() end
  if recording(given, out, is_tracked(a) or is_tracked(b) or old ~= nil) then
    records.gemm(out, a, b, opts.trans_a and true or false, opts.trans_b and true or false, alpha, beta, old)
    S.dest = nil
  end
  return out
end

return M
