-- lutra.create — making tensors: from Lua values, filled, ranges, random, cat/stack.
--
-- Shapes are numbers or one list: lutra.zeros(2, 3) == lutra.zeros{2, 3}. Options
-- come last, as a table {dtype=, device=, requires_grad=} or a dtype/device name:
-- lutra.zeros(2, 3, {dtype = "bf16", device = "cuda"}), lutra.ones(4, "f64"),
-- lutra.randn(3, 3, {requires_grad = true}) (a leaf that autograd follows).
-- Float results default to f32.
--
-- Random numbers come from one default generator (seed, offset): element i of a
-- draw uses counter offset + i under key seed (Philox4x32-10, lutra.h), and each
-- draw advances offset by its numel, so a run is reproducible from the seed and
-- resumable from lutra.get_rng_state().
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local shape = require "lutra.shape"
local dtype = require "lutra.dtype"
local fields = require "lutra.tensor.fields"
local ops = require "lutra.ops"
local S = require "lutra.autograd.state"
local records = require("lutra.autograd.op").records
local ffi, C = lt.ffi, lt.C

local M = {}

local new, fail, raise = memory.new, errors.fail, errors.raise
local is_tensor = ops.is_tensor

-- dtype and device ids from options (nil, a name, or {dtype=, device=}).
local function options(op, opts, dt, dev)
  if opts == nil then return dt, dev end
  if type(opts) == "string" or type(opts) == "number" then
    if dtype.is_device_name(opts) then return dt, dtype.device_id(opts) end
    return dtype.id(opts), dev
  end
  if type(opts) == "table" then return dtype.id(opts.dtype, dt), dtype.device_id(opts.device, dev) end
  raise(op .. ": options must be a table {dtype=, device=} or a dtype name, got " .. type(opts))
end
M.options = options

-- Applies the requires_grad option to a freshly made tensor.
local function finish(out, opts)
  if type(opts) == "table" and opts.requires_grad then S.set_requires_grad(out, true) end
  return out
end

local function empty(ndim, sizes, dt, dev)
  local out = new()
  if C.lt_empty(out, ndim, sizes, dt, dev) ~= 0 then fail() end
  if dev >= 0 then memory.note_cuda() end
  return out
end

local function numel(t)
  local n = 1
  for d = 0, t.ndim - 1 do n = n * fields.size(t, d) end
  return n
end

-- ---- filled tensors ------------------------------------------------------------------

-- lutra.empty(shape..., opts): a tensor of that shape whose contents are whatever the memory held.
function M.empty(...)
  local n, a, opts = shape.parse("empty", ...)
  local dt, dev = options("empty", opts, dtype.F32, dtype.CPU)
  if type(opts) == "table" and opts.pin_memory then -- page-locked, for async copies to a GPU
    if dev ~= dtype.CPU then raise("empty: pin_memory is for CPU tensors, not " .. dtype.device_name(dev)) end
    local out = new()
    if C.lt_empty_pinned(out, n, a, dt) ~= 0 then fail() end
    return finish(out, opts)
  end
  return finish(empty(n, a, dt, dev), opts)
end

-- full(shape_list, value, opts): the shape is a list, as torch's tuple, so that the
-- value is never mistaken for a size.
function M.full(sizes, value, opts)
  if type(sizes) ~= "table" then raise("full: the shape must be a list, e.g. lutra.full({2, 3}, 7)") end
  local n, a = shape.from_list("full", sizes, 1)
  if type(value) == "boolean" then
    local dt, dev = options("full", opts, dtype.BOOL, dtype.CPU)
    value = value and 1 or 0
    local out = empty(n, a, dt, dev)
    if C.lt_fill(out, value) ~= 0 then fail() end
    return out
  end
  if type(value) ~= "number" then raise("full: the fill value must be a number, got " .. type(value)) end
  local dt, dev = options("full", opts, dtype.F32, dtype.CPU)
  local out = empty(n, a, dt, dev)
  if C.lt_fill(out, value) ~= 0 then fail() end
  return finish(out, opts)
end

-- lutra.zeros(shape..., opts), lutra.ones(shape..., opts): a tensor of that shape filled with 0 / 1
-- (f32 unless opts says otherwise).
local function filled(op, value)
  return function(...)
    local n, a, opts = shape.parse(op, ...)
    local dt, dev = options(op, opts, dtype.F32, dtype.CPU)
    local out = empty(n, a, dt, dev)
    if C.lt_fill(out, value) ~= 0 then fail() end
    return finish(out, opts)
  end
