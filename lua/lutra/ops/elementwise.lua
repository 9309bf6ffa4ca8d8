-- lutra.ops.elementwise — binary ops (tensor or number on either side, broadcasting),
-- comparisons, unary ops, clamp and where, each one C call (see lutra/ops/init.lua).
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local dtype = require "lutra.dtype"
local S = require "lutra.autograd.state"
local W = require "lutra.ops.write"
local ffi, C = lt.ffi, lt.C

local M = {}

local records = require("lutra.autograd.op").records
local fields = require "lutra.tensor.fields"
local is_tracked = fields.is_tracked
local bump, clear = S.bump, S.clear
local before_write, recording, is_tensor, check_out = W.before_write, W.recording, W.is_tensor, W.check_out
local new, fail, raise = memory.new, errors.fail, errors.raise
local type, istype, tonumber = type, ffi.istype, tonumber
local Tensor = ffi.typeof("lt_tensor")
local C_binary, C_binary_scalar, C_unary = lt.fn("lt_binary"), lt.fn("lt_binary_scalar"), lt.fn("lt_unary")

-- ---- elementwise: binary -----------------------------------------------------------

local BINARY = {
  add = C.LT_ADD, sub = C.LT_SUB, mul = C.LT_MUL, div = C.LT_DIV, pow = C.LT_POW,
  maximum = C.LT_MAXIMUM, minimum = C.LT_MINIMUM,
  eq = C.LT_EQ, ne = C.LT_NE, lt = C.LT_LT, le = C.LT_LE, gt = C.LT_GT, ge = C.LT_GE,
}
M.BINARY = BINARY
local binary_names = {}
for name, op in pairs(BINARY) do binary_names[op] = name end
-- The records of each op code (comparisons: none, their bool results take no gradient).
local BINARY_RECORD, SCALAR_RECORD = {}, {}
for _, name in ipairs {"add", "sub", "mul", "div", "pow", "maximum", "minimum"} do
  BINARY_RECORD[BINARY[name]], SCALAR_RECORD[BINARY[name]] = name, name .. "_scalar"
end
-- The record functions by op code (names: op code -> record name), looked up in the
-- declarations' registry at first use; an op without a record (comparisons) clears.
local function records_by_op(names)
  return setmetatable({}, {__index = function(cache, op)
    local name = names[op]
    local rec = name and records[name] or clear
    cache[op] = rec
    return rec
  end})
end
local binary_record, scalar_record = records_by_op(BINARY_RECORD), records_by_op(SCALAR_RECORD)
local function record_binary(op, out, a, b) return binary_record[op](out, a, b) end
local function record_scalar(op, out, a, s, reverse) return scalar_record[op](out, a, s, reverse) end

-- A scalar operand as a number (booleans and int64 cdata included), or nil.
local function scalar_of(x)
  local tx = type(x)
  if tx == "number" then return x end
  if tx == "boolean" then return x and 1 or 0 end
  if tx == "cdata" and not istype(Tensor, x) then return tonumber(x) end
  return nil
end

-- The general case: scalars of any kind (booleans, int64 cdata), a given out.
local function binary_slow(a, b, op, out)
  local name = binary_names[op]
  check_out(name, out)
  local given = out
  local sa, sb = scalar_of(a), scalar_of(b)
  local t, s, reverse
  if sb ~= nil and is_tensor(a) then
    t, s, reverse = a, sb, 0
  elseif sa ~= nil and is_tensor(b) then
    t, s, reverse = b, sa, 1
  end
  if t ~= nil then
    if given ~= nil then before_write(name, given, t) end
    if out == nil then out = new() end
    if C_binary_scalar(out, t, s, op, reverse) ~= 0 then fail() end
    if given ~= nil then bump(given) end
    if S.enabled then
      if is_tracked(t) then
        S.dest = given
        record_scalar(op, out, t, s, reverse)
        S.dest = nil
      elseif given ~= nil then
        clear(out)
      end
    end
    return out
  end
  if is_tensor(a) and is_tensor(b) then
    if given ~= nil then before_write(name, given, a, b) end
    if out == nil then out = new() end
    if C_binary(out, a, b, op) ~= 0 then fail() end
    if given ~= nil then bump(given) end
    if S.enabled then
      if is_tracked(a) or is_tracked(b) then
        S.dest = given
        record_binary(op, out, a, b)
        S.dest = nil
      elseif given ~= nil then
        clear(out)
      end
    end
    return out
  end
  local bad = is_tensor(a) and b or a
  raise(string.format("%s: expected tensors or numbers, got %s", name, type(bad)))
