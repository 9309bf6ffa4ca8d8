-- lutra.custom_op.abi — the argument block every kernel body receives, on both devices: each
-- tensor's address, sizes and strides (in elements), the numbers the call passes (params) and
-- the rows the call covers. The CPU side declares it for the FFI; the CUDA side prepends the
-- same struct, spelt in CUDA C (CUDA_PRELUDE), to the body's source and passes the block by
-- value as the kernel's one parameter. This module needs only the ffi library: worker states
-- (host/app/custom_op_cpu.c) load it, which know nothing else of lutra.
local ffi = require "ffi"

local M = {}

M.MAX_TENSORS, M.MAX_DIMS, M.MAX_PARAMS = 8, 8, 16

M.CDEF = [[
typedef struct lt_kernel_tensor {
  uint64_t data;          /* address of element [0, ..., 0] */
  int64_t size[8];
  int64_t stride[8];      /* in elements */
  int32_t ndim, dtype;    /* dtype: lutra's id (0 f32, 1 f64, 2 bf16, 3 f16, 4 i32, 5 i64, 6 u8, 7 bool) */
} lt_kernel_tensor;
typedef struct lt_kernel_args {
  lt_kernel_tensor t[8];
  double p[16];           /* the params, in the order the kernel declares them */
  int64_t rows;
  int32_t ntensors, nparams;
} lt_kernel_args;
]]

-- The same layout for NVRTC (no <stdint.h> there): long long is int64_t, int is int32_t.
M.CUDA_PRELUDE = [[
typedef struct lt_kernel_tensor {
  char *data;
  long long size[8];
  long long stride[8];
  int ndim, dtype;
} lt_kernel_tensor;
typedef struct lt_kernel_args {
  lt_kernel_tensor t[8];
  double p[16];
  long long rows;
  int ntensors, nparams;
} lt_kernel_args;
typedef LT_SCALAR scalar_t;
]]

pcall(ffi.cdef, M.CDEF)
local args_ptr = ffi.typeof("const lt_kernel_args *")
M.args_type = ffi.typeof("lt_kernel_args")

-- Pointer types by dtype id (bf16 and f16 as their raw 16 bits).
local PTR = {[0] = ffi.typeof("float *"), ffi.typeof("double *"), ffi.typeof("uint16_t *"), ffi.typeof("uint16_t *"),
             ffi.typeof("int32_t *"), ffi.typeof("int64_t *"), ffi.typeof("uint8_t *"), ffi.typeof("uint8_t *")}

-- "y,x,b|alpha,beta" -> {"y", "x", "b"}, {"alpha", "beta"} (remembered per string).
local parsed = {}
local function names_of(names)
  local n = parsed[names]
  if n then return n end
  local tensors, params = names:match("^([^|]*)|?(.*)$")
  n = {tensors = {}, params = {}}
  for s in tensors:gmatch("[^,]+") do n.tensors[#n.tensors + 1] = s end
  for s in params:gmatch("[^,]+") do n.params[#n.params + 1] = s end
  parsed[names] = n
  return n
end
M.names_of = names_of

-- The table a body gets from an argument block: a[name] is the tensor's typed pointer,
-- a.shape[name] and a.stride[name] Lua lists (1-based, as t.shape), a[param] the number,
-- a.rows the call's rows.
function M.view(ptr, names)
  local args = ffi.cast(args_ptr, ptr)
  local n = names_of(names)
  local a = {rows = tonumber(args.rows), shape = {}, stride = {}}
  for i, name in ipairs(n.tensors) do
    local t = args.t[i - 1]
    a[name] = ffi.cast(PTR[t.dtype], t.data)
    local size, stride = {}, {}
    for d = 1, t.ndim do
      size[d], stride[d] = tonumber(t.size[d - 1]), tonumber(t.stride[d - 1])
    end
    a.shape[name], a.stride[name] = size, stride
  end
  for j, name in ipairs(n.params) do a[name] = args.p[j - 1] end
  return a
end

return M