end
M.zeros, M.ones = filled("zeros", 0), filled("ones", 1)

local function like(op, t, opts)
  if not is_tensor(t) then raise(op .. ": expected a tensor, got " .. type(t)) end
  local dt, dev = options(op, opts, fields.dtype_id(t), fields.device_id(t))
  return empty(t.ndim, fields.dims(t), dt, dev)
end

-- lutra.empty_like(t, opts): uninitialised, t's shape, dtype and device unless opts says otherwise.
function M.empty_like(t, opts) return finish(like("empty_like", t, opts), opts) end
-- lutra.zeros_like(t, opts): zeros of t's shape, dtype and device unless opts says otherwise.
function M.zeros_like(t, opts) return finish(M.fill_(like("zeros_like", t, opts), 0), opts) end
-- lutra.ones_like(t, opts): ones of t's shape, dtype and device unless opts says otherwise.
function M.ones_like(t, opts) return finish(M.fill_(like("ones_like", t, opts), 1), opts) end
-- lutra.full_like(t, value, opts): value everywhere, t's shape, dtype and device unless opts says otherwise.
function M.full_like(t, value, opts) return finish(M.fill_(like("full_like", t, opts), value), opts) end

-- t:fill_(v): every element set to v, in place; returns t.
function M.fill_(t, v)
  ops.before_write("fill_", t)
  if C.lt_fill(t, v) ~= 0 then fail() end
  if S.enabled then S.clear(t) end
  S.bump(t)
  return t
end

-- ---- from Lua values -------------------------------------------------------------------

