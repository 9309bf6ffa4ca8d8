-- lutra.ffi — loads the C API (host/include/lutra.h) into the LuaJIT FFI.
--
-- Inside the `lutra` executable the API symbols are exported by the process, so
-- ffi.C resolves them. Under plain luajit the shared library is loaded from
-- $LUTRA_LIB (a path to liblutra.so) or from the system's library path.
--
-- The lt_tensor struct is declared with four fields renamed (shape_, stride_,
-- dtype_, device_): a struct's own fields take precedence over its metatype's
-- __index, and the tensor metatype gives t.shape, t.dtype and t.device their
-- PyTorch meaning (a Lua list, "f32", "cpu") and t:stride(d) its method. The layout
-- is unchanged, so the C functions see exactly the header's struct. Only
-- lutra.tensor.fields reads these fields, and the Lua-side state of a tensor
-- (autograd's, its view kind) lives there, under the tensor's lua_slot.
local ffi = require "ffi"

local M = {ffi = ffi}

-- LuaJIT's machine-code budget. The library's ops, autograd and a model's training step compile to
-- more than the default 512 KB: past it LuaJIT flushes every trace and records them all again (a
-- 2-layer GPT's step then ran 10-15% slower, with twice the traces). Areas are taken 64 KB at a time
-- as traces need them, so a larger limit costs nothing until it is used; scripts may set their own.
if jit and jit.opt then jit.opt.start("maxmcode=65536", "maxtrace=8000") end

-- Declares the one entry point that returns the rest of the API text.
pcall(ffi.cdef, "const char *lt_api_cdef(void);")

local lib
if pcall(function() return ffi.C.lt_api_cdef end) then
  lib = ffi.C -- inside the lutra executable
else
  local name = os.getenv("LUTRA_LIB") or "lutra"
  local ok, loaded = pcall(ffi.load, name)
  if not ok then
    error(string.format("lutra: cannot load the C library '%s' (%s); set LUTRA_LIB=/path/to/liblutra.so "
      .. "or run the script with the `lutra` executable", name, tostring(loaded)), 0)
  end
  lib = loaded
end
M.C = lib

-- Renames fields inside the lt_tensor struct only (lt_storage keeps its `device`).
local function lua_view_of_api(text)
  local renamed = {shape = "shape_", stride = "stride_", dtype = "dtype_", device = "device_"}
  return (text:gsub("(typedef struct lt_tensor%s*{)(.-)(}%s*lt_tensor%s*;)", function(head, body, tail)
    body = body:gsub("(%s)([%a_][%w_]*)(%s*[%[;])", function(space, field, rest)
      return space .. (renamed[field] or field) .. rest
    end)
    return head .. body .. tail
  end))
end

local already = pcall(ffi.typeof, "lt_tensor")
if already then
  -- Someone declared the API before us: accept it only if it is our view of it.
  if not pcall(ffi.offsetof, "lt_tensor", "shape_") or ffi.offsetof("lt_tensor", "shape_") == nil then
    error("lutra: lt_tensor was declared with ffi.cdef before require 'lutra'; "
      .. "require 'lutra' first and use require('lutra.ffi').C for the C API", 0)
  end
else
  ffi.cdef(lua_view_of_api(ffi.string(lib.lt_api_cdef())))
end

-- The C function `name`, or (while a part of the API is not built yet) a function
-- that raises a clear error when called; for hot paths that keep C functions in locals.
function M.fn(name)
  local ok, f = pcall(function() return lib[name] end)
  if ok then return f end
  return function() error("lutra: " .. name .. " is not available in this build of the C library", 2) end
end

-- Enum values, read from the header so that Lua and C never disagree.
M.DEVICE_CPU = lib.LT_DEVICE_CPU
M.MAX_DIMS = lib.LT_MAX_DIMS

return M
