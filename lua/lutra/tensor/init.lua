-- lutra.tensor — the tensor type: cdata `lt_tensor &` with a metatype.
--
-- A tensor is a reference to the C struct (made as ptr[0] from lt_tensor_new()),
-- not a pointer: indexing a pointer with a number would be pointer arithmetic,
-- while a reference passes numbers and tables on to __index, so t[i] and
-- t[{i, {a, b}}] index the tensor. It converts to `lt_tensor *` in every C call.
--
-- String keys give methods (t:view(2, -1)) and properties (t.shape, t.dtype,
-- t.device, t.ndim, t.T); numbers and tables index (lutra.index). Arithmetic
-- operators take tensors and numbers on either side. `==` is NOT elementwise: it
-- compares identity (two references to the same tensor); use t:eq(u).
-- Dims and indices are 0-based and negative ones count from the end. The C struct's fields are
-- read and written only through lutra.tensor.fields.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local shape = require "lutra.shape"
local dtype = require "lutra.dtype"
local ops = require "lutra.ops"
local index = require "lutra.index"
local format = require "lutra.format"
local S = require "lutra.autograd.state"
local fields = require "lutra.tensor.fields"
local ffi, C = lt.ffi, lt.C

local M = {}

local new, fail, raise, check_alive = memory.new, errors.fail, errors.raise, errors.check_alive
local tensor_arg, int_arg = errors.tensor_arg, errors.int_arg
local type, tonumber = type, tonumber
local is_tensor = ops.is_tensor
local shape_table = shape.shape_table

local methods, properties, setters = {}, {}, {}
M.methods, M.properties, M.setters = methods, properties, setters -- extension points for other modules

-- Views share the storage of t: marked as such, and recorded for autograd by
-- records[kind](out, t, a, b, c, d) when t has autograd data in grad mode.
local records = require("lutra.autograd.op").records
local function viewed(out, t, kind, a, b, c, d)
  if fields.same_storage(out, t) then fields.set_view_kind(out, fields.VIEW) end -- reshape may have copied
  if fields.is_tracked(t) and S.enabled then records[kind](out, t, a, b, c, d) end
  return out
end
M.viewed = viewed

-- ---- properties and geometry -------------------------------------------------------

properties.shape = shape_table
properties.dtype = function(t) return dtype.name(fields.dtype_id(t)) end
properties.device = function(t) return dtype.device_name(fields.device_id(t)) end
properties.is_cuda = fields.is_cuda
properties.T = function(t) -- all dims reversed, as torch's .T
  local n, dims = t.ndim, {}
  for d = 1, n do dims[d] = n - d end
  return methods.permute(t, dims)
end

local function wrap_dim(op, d, n)
  if type(d) ~= "number" then raise(op .. ": dim must be a number, got " .. type(d)) end
  local m = n > 0 and n or 1
  if d < -m or d >= m then raise(string.format("%s: dim %d out of range for a %d-d tensor", op, d, n)) end
  return d < 0 and d + m or d
end

-- t:size() -> the shape as a list; t:size(d) -> dim d's size (d < 0 counts from the end).
function methods.size(t, d)
  if d == nil then return shape_table(t) end
  d = wrap_dim("size", d, t.ndim)
  return t.ndim == 0 and 1 or fields.size(t, d)
end

-- t:stride() -> the strides (in elements) as a list; t:stride(d) -> dim d's.
function methods.stride(t, d)
  if d == nil then
    local s = {}
    for i = 0, t.ndim - 1 do s[i + 1] = fields.stride(t, i) end
    return s
  end
  d = wrap_dim("stride", d, t.ndim)
  return t.ndim == 0 and 1 or fields.stride(t, d)
end

-- The number of dims.
function methods.dim(t) return t.ndim end

methods.numel = fields.numel
methods.nelement = methods.numel

-- Bytes per element.
function methods.element_size(t) return dtype.sizes[fields.dtype_id(t)] end
-- Whether the elements lie in row-major order without gaps.
function methods.is_contiguous(t) return C.lt_is_contiguous(t) ~= 0 end
-- Whether the dtype is f32, f64, bf16 or f16.
function methods.is_floating_point(t) return dtype.is_float(fields.dtype_id(t)) end
methods.is_freed = fields.is_freed