-- lutra.tensor(data, opts): data is a number, a boolean, nested lists of them, or a
-- tensor (copied). Numbers default to f32, booleans to bool.
function M.tensor(data, opts)
  if is_tensor(data) then
    local dt, dev = options("tensor", opts, fields.dtype_id(data), fields.device_id(data))
    local out = empty(data.ndim, fields.dims(data), dt, dev)
    if C.lt_copy(out, data) ~= 0 then fail() end
    return finish(out, opts) -- a copy that does not take part in data's graph, as torch.tensor
  end
  local sizes, leaf = {}, data
  while type(leaf) == "table" do
    sizes[#sizes + 1] = #leaf
    leaf = leaf[1]
  end
  if #sizes > lt.MAX_DIMS then raise(string.format("tensor: %d levels of nesting, at most %d dims", #sizes, lt.MAX_DIMS)) end
  local default = type(leaf) == "boolean" and dtype.BOOL or dtype.F32
  if leaf ~= nil and type(leaf) ~= "number" and type(leaf) ~= "boolean" then
    raise("tensor: expected numbers or booleans, got " .. type(leaf))
  end
  local dt, dev = options("tensor", opts, default, dtype.CPU)
  local n = 1
  for i = 1, #sizes do n = n * sizes[i] end
  local buf = ffi.new("double[?]", n > 0 and n or 1)
  local pos, nd = 0, #sizes
  local function flatten(x, d, path)
    if d > nd then
      local tx = type(x)
      if tx == "number" then
        buf[pos] = x
      elseif tx == "boolean" then
        buf[pos] = x and 1 or 0
      elseif tx == "cdata" and tonumber(x) then
        buf[pos] = tonumber(x)
      else
        raise(string.format("tensor: element %s is a %s, expected a number or a boolean", path, tx))
      end
      pos = pos + 1
      return
    end
    if type(x) ~= "table" or #x ~= sizes[d] then
      raise(string.format("tensor: ragged nested lists: element %s has %s, expected a list of %d", path,
        type(x) == "table" and ("length " .. #x) or ("a " .. type(x)), sizes[d]))
    end
    for i = 1, sizes[d] do flatten(x[i], d + 1, path .. "[" .. i .. "]") end
  end
  flatten(data, 1, "")
  local sh = ffi.new("int64_t[?]", nd > 0 and nd or 1)
  for i = 1, nd do sh[i - 1] = sizes[i] end
  local out = empty(nd, sh, dt, dev)
  if C.lt_copy_from_buffer(out, buf, dtype.F64, n) ~= 0 then fail() end
  return finish(out, opts)
end

-- ---- ranges ----------------------------------------------------------------------------

-- arange(end), arange(start, end), arange(start, end, step), then options. Integer
-- arguments give i64 (as torch), others f32.
function M.arange(a, b, c, opts)
  if type(b) ~= "number" then a, b, c, opts = 0, a, 1, b
  elseif type(c) ~= "number" then a, b, c, opts = a, b, 1, c end
  if type(a) ~= "number" or type(b) ~= "number" then raise("arange: start and end must be numbers") end
  local integral = a == math.floor(a) and b == math.floor(b) and c == math.floor(c)
  local dt, dev = options("arange", opts, integral and dtype.I64 or dtype.F32, dtype.CPU)
  local out = new()
  if C.lt_arange(out, a, b, c, dt, dev) ~= 0 then fail() end
  if dev >= 0 then memory.note_cuda() end
  return finish(out, opts)
end

-- linspace(start, stop, steps, opts): steps evenly spaced values from start to stop, both included
-- (f32 by default).
function M.linspace(start, stop, steps, opts)
  if type(start) ~= "number" or type(stop) ~= "number" then raise("linspace: start and end must be numbers") end
  errors.int_arg("linspace", steps, "steps")
  local dt, dev = options("linspace", opts, dtype.F32, dtype.CPU)
  local out = new()
  if C.lt_linspace(out, start, stop, steps, dt, dev) ~= 0 then fail() end
  if dev >= 0 then memory.note_cuda() end
  return finish(out, opts)
end

-- ---- random numbers -----------------------------------------------------------------------

local rng = {seed = 67280421310721, offset = 0} -- torch's default seed

-- manual_seed(seed): restarts the default generator at (seed, offset 0); seed a non-negative integer.
function M.manual_seed(seed)
  if type(seed) ~= "number" or seed < 0 or seed ~= math.floor(seed) then
    raise("manual_seed: the seed must be a non-negative integer, got " .. tostring(seed))
  end
  rng.seed, rng.offset = seed, 0
end

-- get_rng_state() -> {seed =, offset =}: the default generator's position (saved in checkpoints).
function M.get_rng_state() return {seed = rng.seed, offset = rng.offset} end

-- set_rng_state{seed =, offset =}: puts the default generator back where get_rng_state found it.
function M.set_rng_state(state)
  if type(state) ~= "table" or type(state.seed) ~= "number" or type(state.offset) ~= "number" then
    raise("set_rng_state: expected {seed=, offset=}")
  end
  rng.seed, rng.offset = state.seed, state.offset
end

-- Fills t in place from the default generator and advances it.
local function draw(t, fn, a, b)
  ops.before_write("random fill", t)
  local offset = rng.offset
  if fn(t, rng.seed, offset, a, b) ~= 0 then fail() end
  rng.offset = offset + numel(t)
  if S.enabled then S.clear(t) end
  S.bump(t)
  return t
end

-- In place from the default generator: t:uniform_(lo = 0, hi = 1), t:normal_(mean = 0, std = 1),
-- t:random_(lo, hi) integers in [lo, hi), t:bernoulli_(p = 0.5) ones with probability p.
function M.uniform_(t, lo, hi) return draw(t, C.lt_rand_uniform, lo or 0, hi or 1) end
function M.normal_(t, mean, std) return draw(t, C.lt_rand_normal, mean or 0, std or 1) end
function M.random_(t, lo, hi) return draw(t, C.lt_rand_int, lo, hi) end
function M.bernoulli_(t, p)
  ops.before_write("bernoulli_", t)
  local offset = rng.offset
  if C.lt_rand_bernoulli(t, rng.seed, offset, p or 0.5) ~= 0 then fail() end
  rng.offset = offset + numel(t)
  if S.enabled then S.clear(t) end
  S.bump(t)
  return t
end

-- rand: uniform in [0, 1); randn: standard normal.
function M.rand(...)
  local n, a, opts = shape.parse("rand", ...)
  local dt, dev = options("rand", opts, dtype.F32, dtype.CPU)
  return finish(draw(empty(n, a, dt, dev), C.lt_rand_uniform, 0, 1), opts)
end

-- randn(shape..., opts): standard normal draws (f32 by default).
function M.randn(...)
  local n, a, opts = shape.parse("randn", ...)
  local dt, dev = options("randn", opts, dtype.F32, dtype.CPU)
  return finish(draw(empty(n, a, dt, dev), C.lt_rand_normal, 0, 1), opts)
end

-- randint(high, shape, opts) or randint(low, high, shape, opts): integers in
-- [low, high), i64 by default.
function M.randint(low, high, sizes, opts)
  if type(high) ~= "number" then low, high, sizes, opts = 0, low, high, sizes end
  if type(low) ~= "number" or type(high) ~= "number" then raise("randint: low and high must be numbers") end
  if type(sizes) ~= "table" then raise("randint: expected a shape list, got " .. type(sizes)) end
  local n, a = shape.from_list("randint", sizes, 1)
  local dt, dev = options("randint", opts, dtype.I64, dtype.CPU)
  return draw(empty(n, a, dt, dev), C.lt_rand_int, low, high)
end

-- rand_like(t, opts): uniform in [0, 1), t's shape, dtype and device unless opts says otherwise.
function M.rand_like(t, opts) return finish(draw(like("rand_like", t, opts), C.lt_rand_uniform, 0, 1), opts) end
-- randn_like(t, opts): standard normal, t's shape, dtype and device unless opts says otherwise.
function M.randn_like(t, opts) return finish(draw(like("randn_like", t, opts), C.lt_rand_normal, 0, 1), opts) end

-- ---- joining ---------------------------------------------------------------------------------

-- Concatenates tensors (same dtype, device, and sizes except along dim).
function M.cat(list, dim)
  if type(list) ~= "table" or #list == 0 then raise("cat: expected a non-empty list of tensors") end
  dim = dim or 0
  local first = list[1]
  for i = 1, #list do
    if not is_tensor(list[i]) then raise(string.format("cat: element %d is a %s, not a tensor", i, type(list[i]))) end
  end
  local nd = first.ndim
  if nd == 0 then raise("cat: zero-dimensional tensors cannot be concatenated") end
  local d = dim < 0 and dim + nd or dim
  if d < 0 or d >= nd then raise(string.format("cat: dim %d out of range for %d-d tensors", dim, nd)) end
  local total = 0
  for i, t in ipairs(list) do
    local ok = t.ndim == nd and fields.same_kind(t, first)
    for k = 0, nd - 1 do
      if k ~= d and fields.size(t, k) ~= fields.size(first, k) then ok = false end
    end
    if not ok then
      raise(string.format("cat: tensor %d is %s %s %s, expected %s %s %s matching except in dim %d", i,
        shape.shape_string(t), t.dtype, t.device, shape.shape_string(first), first.dtype, first.device, d))
    end
    total = total + fields.size(t, d)
  end
  local sh = ffi.new("int64_t[?]", nd)
  for k = 0, nd - 1 do sh[k] = fields.size(first, k) end
  sh[d] = total
  local out = empty(nd, sh, fields.dtype_id(first), fields.device_id(first))
  local part = C.lt_tensor_new()
  local start, rc = 0, 0
  for _, t in ipairs(list) do
    local len = fields.size(t, d)
    rc = C.lt_narrow(part, out, d, start, len)
    if rc == 0 then rc = C.lt_copy(part, t) end
    if rc ~= 0 then break end
    start = start + len
  end
  C.lt_release(part)
  if rc ~= 0 then fail() end
  if S.enabled then
    for i = 1, #list do
      if fields.is_tracked(list[i]) then
        records.cat(out, list, d)
        break
      end
    end
  end
  return out
end

-- Stacks tensors of one shape along a new dim.
function M.stack(list, dim)
  if type(list) ~= "table" or #list == 0 then raise("stack: expected a non-empty list of tensors") end
  dim = dim or 0
  local parts = {}
  for i, t in ipairs(list) do
    if not is_tensor(t) then raise(string.format("stack: element %d is a %s, not a tensor", i, type(t))) end
    if shape.shape_string(t) ~= shape.shape_string(list[1]) then
      raise(string.format("stack: tensor %d has shape %s, expected %s", i, shape.shape_string(t),
        shape.shape_string(list[1])))
    end
    local u = new()
    if C.lt_unsqueeze(u, t, dim) ~= 0 then fail() end
    parts[i] = u
  end
  local d = dim < 0 and dim + list[1].ndim + 1 or dim
  local out = M.cat(parts, d) -- the parts have no autograd data: recorded as one stack node below
  if S.enabled then
    for i = 1, #list do
      if fields.is_tracked(list[i]) then
        records.stack(out, list, d)
        break
      end
    end
  end
  return out
end

return M
