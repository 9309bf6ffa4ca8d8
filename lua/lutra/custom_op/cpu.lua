-- lutra.custom_op.cpu — CPU bodies: a Lua function over typed pointers, compiled by LuaJIT and run
-- on lutra's threads. One LuaJIT state is single-threaded, so the body travels as bytecode
-- (string.dump) to worker states made in C (host/app/custom_op_cpu.c), one per thread, each of
-- which runs a contiguous range of the call's rows; with one part the body runs here, in the
-- main state. A body therefore may not use upvalues (the enclosing code's locals) nor globals
-- beyond the standard libraries: the workers would not see them (both are refused when the kernel
-- is made, so one thread and many behave alike). It gets (a, lo, hi): a from lutra.custom_op.abi.view, rows [lo, hi).
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local abi = require "lutra.custom_op.abi"
local ffi, C = lt.ffi, lt.C

local M = {}

for _, decl in ipairs {
  "int lt_custom_op_cpu_init(const char *package_path);",
  "int lt_custom_op_cpu_register(const char *bytecode, int64_t len, const char *name, const char *names, int *id);",
  "int lt_custom_op_cpu_run(int id, const void *args, int64_t rows, int nparts);",
  "int lt_custom_op_cpu_workers(void);",
} do pcall(ffi.cdef, decl) end

local raise = errors.raise
local last_error = function() return ffi.string(C.lt_last_error()) end

-- The globals a worker state has (host/app/custom_op_cpu.c opens these libraries, not io, os, debug).
local WORKER_GLOBALS = {}
for name in ("assert collectgarbage dofile error gcinfo getfenv getmetatable ipairs load loadfile loadstring module "
             .. "newproxy next pairs pcall print rawequal rawget rawset require select setfenv setmetatable tonumber "
             .. "tostring type unpack xpcall _G _VERSION coroutine package string table math bit jit"):gmatch("%S+") do
  WORKER_GLOBALS[name] = true
end

-- The opcodes of GGET, GSET and FNEW in this LuaJIT, read from the bytecode of three probes: the
-- instruction whose operand D is the probe's constant (jit.vmdef, which names opcodes, is not
-- installed everywhere LuaJIT is).
local OPS = nil
local function opcodes()
  if OPS then return OPS end
  local jutil = require "jit.util"
  local function op_of(f, is_operand)
    for pc = 1, math.huge do
      local ins = jutil.funcbc(f, pc)
      if not ins then break end
      local ok, k = pcall(jutil.funck, f, -bit.rshift(ins, 16) - 1)
      if ok and is_operand(k) then return bit.band(ins, 0xff) end
    end
    error("custom_op: cannot read LuaJIT's bytecode (no probe instruction found)")
  end
  local function probe_name(k) return k == "lutra_bytecode_probe" end
  OPS = {
    GGET = op_of(function() return lutra_bytecode_probe end, probe_name), -- luacheck: ignore
    GSET = op_of(function() lutra_bytecode_probe = 1 end, probe_name), -- luacheck: ignore
    FNEW = op_of(function() return function() end end, function(k) return type(k) == "proto" end),
  }
  return OPS
end

-- The global names the function (or proto) f and the functions inside it read or write:
-- calls on_global(name, "GGET" | "GSET") for each, from its bytecode (jit.util).
local function each_global(f, on_global)
  local jutil, ops = require "jit.util", opcodes()
  local pc = 1
  while true do
    local ins = jutil.funcbc(f, pc)
    if not ins then return end
    local op, d = bit.band(ins, 0xff), bit.rshift(ins, 16)
    if op == ops.GGET then on_global(jutil.funck(f, -d - 1), "GGET") end
    if op == ops.GSET then on_global(jutil.funck(f, -d - 1), "GSET") end
    if op == ops.FNEW then each_global(jutil.funck(f, -d - 1), on_global) end
    pc = pc + 1
  end
end

-- Raises when body has upvalues, naming the first, or uses a global a worker state lacks (or
-- sets one): in one thread it would run here, in several it would not.
function M.check_body(kernel, body)
  local name = debug.getupvalue(body, 1)
  if name then
    raise(string.format("kernel '%s': the cpu body uses the upvalue '%s' (a local of the code around it); bodies run "
      .. "in worker states that cannot see it: pass numbers through params, and require modules (ffi, bit) inside the "
      .. "body", kernel, name))
  end
  each_global(body, function(g, op)
    if op == "GSET" then
      raise(string.format("kernel '%s': the cpu body sets the global '%s'; a body writes only through its pointers",
        kernel, g))
    elseif not WORKER_GLOBALS[g] then
      raise(string.format("kernel '%s': the cpu body reads the global '%s', which the worker states (one per thread) "
        .. "do not have: pass numbers through params; they have the standard libraries without io, os and debug",
        kernel, g))
    end
  end)
end

local ready = false
-- Registers body's bytecode with the worker pool; returns its id.
function M.register(kernel, body, names)
  M.check_body(kernel, body)
  local ok = pcall(function() return C.lt_custom_op_cpu_register end)
  if not ok then raise("kernel '" .. kernel .. "': cpu bodies run inside the lutra executable (its worker states)") end
  if not ready then
    if C.lt_custom_op_cpu_init(package.path) ~= 0 then raise(last_error()) end
    ready = true
  end
  local code = string.dump(body)
  local info = debug.getinfo(body, "S")
  local id = ffi.new("int[1]")
  if C.lt_custom_op_cpu_register(code, #code, info.source, names, id) ~= 0 then raise(last_error()) end
  return id[0]
end

-- Runs the body over rows [0, rows) in nparts parts: here when nparts is 1, else on the workers.
function M.run(k, args, rows, nparts)
  if nparts <= 1 then
    local ok, err = pcall(k.cpu, abi.view(args, k.names), 0, rows)
    if not ok then error(string.format("kernel '%s' (cpu, rows 0..%d): %s", k.name, rows, tostring(err)), 0) end
    return
  end
  if C.lt_custom_op_cpu_run(k.cpu_id, args, rows, nparts) ~= 0 then
    error(string.format("kernel '%s' (cpu, %d threads): %s", k.name, nparts, last_error()), 0)
  end
end

-- How many worker states exist.
function M.workers() return C.lt_custom_op_cpu_workers() end

return M
