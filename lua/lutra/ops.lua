-- lutra.ops — tensor math as methods: elementwise, comparisons, reductions, matmul,
-- softmax. Each wraps one C call; the optional last argument `out` is written in
-- place (the C convention), else a new tensor is returned.
--
-- The binary ops take a tensor or a number on either side; both tensors must have
-- the same dtype (no implicit promotion: convert with t:to(dtype) first).
--
-- Autograd: after the C call, an op whose input has autograd data (t.ag_ ~= 0) while
-- grad mode is on hands its output to a record function of lutra.autograd.state (R.*),
-- which attaches the node. Writing into a given `out` (in-place forms included) is
-- checked first (S.check_inplace), bumps out's version counter, and is recorded with
-- S.dest = out, so that an input saved from out's storage is known to be overwritten.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local shape = require "lutra.shape"
local dtype = require "lutra.dtype"
local S = require "lutra.autograd.state"
local ffi, C = lt.ffi, lt.C

local M = {}

local R = S -- record functions: R.binary[op], R.scalar[op], R.unary[op], R.<name>
local REC_BINARY, REC_SCALAR, REC_UNARY = S.binary, S.scalar, S.unary
local bump, clear = S.bump, S.clear

-- Before writing into a caller's tensor `out` (an in-place op or out=): autograd refuses
-- writes it cannot follow (S.check_inplace raises).
local function before_write(name, out, a, b)
  if S.enabled and (out.ag_ ~= 0 or (a ~= nil and a.ag_ ~= 0) or (b ~= nil and b.ag_ ~= 0)) then
    S.check_inplace(name, out, a, b)
  end
end
M.before_write = before_write

local new, fail, raise = memory.new, errors.fail, errors.raise
local tensor_arg, int_arg = errors.tensor_arg, errors.int_arg
local type, istype, tonumber = type, ffi.istype, tonumber
local Tensor = ffi.typeof("lt_tensor")
local C_binary, C_binary_scalar, C_unary = lt.fn("lt_binary"), lt.fn("lt_binary_scalar"), lt.fn("lt_unary")

local function is_tensor(x) return type(x) == "cdata" and istype(Tensor, x) end
M.is_tensor = is_tensor

local function check_out(op, out)
  if out ~= nil and not is_tensor(out) then raise(op .. ": out must be a tensor, got " .. type(out)) end
end

-- ---- elementwise: binary -----------------------------------------------------------

local BINARY = {
  add = C.LT_ADD, sub = C.LT_SUB, mul = C.LT_MUL, div = C.LT_DIV, pow = C.LT_POW,
  maximum = C.LT_MAXIMUM, minimum = C.LT_MINIMUM,
  eq = C.LT_EQ, ne = C.LT_NE, lt = C.LT_LT, le = C.LT_LE, gt = C.LT_GT, ge = C.LT_GE,
}
M.BINARY = BINARY
local binary_names = {}
for name, op in pairs(BINARY) do binary_names[op] = name end

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
      if t.ag_ ~= 0 then
        S.dest = given
        REC_SCALAR[op](out, t, s, reverse)
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
      if a.ag_ ~= 0 or b.ag_ ~= 0 then
        S.dest = given
        REC_BINARY[op](out, a, b)
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
-- one ag_ field read per tensor operand when nothing requires grad.
local AC = require "lutra.autocast"
local F32, F64 = dtype.F32, dtype.F64