end

-- out = a op b; a or b may be a number. Kept free of allocations but `out`; with autograd
-- one autograd-state read per tensor operand when nothing requires grad.
local AC = require "lutra.autocast"
local F32, F64 = dtype.F32, dtype.F64

-- Under autocast, a low-precision (bf16/f16) operand meeting an f32/f64 one is cast up to it
-- (torch's type promotion), through autograd: custom code mixing f32 parameters with the
-- low-precision activations of autocast ops keeps working.
local function promote(a, b)
  local da, db = fields.dtype_id(a), fields.dtype_id(b)
  if da == db then return a, b end
  local wide_a, wide_b = da == F32 or da == F64, db == F32 or db == F64
  if wide_a and not wide_b and dtype.is_float(db) then return a, b:to(dtype.name(da)) end
  if wide_b and not wide_a and dtype.is_float(da) then return a:to(dtype.name(db)), b end
  return a, b
end

local function binary(a, b, op, out)
  if out == nil then
    if type(b) == "number" then
      if type(a) == "cdata" and istype(Tensor, a) then
        out = new()
        if C_binary_scalar(out, a, b, op, 0) ~= 0 then fail() end
        if is_tracked(a) and S.enabled then record_scalar(op, out, a, b, 0) end
        return out
      end
    elseif type(a) == "number" then
      if type(b) == "cdata" and istype(Tensor, b) then
        out = new()
        if C_binary_scalar(out, b, a, op, 1) ~= 0 then fail() end
        if is_tracked(b) and S.enabled then record_scalar(op, out, b, a, 1) end
        return out
      end
    elseif type(a) == "cdata" and type(b) == "cdata" and istype(Tensor, a) and istype(Tensor, b) then
      if AC.dtype and fields.dtype_id(a) ~= fields.dtype_id(b) then a, b = promote(a, b) end
      out = new()
      if C_binary(out, a, b, op) ~= 0 then fail() end
      if (is_tracked(a) or is_tracked(b)) and S.enabled then record_binary(op, out, a, b) end
      return out
    end
  end
  return binary_slow(a, b, op, out)
end
M.binary = binary

-- t:add(b, out), sub, mul, div, pow, maximum, minimum; comparisons eq, ne, lt, le, gt, ge (bool
-- results, no gradient): elementwise, broadcasting; b a tensor of t's dtype or a number.
for name, op in pairs(BINARY) do
  M[name] = function(a, b, out) return binary(a, b, op, out) end
end
-- t:add_(b), sub_, mul_, div_, pow_, maximum_, minimum_: the same, written into t; returns t.
for _, name in ipairs {"add", "sub", "mul", "div", "pow", "maximum", "minimum"} do
  local op = BINARY[name]
  M[name .. "_"] = function(a, b) return binary(a, b, op, a) end
end

-- The metamethods: no `out`, numbers on either side. They call the ops through this table (a
-- metatype's metamethods are fixed once set; lutra.profile swaps wrappers into M).
M.metamethods = {
  __add = function(a, b) return M.add(a, b) end,
  __sub = function(a, b) return M.sub(a, b) end,
  __mul = function(a, b) return M.mul(a, b) end,
  __div = function(a, b) return M.div(a, b) end,
  __pow = function(a, b) return M.pow(a, b) end,
}

-- ---- elementwise: unary ------------------------------------------------------------

local UNARY = {
  neg = C.LT_NEG, exp = C.LT_EXP, log = C.LT_LOG, sqrt = C.LT_SQRT, rsqrt = C.LT_RSQRT, tanh = C.LT_TANH,
  sigmoid = C.LT_SIGMOID, relu = C.LT_RELU, gelu = C.LT_GELU, silu = C.LT_SILU, abs = C.LT_ABS,
  sin = C.LT_SIN, cos = C.LT_COS, square = C.LT_SQUARE, reciprocal = C.LT_RECIPROCAL, erf = C.LT_ERF,
  gelu_erf = C.LT_GELU_ERF,
}
M.UNARY = UNARY
local unary_names = {}
for name, op in pairs(UNARY) do unary_names[op] = name end

-- out = op(a), recorded for autograd. Internal callers that must not record use C directly.
local function unary(a, op, out)
  if out == nil then
    out = new()
    if C_unary(out, a, op) ~= 0 then fail() end
    if is_tracked(a) and S.enabled then records[unary_names[op]](out, a) end
    return out
  end
  local name = unary_names[op]
  before_write(name, out, a)
  if C_unary(out, a, op) ~= 0 then fail() end
  if recording(out, out, is_tracked(a)) then
    records[name](out, a)
    S.dest = nil
  end
  return out
end
M.unary = unary

-- t:exp(out), and neg, log, sqrt, rsqrt, tanh, sigmoid, relu, gelu (tanh approximation), gelu_erf
-- (exact: x * Phi(x)), silu, abs, sin, cos, square, reciprocal, erf: elementwise; t:exp_() and the others with _ write into t.
for name, op in pairs(UNARY) do
  M[name] = function(a, out)
    if not is_tensor(a) then raise(name .. ": expected a tensor, got " .. type(a)) end
    check_out(name, out)
    return unary(a, op, out)
  end
  M[name .. "_"] = function(a)
    if not is_tensor(a) then raise(name .. "_: expected a tensor, got " .. type(a)) end
    return unary(a, op, a)
  end
end
M.metamethods.__unm = function(a) return M.neg(a) end

-- grad_in = grad_out * op'(x), op named as the method ("tanh", "gelu", ...).
function M.unary_backward(grad_out, x, op, out)
  local id = UNARY[op]
  if not id then raise("unary_backward: unknown op '" .. tostring(op) .. "'") end
  check_out("unary_backward", out)
  if out == nil then out = new() end
  if C.lt_unary_backward(out, grad_out, x, id) ~= 0 then fail() end
  return out
end

-- lo or hi may be nil (no bound).
function M.clamp(a, lo, hi, out)
  check_out("clamp", out)
  if lo ~= nil and type(lo) ~= "number" then raise("clamp: lo must be a number or nil, got " .. type(lo)) end
  if hi ~= nil and type(hi) ~= "number" then raise("clamp: hi must be a number or nil, got " .. type(hi)) end
  local given = out
  if given ~= nil then before_write("clamp", given, a) end
  if out == nil then out = new() end
  if C.lt_clamp(out, a, lo or -math.huge, hi or math.huge) ~= 0 then fail() end
  if recording(given, out, is_tracked(a)) then
    records.clamp(out, a, lo, hi)
    S.dest = nil
  end
  return out
end
-- t:clamp_(lo, hi): t:clamp written into t.
function M.clamp_(a, lo, hi) return M.clamp(a, lo, hi, a) end

-- A 0-d tensor holding v, with like's dtype and device.
local function scalar_like(v, like)
  local t = new()
  if C.lt_empty(t, 0, nil, fields.dtype_id(like), fields.device_id(like)) ~= 0 then fail() end
  if C.lt_fill(t, v) ~= 0 then fail() end
  return t
end

-- out = cond ? a : b; a or b may be numbers (taking the other's dtype, or f32).
function M.where(cond, a, b, out)
  check_out("where", out)
  if not is_tensor(cond) then raise("where: cond must be a bool tensor, got " .. type(cond)) end
  local sa, sb = scalar_of(a), scalar_of(b)
  if sa and sb then
    local like = new()
    if C.lt_empty(like, 0, nil, dtype.F32, fields.device_id(cond)) ~= 0 then fail() end
    a, b = scalar_like(sa, like), scalar_like(sb, like)
  elseif sa then
    if not is_tensor(b) then raise("where: b must be a tensor or a number, got " .. type(b)) end
    a = scalar_like(sa, b)
  elseif sb then
    if not is_tensor(a) then raise("where: a must be a tensor or a number, got " .. type(a)) end
    b = scalar_like(sb, a)
  elseif not is_tensor(a) or not is_tensor(b) then
    raise("where: a and b must be tensors or numbers")
  end
  local given = out
  if given ~= nil then before_write("where", given, a, b) end
  if out == nil then out = new() end
  if C.lt_where(out, cond, a, b) ~= 0 then fail() end
  if recording(given, out, is_tracked(a) or is_tracked(b)) then
    records.where(out, cond, a, b)
    S.dest = nil
  end
  return out
end

return M
