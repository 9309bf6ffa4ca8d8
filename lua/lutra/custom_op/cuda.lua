-- lutra.custom_op.cuda — CUDA bodies: CUDA C source compiled at run time by NVRTC into PTX
-- (host/core/custom_op_cuda.c opens libnvrtc with dlopen), loaded and launched through the driver
-- API. The source gets lutra.custom_op.abi's struct and `scalar_t` (the first tensor's dtype) in
-- front, then `#line 1 "<name>.cu"`, so NVRTC's messages give the body's own lines. It defines
-- extern "C" __global__ void <entry>(lt_kernel_args a), launched with `block` threads a block and
-- enough blocks for one thread a row (or the kernel's grid function).
--
-- PTX is cached by its key (NVRTC's version, the options, which name the architecture and dtype, and the whole
-- source): in memory, and on disk under the cache directory ($LUTRA_CACHE_DIR, else
-- $XDG_CACHE_HOME/lutra, else ~/.cache/lutra; nvrtc/<hash>.ptx), written atomically. A file holds
-- its key before the PTX and is used only when that key is the same text as ours, so a hash
-- collision or a stale file is compiled again, never run.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local atomic_file = require "lutra.atomic_file"
local files = require "lutra.ckpt.files"
local abi = require "lutra.custom_op.abi"
local ffi, C = lt.ffi, lt.C
local raise = errors.raise

local M = {}

local DTYPES = {[0] = "float", "double"}
M.DEFAULT_ARCH = 80 -- the architecture compiled for when no GPU says which

local function last_error() return ffi.string(C.lt_last_error()) end

-- FNV-1a, 64 bits, as 16 hex digits: names the cache file (the key inside is what is trusted).
local function hash(s)
  local h = 0xcbf29ce484222325ULL
  for i = 1, #s do h = bit.bxor(h, s:byte(i)) * 0x100000001b3ULL end
  return bit.tohex(h, 16)
end
M.hash = hash

function M.cache_dir()
  local dir = os.getenv("LUTRA_CACHE_DIR")
  if dir and dir ~= "" then return dir end
  local xdg = os.getenv("XDG_CACHE_HOME")
  if xdg and xdg ~= "" then return xdg .. "/lutra" end
  return (os.getenv("HOME") or "/tmp") .. "/.cache/lutra"
end

local MAGIC = "// lutra nvrtc cache 1\n"
local memory = {} -- key -> PTX
M.stats = {compiled = 0, from_memory = 0, from_disk = 0}

-- Forgets the PTX held in memory (the disk cache stays): what a new process starts with.
function M.clear_memory_cache() memory = {} end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- NVRTC's version as "13.0", or nil and why it cannot be loaded.
function M.nvrtc_version()
  local v = ffi.new("int[2]")
  if C.lt_rtc_version(v, v + 1) ~= 0 then return nil, last_error() end
  return v[0] .. "." .. v[1]
end

-- The PTX of kernel k for dtype id dt on architecture arch (e.g. 80), compiled or cached.
function M.ptx(k, dt, arch)
  if not DTYPES[dt] then raise(string.format("kernel '%s': cuda bodies take f32 or f64 tensors", k.name)) end
  local version, why = M.nvrtc_version()
  if not version then raise(string.format("kernel '%s': %s", k.name, why)) end
  local file = k.name .. ".cu"
  local options = table.concat({"--gpu-architecture=compute_" .. arch, "-DLT_SCALAR=" .. DTYPES[dt],
                                "--std=c++17"}, "\n")
  local source = abi.CUDA_PRELUDE .. '#line 1 "' .. file .. '"\n' .. k.cuda
  local key = "nvrtc " .. version .. "\n" .. options .. "\0" .. source
  local ptx = memory[key]
  if ptx then
    M.stats.from_memory = M.stats.from_memory + 1
    return ptx
  end
  local dir = M.cache_dir() .. "/nvrtc"
  local path = dir .. "/" .. hash(key) .. ".ptx"
  local header = MAGIC .. #key .. "\n" .. key .. "\n"
  local cached = read_file(path)
  if cached and cached:sub(1, #header) == header then
    ptx = cached:sub(#header + 1)
    M.stats.from_disk = M.stats.from_disk + 1
  else
    local out, log = ffi.new("char *[1]"), ffi.new("char *[1]")
    local status = C.lt_rtc_compile(source, file, options, out, log)
    local log_text = log[0] ~= nil and ffi.string(log[0]) or ""
    C.lt_rtc_free(log[0])
    if status ~= 0 then
      local msg = last_error()
      raise(string.format("kernel '%s': %s\n%s", k.name, msg, log_text)) -- "<name>.cu(LINE): error: ..."
    end
    ptx = ffi.string(out[0])
    C.lt_rtc_free(out[0])
    M.stats.compiled = M.stats.compiled + 1
    local ok = pcall(files.mkdir_p, dir)
    if ok then atomic_file.write(path, header .. ptx) end -- a cache that cannot be written is only slower
  end
  memory[key] = ptx
  return ptx
end

local functions = {} -- PTX .. device -> CUfunction

-- The loaded kernel of k for dtype dt on a device: compiled for that device's architecture.
function M.load(k, dt, device)
  local arch = ffi.new("int[1]")
  if C.lt_rtc_device_arch(device, arch) ~= 0 then raise(string.format("kernel '%s': %s", k.name, last_error())) end
  local ptx = M.ptx(k, dt, arch[0])
  local key = ptx .. "\0" .. device
  local fn = functions[key]
  if fn then return fn end
  local out = ffi.new("void *[1]")
  if C.lt_rtc_module_load(ptx, k.entry, device, out) ~= 0 then
    raise(string.format("kernel '%s': %s", k.name, last_error()))
  end
  functions[key] = out[0]
  return out[0]
end

-- Queues kernel k on device's compute stream over `rows` rows with the argument block args.
function M.launch(k, args, dt, device, rows)
  local fn = M.load(k, dt, device)
  local grid, block = ffi.new("uint32_t[3]", 1, 1, 1), ffi.new("uint32_t[3]", k.block, 1, 1)
  if k.grid then
    local gx, gy, gz = k.grid(rows, k.block)
    grid[0], grid[1], grid[2] = gx, gy or 1, gz or 1
  else
    grid[0] = math.max(1, math.ceil(rows / k.block))
  end
  if C.lt_rtc_launch(fn, device, grid, block, 0, args, ffi.sizeof(args)) ~= 0 then
    raise(string.format("kernel '%s' (cuda:%d): %s", k.name, device, last_error()))
  end
end

return M
