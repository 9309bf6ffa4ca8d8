-- lutra.functional.linear — F.linear, y = x @ weight^T (+ bias), and its autograd declaration
-- (LinearBackward). The C side: lt_linear, lt_linear_backward_params (host/ops/linear.c).
--
--   F.linear(x, weight, bias, out)   x (..., in), weight (out, in), bias (out) or nil -> y (..., out)
--
-- Under autocast (lutra.autocast) its f32 inputs, weight and bias are cast per call, through
-- autograd, so f32 weights get f32 gradients.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local ops = require "lutra.ops"
local op = require "lutra.autograd.op"
local fields = require "lutra.tensor.fields"
local AC = require "lutra.autocast"
local U = require "lutra.functional.util"
local C = lt.C

local M = {}

local new, fail = memory.new, errors.fail
local need, tensor_or_nil, tracked, writing, edge_or_false = U.need, U.tensor_or_nil, U.tracked, U.writing,
  U.edge_or_false
local edge, attach, save = op.edge, op.attach, op.save
local gemm = ops.gemm
local low = AC.low

local record_linear -- the declaration's, below

-- For a fresh y of x (..., in), weight (out, in) and bias (out), all of one dtype and device:
-- y is made holding bias in every row, so that the gemm adds into it (beta = 1) instead of
-- a separate pass adding the bias to y.
-- Operands lt_linear takes as they are: x (..., in) with 2 <= ndim <= 16, weight (out, in),
-- bias (out) or nil, one dtype and one device.
local function linear_fusable(x, weight, bias)
  local nd = x.ndim
  if nd < 2 or nd > 16 or weight.ndim ~= 2 or fields.dims(x)[nd - 1] ~= fields.dims(weight)[1]
    or not fields.same_kind(weight, x) then
    return false
  end
  return bias == nil or (bias.ndim == 1 and fields.dims(bias)[0] == fields.dims(weight)[0] and fields.same_kind(bias, x))
end

-- x (..., in) @ weight (out, in)^T + bias (out).
function M.linear(x, weight, bias, out)
  need("linear", "x", x)
  need("linear", "weight", weight)
  tensor_or_nil("linear", "bias", bias)
  if AC.dtype and out == nil then x, weight, bias = low(x), low(weight), low(bias) end
  writing("linear", out, x, weight, bias)
  local y = out or new()
  if out == nil and linear_fusable(x, weight, bias) then
    -- one op: on CUDA one cuBLASLt GEMM with the bias in its epilogue; on the CPU the GEMM
    -- adds into the broadcast bias (beta = 1)
    if C.lt_linear(y, x, weight, bias, 0) ~= 0 then fail() end
  else
    if C.lt_matmul(y, x, weight, 0, 1, 1.0, 0.0) ~= 0 then fail() end
    if bias ~= nil and C.lt_binary(y, y, bias, ops.BINARY.add) ~= 0 then fail() end
  end
  if tracked(x, weight, bias) then record_linear(y, x, weight, bias) end
  return y
end

record_linear = op.declare {
  name = "LinearBackward", op = "linear", save = {"x", "w"},
  record = function(cls, y, x, w, bias)
    local ex, ew = edge(x), edge(w)
    local node = {ex, ew, edge_or_false(bias), cls = cls}
    if ex then save(node, "w", w) end
    if ew then save(node, "x", x) end
    attach(y, node)
  end,
  backward = function(n, g) -- g (..., out)
    local gx, gw, gb
    local out_features = g:size(-1)
    local g2 = (n[2] or n[3]) and g:reshape(-1, out_features) or nil
    if n[1] then gx = ops.matmul(g, n.w) end
    if n[2] and n[3] and fields.same_dtype(g, n.x) then
      -- dW = g^T x and db = the row sums of g in one op: one GEMM on CUDA (the bias gradient in
      -- cuBLASLt's epilogue); on the CPU the same two steps as below, bit for bit
      gw, gb = new(), new()
      if C.lt_linear_backward_params(gw, gb, g2, n.x) ~= 0 then fail() end
      return gx, gw, gb
    end
    if n[2] then
      local x = n.x
      gw = gemm(g2, x:reshape(-1, x:size(-1)), {trans_a = true})
    end
    if n[3] then gb = ops.sum(g2, 0) end
    return gx, gw, gb
  end,
  double_backward = function(n, g) -- the steps above, recorded (no fused parameter gradients)
    local gx, gw, gb
    local g2 = (n[2] or n[3]) and g:reshape(-1, g:size(-1)) or nil
    if n[1] then gx = ops.matmul(g, n.w) end
    if n[2] then gw = gemm(g2, n.x:reshape(-1, n.x:size(-1)), {trans_a = true}) end
    if n[3] then gb = ops.sum(g2, 0) end
    return gx, gw, gb
  end,
}

return M
