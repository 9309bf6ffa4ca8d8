-- lutra.custom_op.kernel — lt.kernel{...}: a body per device, called over the rows of its tensors.
--
--   local scale_rows = lt.kernel {
--     name = "scale_rows", args = {"y", "x"}, params = {"alpha"},
--     cpu = function(a, lo, hi)               -- rows [lo, hi) of y (all dims but the last), 0-based
--       local y, x, n = a.y, a.x, a.shape.x[#a.shape.x]
--       for i = lo * n, hi * n - 1 do y[i] = a.alpha * x[i] end
--     end,
--     cuda = [[extern "C" __global__ void scale_rows(lt_kernel_args a) { ... }]],
--   }
--   scale_rows{y, x, alpha = 2}
--
-- A call checks its tensors (all on one device; contiguous unless the kernel says
-- contiguous = false), packs their addresses, sizes and strides and the params into
-- lutra.custom_op.abi's block, and runs the body of the tensors' device over `rows` rows (by
-- default the first tensor's: its element count over its last dim). On the CPU the rows are
-- split over lutra's threads (lt.get_num_threads()), at least `grain` rows a thread; a body
-- must only write its own rows, so any split gives the same bits.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local fields = require "lutra.tensor.fields"
local ops = require "lutra.ops"
local abi = require "lutra.custom_op.abi"
local cpu = require "lutra.custom_op.cpu"
local cuda = require "lutra.custom_op.cuda"
local ffi, C = lt.ffi, lt.C

local M = {}
local raise, is_tensor = errors.raise, ops.is_tensor

local FIELDS = {name = true, args = true, params = true, cpu = true, cuda = true, entry = true, rows = true,
                grain = true, contiguous = true, block = true, grid = true}

local Kernel = {}
Kernel.__index = Kernel

local function names_list(kname, what, list, max)
  if list == nil then return {} end
  if type(list) ~= "table" then raise(string.format("kernel '%s': %s must be a list of names", kname, what)) end
  if #list > max then raise(string.format("kernel '%s': at most %d %s, got %d", kname, max, what, #list)) end
  for i, s in ipairs(list) do
    if type(s) ~= "string" or not s:match("^[%a_][%w_]*$") then
      raise(string.format("kernel '%s': %s[%d] must be a name, got %s", kname, what, i, tostring(s)))
    end
  end
  return list
end

-- lt.kernel{name =, args = {tensor names}, params = {number names}, cpu = function(a, lo, hi), cuda = "source"}
-- -> a kernel k, called as k{tensors..., param = number, ...} (returns its first tensor).
-- The cpu body runs rows [lo, hi) (0-based) with a.<arg> the typed pointer of each tensor
-- (float *, double *, int64_t * ...), a.shape.<arg> / a.stride.<arg> Lua lists, a.<param> the
-- numbers, a.rows the call's rows; it runs on worker Lua states (one per thread) that have the
-- standard libraries (no io, os, debug) and no lutra, so it may use no upvalues and no other
-- globals (both refused, by name): pass numbers through params, require ffi inside. The cuda body is CUDA C defining
-- extern "C" __global__ void <entry>(lt_kernel_args a) (a.t[i].data/size/stride, a.p[j], a.rows,
-- scalar_t the first tensor's type), compiled by NVRTC on first use and cached by its source.
-- Options: entry (the CUDA function, default name), rows = function(call) -> count (default: the
-- first tensor's element count over its last dim), grain (least rows a thread, 1), contiguous
-- (true: every tensor must be), block (256) and grid = function(rows, block) -> gx, gy, gz
-- (default one thread a row). Methods: k:ptx{dtype =, arch =} compiles without a GPU,
-- k:load_cuda{device =, dtype =} loads the body on a GPU.
function M.kernel(spec)
  if type(spec) ~= "table" then raise("kernel: expected a table {name =, args =, cpu =, cuda =}") end
  for key in pairs(spec) do
    if not FIELDS[key] then raise("kernel: unknown field " .. tostring(key)) end
  end
  local name = spec.name
  if type(name) ~= "string" or not name:match("^[%a_][%w_]*$") then
    raise("kernel: name must be an identifier, got " .. tostring(name))
  end
  local args = names_list(name, "args", spec.args, abi.MAX_TENSORS)
  if #args == 0 then raise(string.format("kernel '%s': args must name at least one tensor", name)) end
  local params = names_list(name, "params", spec.params, abi.MAX_PARAMS)
  local seen = {rows = true, shape = true, stride = true}
  for _, s in ipairs(args) do
    if seen[s] then raise(string.format("kernel '%s': the name '%s' is taken twice (or is rows, shape, stride)", name, s)) end
    seen[s] = true
  end
  for _, s in ipairs(params) do
    if seen[s] then raise(string.format("kernel '%s': the name '%s' is taken twice (or is rows, shape, stride)", name, s)) end
    seen[s] = true
  end
  if spec.cpu == nil and spec.cuda == nil then raise(string.format("kernel '%s': give a cpu body, a cuda body or both", name)) end
  if spec.cpu ~= nil and type(spec.cpu) ~= "function" then raise(string.format("kernel '%s': cpu must be a function", name)) end
  if spec.cuda ~= nil and type(spec.cuda) ~= "string" then raise(string.format("kernel '%s': cuda must be CUDA C source", name)) end
  local k = setmetatable({name = name, args = args, params = params, cuda = spec.cuda, entry = spec.entry or name,
                          rows = spec.rows, grain = spec.grain or 1, contiguous = spec.contiguous ~= false,
                          block = spec.block or 256, grid = spec.grid,
                          names = table.concat(args, ",") .. "|" .. table.concat(params, ",")}, Kernel)
  if spec.cpu then
    k.cpu = spec.cpu
    k.cpu_id = cpu.register(name, spec.cpu, k.names)
  end
  return k
end

-- The call's argument block from {tensors..., param = number, ...}, and the first tensor.
local function pack(k, call)
  local a = abi.args_type()
  local first
  for i, aname in ipairs(k.args) do
    local t = call[i]
    if not is_tensor(t) then
      raise(string.format("kernel '%s': argument %d (%s) must be a tensor, got %s", k.name, i, aname, type(t)))
    end
    errors.check_alive(t, "kernel '" .. k.name .. "'")
    first = first or t
    if fields.device_id(t) ~= fields.device_id(first) then
      raise(string.format("kernel '%s': %s is on %s, %s on %s: a call runs on one device", k.name, aname, t.device,
        k.args[1], first.device))
    end
    if k.contiguous and not t:is_contiguous() then
      raise(string.format("kernel '%s': %s is not contiguous (pass t:contiguous(), or make the kernel with contiguous "
        .. "= false and index by a.stride.%s)", k.name, aname, aname))
    end
    local nd = #t.shape
    if nd > abi.MAX_DIMS then raise(string.format("kernel '%s': %s has %d dims, at most %d", k.name, aname, nd, abi.MAX_DIMS)) end
    local s = a.t[i - 1]
    s.data = ffi.cast("uint64_t", ffi.cast("uintptr_t", C.lt_data_ptr(t)))
    s.ndim, s.dtype = nd, fields.dtype_id(t)
    for d = 0, nd - 1 do s.size[d], s.stride[d] = fields.size(t, d), fields.stride(t, d) end
  end
  if call[#k.args + 1] ~= nil then
    raise(string.format("kernel '%s': %d tensors given, it takes %d (%s)", k.name, table.maxn(call), #k.args,
      table.concat(k.args, ", ")))
  end
  for j, pname in ipairs(k.params) do
    local v = call[pname]
    if type(v) ~= "number" then raise(string.format("kernel '%s': param %s must be a number, got %s", k.name, pname, type(v))) end
    a.p[j - 1] = v
  end
  a.ntensors, a.nparams = #k.args, #k.params
  return a, first
end

-- Rows of t: its element count over its last dim (1 for a 0-dim tensor).
local function rows_of(t)
  local shape = t.shape
  if #shape == 0 then return 1 end
  local n = 1
  for d = 1, #shape - 1 do n = n * shape[d] end
  return n
end

function Kernel:__call(call)
  if type(call) ~= "table" then raise(string.format("kernel '%s': call it with a table {tensors..., params}", self.name)) end
  local a, first = pack(self, call)
  local rows = self.rows and self.rows(call) or rows_of(first)
  if type(rows) ~= "number" or rows < 0 or rows ~= math.floor(rows) then
    raise(string.format("kernel '%s': rows must be a count, got %s", self.name, tostring(rows)))
  end
  a.rows = rows
  if fields.is_cpu(first) then
    if not self.cpu then raise(string.format("kernel '%s' has no cpu body (its tensors are on the cpu)", self.name)) end
    local threads = C.lt_get_num_threads()
    local nparts = math.min(threads, math.ceil(rows / self.grain))
    cpu.run(self, a, rows, nparts)
  else
    if not self.cuda then raise(string.format("kernel '%s' has no cuda body (its tensors are on %s)", self.name, first.device)) end
    cuda.launch(self, a, fields.dtype_id(first), fields.device_id(first), rows)
  end
  return call[1]
end

-- The PTX of the cuda body for dtype ("f32", "f64") and architecture (default 80): compiles
-- (or finds in the cache) without a GPU.
function Kernel:ptx(opts)
  opts = opts or {}
  if not self.cuda then raise(string.format("kernel '%s' has no cuda body", self.name)) end
  local dt = ({f32 = 0, f64 = 1})[opts.dtype or "f32"]
  if not dt then raise(string.format("kernel '%s': ptx: dtype must be f32 or f64, got %s", self.name, tostring(opts.dtype))) end
  return cuda.ptx(self, dt, opts.arch or cuda.DEFAULT_ARCH)
end

-- Loads the cuda body on a device (compiling for its architecture): what a call on cuda tensors
-- does first. Raises "no GPU" where the driver or a device is missing.
function Kernel:load_cuda(opts)
  opts = opts or {}
  if not self.cuda then raise(string.format("kernel '%s' has no cuda body", self.name)) end
  return cuda.load(self, ({f32 = 0, f64 = 1})[opts.dtype or "f32"] or 0, opts.device or 0)
end

M.Kernel = Kernel
return M
