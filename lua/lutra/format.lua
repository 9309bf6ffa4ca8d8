-- lutra.format — tostring(t), laid out as PyTorch prints tensors:
--   tensor([[ 0.1234, -1.2000],
--           [ 3.0000,  4.5000]], dtype=f32)
-- Floats print with 4 decimals, as integers with a trailing "." when all values
-- are integral, or in scientific notation when magnitudes span more than 1000x
-- (or exceed 1e8, or go below 1e-4); columns align to the widest value. Integers
-- print as integers, bools as true/false. Past 1000 elements only the first and
-- last 3 items of each long dim are shown, with "..." between, and the shape is
-- added. The dtype is always shown, the device when it is not the CPU, and
-- requires_grad=true or grad_fn=<...> when autograd follows the tensor. CUDA
-- tensors are copied to the CPU to print.
local lt = require "lutra.ffi"
local dtype = require "lutra.dtype"
local fields = require "lutra.tensor.fields"
local ffi, C = lt.ffi, lt.C

local M = {}

local THRESHOLD, EDGE, LINEWIDTH, PRECISION = 1000, 3, 80, 4
local INDENT = #"tensor("
local huge, floor, sformat, rep = math.huge, math.floor, string.format, string.rep

-- ---- element formatting (torch's _Formatter) ------------------------------------------

local function is_finite(v) return v == v and v ~= huge and v ~= -huge end

local function special(v)
  if v ~= v then return "nan" end
  if v == huge then return "inf" end
  if v == -huge then return "-inf" end
end

local function fixed(v) return special(v) or sformat("%." .. PRECISION .. "f", v) end
local function sci(v) return special(v) or sformat("%." .. PRECISION .. "e", v) end
local function integral(v)
  local s = special(v)
  if s then return s end
  return sformat("%.0f", v) .. "."
end

-- Returns a function value -> string padded to a common width.
local function make_formatter(values, n, kind)
  local width, fmt = 1, nil
  if kind == "bool" then
    fmt = function(v) return v ~= 0 and "true" or "false" end
  elseif kind == "int" then
    fmt = function(v) return sformat("%d", v) end
  else
    local lo, hi, int_mode, any = huge, 0, true, false
    for i = 0, n - 1 do
      local v = values[i]
      if v ~= 0 and is_finite(v) then
        local a = v < 0 and -v or v
        if a < lo then lo = a end
        if a > hi then hi = a end
        if v ~= floor(v) then int_mode = false end
        any = true
      end
    end
    fmt = integral
    if any then
      local wide = hi / lo > 1000 or hi > 1e8
      if int_mode then
        if wide then fmt = sci end
      else
        fmt = (wide or lo < 1e-4) and sci or fixed
      end
      for i = 0, n - 1 do
        local v = values[i]
        if v ~= 0 and is_finite(v) then width = math.max(width, #fmt(v)) end
      end
    end
    return function(v)
      local s = fmt(v)
      return rep(" ", width - #s) .. s
    end, width
  end
  for i = 0, n - 1 do width = math.max(width, #fmt(values[i])) end
  return function(v)
    local s = fmt(v)
    return rep(" ", width - #s) .. s
  end, width
end

-- ---- layout (torch's _tensor_str_with_formatter) -----------------------------------------

-- values: row-major over sizes (0-based cdata array); elided[d]: dim d holds the
-- first and last EDGE items of a longer dim.
local function layout(values, sizes, elided, fmt, width)
  local nd = #sizes
  local pos = 0
  local function rec(d, indent)
    local size = sizes[d]
    local parts = {}
    if d == nd then
      for i = 1, size do
        if elided[d] and i == EDGE + 1 then parts[#parts + 1] = " ..." end
        parts[#parts + 1] = fmt(values[pos])
        pos = pos + 1
      end
      local per_line = math.max(1, floor((LINEWIDTH - indent) / (width + 2)))
      local lines = {}
      for i = 1, #parts, per_line do
        lines[#lines + 1] = table.concat(parts, ", ", i, math.min(i + per_line - 1, #parts))
      end
      return "[" .. table.concat(lines, ",\n" .. rep(" ", indent + 1)) .. "]"
    end
    for i = 1, size do
      if elided[d] and i == EDGE + 1 then parts[#parts + 1] = "..." end
      parts[#parts + 1] = rec(d + 1, indent + 1)
    end
    return "[" .. table.concat(parts, "," .. rep("\n", nd - d) .. rep(" ", indent + 1)) .. "]"
  end
  return rec(1, INDENT)
end

-- ---- data access: raw tensors, released here, so printing never touches tidy scopes ----

local function check(rc)
  if rc ~= 0 then error(ffi.string(C.lt_last_error()), 0) end
end

local function body(t, owned)
  local function raw()
    local r = C.lt_tensor_new()
    if r == nil then check(-1) end
    owned[#owned + 1] = r
    return r
  end
  local src = t
  if not fields.is_cpu(t) then
    src = raw()
    check(C.lt_empty(src, t.ndim, fields.dims(t), fields.dtype_id(t), dtype.CPU))
    check(C.lt_copy(src, t))
  end
  local nd = t.ndim
  local numel = 1
  for d = 0, nd - 1 do numel = numel * fields.size(t, d) end
  local summarize = numel > THRESHOLD
  local elided = {}
  if summarize then -- keep the first and last EDGE items of every longer dim
    for d = 0, nd - 1 do
      local n = fields.size(src, d)
      if n > 2 * EDGE then
        local cut, a, b = raw(), raw(), raw()
        local sh = ffi.new("int64_t[?]", nd)
        for k = 0, nd - 1 do sh[k] = fields.size(src, k) end
        sh[d] = 2 * EDGE
        check(C.lt_empty(cut, nd, sh, fields.dtype_id(src), dtype.CPU))
        check(C.lt_narrow(a, cut, d, 0, EDGE))
        check(C.lt_narrow(b, src, d, 0, EDGE))
        check(C.lt_copy(a, b))
        check(C.lt_narrow(a, cut, d, EDGE, EDGE))
        check(C.lt_narrow(b, src, d, n - EDGE, EDGE))
        check(C.lt_copy(a, b))
        src = cut
        elided[d + 1] = true
      end
    end
  end
  local sizes, count = {}, 1
  for d = 0, nd - 1 do
    sizes[d + 1] = fields.size(src, d)
    count = count * sizes[d + 1]
  end
  if count == 0 then return "[]", summarize end
  local dt = fields.dtype_id(t)
  local kind = dt == dtype.BOOL and "bool" or (dtype.is_float(dt) and "float" or "int")
  local buf_dtype = dt == dtype.I64 and dtype.I64 or dtype.F64
  local values = ffi.new(buf_dtype == dtype.I64 and "int64_t[?]" or "double[?]", count)
  check(C.lt_copy_to_buffer(src, values, buf_dtype, count))
  local fmt, width = make_formatter(values, count, kind)
  if nd == 0 then return fmt(values[0]), summarize end
  return layout(values, sizes, elided, fmt, width), summarize
end

function M.tostring(t)
  local suffix = {}
  local shape = {}
  for d = 0, t.ndim - 1 do shape[d + 1] = tostring(fields.size(t, d)) end
  local shape_str = "shape=[" .. table.concat(shape, ", ") .. "]"
  local text, summarized
  if fields.is_freed(t) then
    text = "<freed>"
    suffix[#suffix + 1] = shape_str
  else
    local owned = {}
    local ok, s, summ = pcall(body, t, owned)
    for i = 1, #owned do C.lt_release(owned[i]) end
    if ok then
      text, summarized = s, summ
    else
      text = "<cannot print: " .. tostring(s) .. ">"
    end
    local empty = text == "[]"
    if summarized or (empty and t.ndim ~= 1) then suffix[#suffix + 1] = shape_str end
  end
  suffix[#suffix + 1] = "dtype=" .. t.dtype
  if not fields.is_cpu(t) then suffix[#suffix + 1] = "device=" .. t.device end
  if fields.autograd_state(t) == fields.LEAF then
    suffix[#suffix + 1] = "requires_grad=true"
  elseif fields.is_recorded(t) then
    local rec = require("lutra.autograd.state").record(t)
    suffix[#suffix + 1] = "grad_fn=<" .. (rec and rec.cls and rec.cls.name or "?") .. ">"
  end
  return "tensor(" .. text .. ", " .. table.concat(suffix, ", ") .. ")"
end

return M