-- The address of element [0, ..., 0] (void *), for FFI code that reads the data.
function methods.data_ptr(t)
  check_alive(t, "data_ptr")
  return C.lt_data_ptr(t)
end

-- ---- views (share the storage) ---------------------------------------------------

-- t:view(shape...): the same storage seen with another shape of the same numel; refused when t's
-- strides cannot be viewed so (reshape copies then).
function methods.view(t, ...)
  local n, a = shape.parse("view", ...)
  local out = new()
  if C.lt_view(out, t, n, a) ~= 0 then fail() end
  return viewed(out, t, "reshape")
end

-- t:reshape(shape...): a view when the strides allow it, else a copy; one size may be -1.
function methods.reshape(t, ...)
  local n, a = shape.parse("reshape", ...)
  local out = new()
  if C.lt_reshape(out, t, n, a) ~= 0 then fail() end
  return viewed(out, t, "reshape")
end

-- t:view_as(other), t:reshape_as(other): t:view / t:reshape to other's shape.
function methods.view_as(t, other) return methods.view(t, shape_table(tensor_arg("view_as", other, "other"))) end
function methods.reshape_as(t, other) return methods.reshape(t, shape_table(tensor_arg("reshape_as", other, "other"))) end

-- A view with dims d0 and d1 swapped.
function methods.transpose(t, d0, d1)
  int_arg("transpose", d0, "dim0")
  int_arg("transpose", d1, "dim1")
  local out = new()
  if C.lt_transpose(out, t, d0, d1) ~= 0 then fail() end
  return viewed(out, t, "transpose", d0, d1)
end

-- The transpose of a matrix; tensors of fewer dims are returned as they are.
function methods.t(t)
  if t.ndim < 2 then return t end
  if t.ndim > 2 then raise(string.format("t: expects a tensor with <= 2 dims, got %d dims", t.ndim)) end
  return methods.transpose(t, 0, 1)
end

-- t:permute(dims...): a view with the dims in that order (t:permute(0, 2, 1, 3)).
function methods.permute(t, ...)
  local n, a = shape.parse("permute", ...)
  local dims = {}
  for i = 1, n do dims[i] = tonumber(a[i - 1]) end
  local out = new()
  if C.lt_permute(out, t, n, a) ~= 0 then fail() end
  return viewed(out, t, "permute", dims)
end

-- A view of length elements along dim from start.
function methods.narrow(t, dim, start, length)
  int_arg("narrow", dim, "dim")
  int_arg("narrow", start, "start")
  int_arg("narrow", length, "length")
  local out = new()
  if C.lt_narrow(out, t, dim, start, length) ~= 0 then fail() end
  return viewed(out, t, "slice", dim, start, start + length)
end

-- Elements start, start + step, ... below stop along dim (stop nil: to the end).
function methods.slice(t, dim, start, stop, step)
  int_arg("slice", dim, "dim")
  int_arg("slice", start, "start", true)
  int_arg("slice", stop, "stop", true)
  int_arg("slice", step, "step", true)
  local out = new()
  if C.lt_slice(out, t, dim, start or 0, stop or 2 ^ 62, step or 1) ~= 0 then fail() end
  return viewed(out, t, "slice", dim, start or 0, stop or 2 ^ 62, step or 1)
end

-- A view of index i along dim, that dim removed.
function methods.select(t, dim, i)
  int_arg("select", dim, "dim")
  int_arg("select", i, "index")
  local out = new()
  if C.lt_select(out, t, dim, i) ~= 0 then fail() end
  return viewed(out, t, "select", dim, i)
end

-- t:expand(shape...): a view broadcast to shape (size-1 dims repeated with stride 0, no copy).
function methods.expand(t, ...)
  local n, a = shape.parse("expand", ...)
  local out = new()
  if C.lt_expand(out, t, n, a) ~= 0 then fail() end
  return viewed(out, t, "expand")
end

