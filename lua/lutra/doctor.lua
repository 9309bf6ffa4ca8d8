-- lutra.doctor — `lutra doctor`: what this build is and what it will run on.
-- Reads the C API through the FFI directly, so it works even when the Lua library
-- (require "lutra") does not load; that failure is reported as one of the checks.
local ffi = require "ffi"

local M = {}

local NEEDED = {
  lt_version = "const char *lt_version(void);",
  lt_build_info = "const char *lt_build_info(void);",
  lt_get_num_threads = "int lt_get_num_threads(void);",
  lt_cuda_device_count = "int lt_cuda_device_count(void);",
  lt_cuda_status = "const char *lt_cuda_status(void);",
}

-- ffi.C when the symbols are in the process (the lutra executable), else liblutra.
local function c_api()
  for name, decl in pairs(NEEDED) do
    if not pcall(function() return ffi.C[name] end) then pcall(ffi.cdef, decl) end
  end
  if pcall(function() return ffi.C.lt_version end) then return ffi.C end
  local ok, lib = pcall(ffi.load, "lutra")
  if ok then return lib end
  return nil, tostring(lib)
end

-- "key: value" lines of lt_build_info() as a table.
local function parse_build_info(text)
  local info = {}
  for line in text:gmatch("[^\n]+") do
    local k, v = line:match("^(%w+):%s*(.*)$")
    if k then info[k] = v end
  end
  return info
end

function M.report()
  local lines = {}
  local function add(key, value) lines[#lines + 1] = string.format("%-14s %s", key .. ":", value) end
  local lt_ok, lt_err = pcall(require, "lutra")
  local C, load_err = c_api()
  if not C then
    add("lutra", "C API not found (" .. load_err .. ")")
    return table.concat(lines, "\n"), false
  end
  local info = parse_build_info(ffi.string(C.lt_build_info()))
  add("lutra", ffi.string(C.lt_version()))
  add("luajit", string.format("%s (GC64 %s, JIT %s)", jit.version, ffi.abi("gc64") and "on" or "off",
                              jit.status() and "on" or "off"))
  local lt_status = lt_ok and "ok" or "FAILED: " .. tostring(lt_err):match("^[^\n]*")
  add("lua library", "require \"lutra\" " .. lt_status)
  add("compiler", info.compiler or "?")
  add("blas", info.blas or "?")
  local threads = C.lt_get_num_threads()
  add("openmp", (info.openmp or "?") .. string.format("; %d threads (OMP_NUM_THREADS=%s)", threads,
                                                     os.getenv("OMP_NUM_THREADS") or "unset"))
  local ndev = C.lt_cuda_device_count()
  add("cuda build", info.cuda or "?")
  add("cuda devices", string.format("%d (%s)", ndev, ffi.string(C.lt_cuda_status())))
  add("nccl", info.nccl or "?")
  add("mpi", info.mpi or "?")
  if ndev > 0 then
    add("will use", string.format("cuda:0 (%d GPU%s)", ndev, ndev > 1 and "s" or ""))
  else
    add("will use", string.format("cpu (%d threads)", threads))
  end
  return table.concat(lines, "\n"), true
end

function M.main()
  local text, ok = M.report()
  io.stdout:write(text, "\n")
  io.stdout:flush()
  if not ok then os.exit(1) end
end

return M