-- Under autocast, a low-precision (bf16/f16) operand meeting an f32/f64 one is cast up to it
-- (torch's type promotion), through autograd: custom code mixing f32 parameters with the
-- low-precision activations of autocast ops keeps working.
local function promote(a, b)
  local da, db = a.dtype_, b.dtype_
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
        if a.ag_ ~= 0 and S.enabled then REC_SCALAR[op](out, a, b, 0) end
        return out
      end
    elseif type(a) == "number" then
      if type(b) == "cdata" and istype(Tensor, b) then
        out = new()
        if C_binary_scalar(out, b, a, op, 1) ~= 0 then fail() end
        if b.ag_ ~= 0 and S.enabled then REC_SCALAR[op](out, b, a, 1) end
        return out
      end
    elseif type(a) == "cdata" and type(b) == "cdata" and istype(Tensor, a) and istype(Tensor, b) then
      if AC.dtype and a.dtype_ ~= b.dtype_ then a, b = promote(a, b) end
      out = new()
      if C_binary(out, a, b, op) ~= 0 then fail() end
      if (a.ag_ ~= 0 or b.ag_ ~= 0) and S.enabled then REC_BINARY[op](out, a, b) end
      return out
    end
  end
  return binary_slow(a, b, op, out)
end
M.binary = binary

for name, op in pairs(BINARY) do
  M[name] = function(a, b, out) return binary(a, b, op, out) end
end
for _, name in ipairs {"add", "sub", "mul", "div", "pow", "maximum", "minimum"} do
  local op = BINARY[name]
  M[name .. "_"] = function(a, b) return binary(a, b, op, a) end
end

-- The metamethods: no `out`, numbers on either side.
local ADD, SUB, MUL, DIV, POW = BINARY.add, BINARY.sub, BINARY.mul, BINARY.div, BINARY.pow
M.metamethods = {
  __add = function(a, b) return binary(a, b, ADD) end,
  __sub = function(a, b) return binary(a, b, SUB) end,
  __mul = function(a, b) return binary(a, b, MUL) end,
  __div = function(a, b) return binary(a, b, DIV) end,
  __pow = function(a, b) return binary(a, b, POW) end,
}

-- ---- elementwise: unary ------------------------------------------------------------

local UNARY = {
  neg = C.LT_NEG, exp = C.LT_EXP, log = C.LT_LOG, sqrt = C.LT_SQRT, rsqrt = C.LT_RSQRT, tanh = C.LT_TANH,
  sigmoid = C.LT_SIGMOID, relu = C.LT_RELU, gelu = C.LT_GELU, silu = C.LT_SILU, abs = C.LT_ABS,
  sin = C.LT_SIN, cos = C.LT_COS, square = C.LT_SQUARE, reciprocal = C.LT_RECIPROCAL,
}
M.UNARY = UNARY
local unary_names = {}
for name, op in pairs(UNARY) do unary_names[op] = name end

-- out = op(a), recorded for autograd. Internal callers that must not record use C directly.
local function unary(a, op, out)
  if out == nil then
    out = new()
    if C_unary(out, a, op) ~= 0 then fail() end
    if a.ag_ ~= 0 and S.enabled then REC_UNARY[op](out, a) end
    return out
  end
  before_write(unary_names[op], out, a)
  if C_unary(out, a, op) ~= 0 then fail() end
  bump(out)
  if S.enabled then
    if a.ag_ ~= 0 then
      S.dest = out
      REC_UNARY[op](out, a)
      S.dest = nil
    else
      clear(out)
    end
  end
  return out
end
M.unary = unary

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
local NEG = UNARY.neg
M.metamethods.__unm = function(a) return unary(a, NEG) end

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
  if given ~= nil then bump(given) end
  if S.enabled then
    if a.ag_ ~= 0 then
      S.dest = given
      R.clamp(out, a, lo, hi)
      S.dest = nil
    elseif given ~= nil then
      clear(out)
    end
  end
  return out
end
function M.clamp_(a, lo, hi) return M.clamp(a, lo, hi, a) end

-- A 0-d tensor holding v, with like's dtype and device.
local function scalar_like(v, like)
  local t = new()
  if C.lt_empty(t, 0, nil, like.dtype_, like.device_) ~= 0 then fail() end
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
    if C.lt_empty(like, 0, nil, dtype.F32, cond.device_) ~= 0 then fail() end
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
  if given ~= nil then bump(given) end
  if S.enabled then
    if a.ag_ ~= 0 or b.ag_ ~= 0 then
      S.dest = given
      R.where(out, cond, a, b)
      S.dest = nil
    elseif given ~= nil then
      clear(out)
    end
  end
  return out
end

-- ---- reductions --------------------------------------------------------------------

local REDUCE = {sum = C.LT_SUM, mean = C.LT_MEAN, max = C.LT_MAX, min = C.LT_MIN, prod = C.LT_PROD, norm = C.LT_NORM}

-- dims: nil (all), a dim, or a list of dims.
local function reduce(a, op, name, dims, keepdim, out)
  check_out(name, out)
  local n, arr = shape.dims(name, dims)
  local given = out
  if given ~= nil then before_write(name, given, a) end
  if out == nil then out = new() end
  if C.lt_reduce(out, a, op, n, arr, keepdim and 1 or 0) ~= 0 then fail() end
  if given ~= nil then bump(given) end
  if S.enabled then
    if a.ag_ ~= 0 then
      S.dest = given
      R.reduce(out, a, op, dims, keepdim)
      S.dest = nil
    elseif given ~= nil then
      clear(out)
    end
  end
  return out
end
M.REDUCE = REDUCE

for _, name in ipairs {"sum", "mean", "prod", "norm"} do
  local op = REDUCE[name]
  M[name] = function(a, dims, keepdim, out) return reduce(a, op, name, dims, keepdim, out) end
end

local function arg_reduce(fn, name, a, dim, keepdim, out)
  check_out(name, out)
  if out ~= nil then
    before_write(name, out)
    bump(out)
  end
  if out == nil then out = new() end
  local all = dim == nil
  if not all and type(dim) ~= "number" then raise(name .. ": dim must be a number or nil, got " .. type(dim)) end
  if fn(out, a, dim or 0, keepdim and 1 or 0, all and 1 or 0) ~= 0 then fail() end
  return out
end
function M.argmax(a, dim, keepdim, out) return arg_reduce(C.lt_argmax, "argmax", a, dim, keepdim, out) end
function M.argmin(a, dim, keepdim, out) return arg_reduce(C.lt_argmin, "argmin", a, dim, keepdim, out) end

-- max()/min(): over all or some dims; with a single dim also the indices (as torch);
-- with a tensor, the elementwise maximum/minimum.
local function max_min(a, dims, keepdim, out, op, name, pair, arg)
  if is_tensor(dims) then return binary(a, dims, pair, keepdim) end -- t:max(other, out)
  local values = reduce(a, op, name, dims, keepdim, out)
  if type(dims) == "number" then return values, arg(a, dims, keepdim) end
  return values
end
function M.max(a, dims, keepdim, out) return max_min(a, dims, keepdim, out, REDUCE.max, "max", BINARY.maximum, M.argmax) end
function M.min(a, dims, keepdim, out) return max_min(a, dims, keepdim, out, REDUCE.min, "min", BINARY.minimum, M.argmin) end

-- correction: 1 (unbiased, default) or 0; true/false as torch's `unbiased`.
local function var_std(name, a, dims, keepdim, correction, out)
  check_out(name, out)
  if correction == nil or correction == true then correction = 1 elseif correction == false then correction = 0 end
  int_arg(name, correction, "correction")
  local n, arr = shape.dims(name, dims)
  local given = out
  if given ~= nil then before_write(name, given, a) end
  if out == nil then out = new() end
  if C.lt_var(out, a, n, arr, correction, keepdim and 1 or 0) ~= 0 then fail() end
  if name == "std" and C_unary(out, out, UNARY.sqrt) ~= 0 then fail() end
  if given ~= nil then bump(given) end
  if S.enabled then
    if a.ag_ ~= 0 then
      S.dest = given
      R.var_std(out, a, name, dims, keepdim, correction)
      S.dest = nil
    elseif given ~= nil then
      clear(out)
    end
  end
  return out
end

function M.var(a, dims, keepdim, correction, out) return var_std("var", a, dims, keepdim, correction, out) end
function M.std(a, dims, keepdim, correction, out) return var_std("std", a, dims, keepdim, correction, out) end

-- ---- matmul, softmax ---------------------------------------------------------------

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
  if given ~= nil then bump(given) end
  if S.enabled then
    if a.ag_ ~= 0 or b.ag_ ~= 0 then
      S.dest = given
      R.gemm(out, a, b, false, false, 1.0, 0.0)
      S.dest = nil
    elseif given ~= nil then
      clear(out)
    end
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
  local old = beta ~= 0 and given ~= nil and given.ag_ ~= 0 and given or nil -- out's old value takes part
  local rc = C.lt_matmul(out, a, b, opts.trans_a and 1 or 0, opts.trans_b and 1 or 0, alpha, beta)
  if rc ~= 0 then fail() end
  if given ~= nil then bump(given) end
  if S.enabled then
    if a.ag_ ~= 0 or b.ag_ ~= 0 or old ~= nil then
      S.dest = given
      R.gemm(out, a, b, opts.trans_a and true or false, opts.trans_b and true or false, alpha, beta, old)
      S.dest = nil
    elseif given ~= nil then
      clear(out)
    end
  end
  return out
end

local function softmax(name, fn, a, dim, out)
  int_arg(name, dim, "dim", true)
  check_out(name, out)
  local given = out
  if given ~= nil then before_write(name, given, a) end
  if out == nil then out = new() end
  if fn(out, a, dim or -1) ~= 0 then fail() end
  if given ~= nil then bump(given) end
  if S.enabled then
    if a.ag_ ~= 0 then
      S.dest = given
      R.softmax(out, a, name, dim or -1)
      S.dest = nil
    elseif given ~= nil then
      clear(out)
    end
  end
  return out
end

function M.softmax(a, dim, out) return softmax("softmax", C.lt_softmax, a, dim, out) end
function M.log_softmax(a, dim, out) return softmax("log_softmax", C.lt_log_softmax, a, dim, out) end

return M