-- t:expand(other's shape).
function methods.expand_as(t, other)
  tensor_arg("expand_as", other, "other")
  local out = new()
  if C.lt_expand(out, t, other.ndim, fields.dims(other)) ~= 0 then fail() end
  return viewed(out, t, "expand")
end

-- A view with a new dim of size 1 at dim.
function methods.unsqueeze(t, dim)
  int_arg("unsqueeze", dim, "dim")
  local out = new()
  if C.lt_unsqueeze(out, t, dim) ~= 0 then fail() end
  return viewed(out, t, "reshape")
end

-- Drops dim (which must have size 1), or every dim of size 1 when dim is nil.
function methods.squeeze(t, dim)
  int_arg("squeeze", dim, "dim", true)
  local out = new()
  local rc = dim == nil and C.lt_squeeze_all(out, t) or C.lt_squeeze(out, t, dim)
  if rc ~= 0 then fail() end
  return viewed(out, t, "reshape")
end

-- Merges dims start_dim..end_dim (default: all) into one.
function methods.flatten(t, start_dim, end_dim)
  local n = t.ndim
  if n == 0 then return methods.reshape(t, 1) end
  local s, e = wrap_dim("flatten", start_dim or 0, n), wrap_dim("flatten", end_dim or -1, n)
  if s > e then raise(string.format("flatten: start_dim %d comes after end_dim %d", s, e)) end
  local sizes, merged = {}, 1
  for d = 0, n - 1 do
    local size = fields.size(t, d)
    if d < s or d > e then
      sizes[#sizes + 1] = size
    else
      merged = merged * size
      if d == e then sizes[#sizes + 1] = merged end
    end
  end
  return methods.reshape(t, sizes)
end

-- A tensor with the same data laid out contiguously: t itself when it already is.
function methods.contiguous(t)
  check_alive(t, "contiguous")
  if C.lt_is_contiguous(t) ~= 0 then return t end
  local out = new()
  if C.lt_contiguous(out, t) ~= 0 then fail() end
  if fields.is_tracked(t) and S.enabled then records.copy(out, t) end
  return out
end

-- ---- copies, fills, conversions ------------------------------------------------------

local function empty_like(t, dt, dev)
  local out = new()
  dt, dev = dt or fields.dtype_id(t), dev or fields.device_id(t)
  if C.lt_empty(out, t.ndim, fields.dims(t), dt, dev) ~= 0 then fail() end
  if dev >= 0 then memory.note_cuda() end
  return out
end
M.empty_like = empty_like

-- A copy with its own storage (contiguous), recorded for autograd.
function methods.clone(t)
  check_alive(t, "clone")
  local out = empty_like(t)
  if C.lt_copy(out, t) ~= 0 then fail() end
  if fields.is_tracked(t) and S.enabled then records.copy(out, t) end
  return out
end

-- Copies src (a tensor broadcasting to t's shape, any dtype/device) into t.
function methods.copy_(t, src)
  if type(src) == "number" or type(src) == "boolean" then return methods.fill_(t, src) end
  if not is_tensor(src) then raise("copy_: expected a tensor, got " .. type(src)) end
  ops.before_write("copy_", t, src)
  if C.lt_copy(t, src) ~= 0 then fail() end
  S.bump(t)
  if S.enabled then
    if fields.is_tracked(src) then records.copy(t, src) else S.clear(t) end
  end
  return t
end

-- t:fill_(v): every element set to v (a number or a boolean), in place; returns t.
function methods.fill_(t, v)
  if v == true then v = 1 elseif v == false then v = 0 end
  if type(v) ~= "number" then raise("fill_: expected a number, got " .. type(v)) end
  ops.before_write("fill_", t)
  if C.lt_fill(t, v) ~= 0 then fail() end
  S.bump(t)
  if S.enabled then S.clear(t) end
  return t
end

-- t:fill_(0).
function methods.zero_(t) return methods.fill_(t, 0) end

-- to(dtype), to(device), to(device, dtype), to{dtype=, device=}, to(other_tensor).
-- Returns t itself when nothing changes.
function methods.to(t, a, b)
  local dt, dev = fields.dtype_id(t), fields.device_id(t)
  local function take(x)
    if x == nil then return end
    if is_tensor(x) then
      dt, dev = fields.dtype_id(x), fields.device_id(x)
    elseif type(x) == "table" then
      dt = dtype.id(x.dtype, dt)
      dev = dtype.device_id(x.device, dev)
    else
      local kind, id = dtype.device_or_dtype(x, "to")
      if kind == "device" then dev = id else dt = id end
    end
  end
  take(a)
  take(b)
  check_alive(t, "to")
  if dt == fields.dtype_id(t) and dev == fields.device_id(t) then return t end
  local out = empty_like(t, dt, dev)
  if C.lt_copy(out, t) ~= 0 then fail() end
  if fields.is_tracked(t) and S.enabled then records.copy(out, t) end
  return out
end

-- t:float(), double, bf16 / bfloat16, half, long, int, byte, bool: t:to(dtype) for that dtype.
for name, dt in pairs {float = "f32", double = "f64", bf16 = "bf16", bfloat16 = "bf16", half = "f16",
                      long = "i64", int = "i32", byte = "u8", bool = "bool"} do
  methods[name] = function(t) return methods.to(t, dt) end
end
-- t:cpu(), t:cuda(k): t:to("cpu") / t:to(device k, default 0); t:type_as(other): t:to(other's dtype).
function methods.cpu(t) return methods.to(t, "cpu") end
function methods.cuda(t, k) return methods.to(t, k or 0) end
function methods.type_as(t, other)
  return methods.to(t, dtype.name(fields.dtype_id(tensor_arg("type_as", other, "other"))))
end

-- ---- values ------------------------------------------------------------------------

local item_value = ffi.new("double[1]")

-- The value of a one-element tensor (a boolean for bool tensors).
function methods.item(t)
  if C.lt_item(t, item_value) ~= 0 then fail() end
  local v = item_value[0]
  if fields.dtype_id(t) == dtype.BOOL then return v ~= 0 end
  return v
end

-- Nested Lua lists of the values (numbers, or booleans for bool tensors); a number
-- for a 0-d tensor. Lists are 1-based: t:tolist()[1] is t[0].
function methods.tolist(t)
  check_alive(t, "tolist")
  local n = methods.numel(t)
  local buf = ffi.new("double[?]", n > 0 and n or 1)
  if C.lt_copy_to_buffer(t, buf, dtype.F64, n) ~= 0 then fail() end
  local is_bool = fields.dtype_id(t) == dtype.BOOL
  local nd = t.ndim
  if nd == 0 then
    if is_bool then return buf[0] ~= 0 end
    return buf[0]
  end
  local sizes = shape_table(t)
  local pos = 0
  local function build(d)
    local list, size = {}, sizes[d]
    if d == nd then
      for i = 1, size do
        local v = buf[pos]
        if is_bool then v = v ~= 0 end
        list[i] = v
        pos = pos + 1
      end
    else
      for i = 1, size do list[i] = build(d + 1) end
    end
    return list
  end
  return build(1)
end

-- Releases t's storage now; t stays a tensor object, and using it is an error.
function methods.free(t)
  memory.free(t)
end

-- ---- elementwise, reductions, matmul (lutra.ops) ---------------------------------------

for name, fn in pairs(ops) do
  if type(fn) == "function" and name ~= "binary" and name ~= "unary" and name ~= "is_tensor" and name ~= "where"
      and name ~= "gemm" then
    methods[name] = fn
  end
end
methods.where = function(t, cond, other, out) return ops.where(cond, t, other, out) end -- t:where(c, y) as torch
methods.mm = ops.matmul

-- ---- the metatype ------------------------------------------------------------------

local index_get, index_set = index.get, index.set

local mt = {}
mt.__index = function(t, k)
  local m = methods[k]
  if m ~= nil then return m end
  local p = properties[k]
  if p ~= nil then return p(t) end
  local tk = type(k)
  if tk == "number" or tk == "table" then return index_get(t, k) end
  if tk == "cdata" and tonumber(k) then return index_get(t, tonumber(k)) end -- an int64 index
  raise("tensor has no method or property '" .. tostring(k) .. "'")
end
mt.__newindex = function(t, k, v)
  local tk = type(k)
  if tk == "number" or tk == "table" then return index_set(t, k, v) end
  local set = setters[k]
  if set then return set(t, v) end
  raise("cannot set '" .. tostring(k) .. "' on a tensor")
end
mt.__len = function(t)
  if t.ndim == 0 then raise("len() of a 0-d tensor") end
  return fields.size(t, 0)
end
mt.__tostring = format.tostring
mt.__concat = function(a, b) return tostring(a) .. tostring(b) end
for k, f in pairs(ops.metamethods) do mt[k] = f end

M.Tensor = ffi.metatype("lt_tensor", mt)
M.metatable = mt
M.is_tensor = is_tensor

return M
