-- lutra.tensor.fields — the one module that reads and writes lt_tensor's C fields, as lutra.ffi names
-- them for Lua (shape_, stride_, dtype_, device_, storage, lua_slot), and that keeps the Lua side's own
-- state of each tensor (autograd's state, the view kind) in Lua arrays indexed by the tensor's registry
-- slot (lutra.memory). Every other module, the tensor type's own helpers included (ops, index, format, create,
-- autograd), goes through these functions; so this module requires only lutra.ffi, and nothing that
-- could require it back.
--
-- Each function is a single field access without allocation or varargs: LuaJIT's JIT inlines them, so
-- the hot paths (ops' checks, autograd's records) cost what the raw field access costs.
local lt = require "lutra.ffi"
local ffi = lt.ffi
local tonumber, cast = tonumber, ffi.cast
local uintptr = ffi.typeof("uintptr_t")
local CPU = lt.DEVICE_CPU

local M = {}

-- Autograd states (autograd_state): no autograd data, a leaf that requires grad, the result of a
-- recorded op (its record lives in lutra.autograd.state under the tensor's registry slot).
M.UNTRACKED, M.LEAF, M.RECORDED = 0, 1, 2
-- View kinds (view_kind): owns or copied its data, made by a view op (shares another tensor's storage),
-- an alias autograd keeps of a saved tensor.
M.NOT_VIEW, M.VIEW, M.SAVED_ALIAS = 0, 1, 2

-- ---- dtype and device ------------------------------------------------------------------------------

-- The lt_dtype id (a number; lutra.dtype names it).
function M.dtype_id(t) return t.dtype_ end
-- The device id: LT_DEVICE_CPU (-1) or a CUDA ordinal k >= 0.
function M.device_id(t) return t.device_ end
-- Whether t lives in host memory.
function M.is_cpu(t) return t.device_ == CPU end
-- Whether t lives on a CUDA device.
function M.is_cuda(t) return t.device_ >= 0 end
-- Whether a and b have the same dtype.
function M.same_dtype(a, b) return a.dtype_ == b.dtype_ end
-- Whether a and b have the same dtype and the same device.
function M.same_kind(a, b) return a.dtype_ == b.dtype_ and a.device_ == b.device_ end

-- ---- geometry --------------------------------------------------------------------------------------

-- The int64_t[LT_MAX_DIMS] array of sizes, to pass to C calls that take (ndim, shape).
function M.dims(t) return t.shape_ end
-- The int64_t[LT_MAX_DIMS] array of strides (in elements), to pass to C calls.
function M.strides(t) return t.stride_ end
-- The size of dim d (0-based, not wrapped) as a Lua number.
function M.size(t, d) return tonumber(t.shape_[d]) end
-- The stride of dim d (0-based, not wrapped) in elements, as a Lua number.
function M.stride(t, d) return tonumber(t.stride_[d]) end

-- The number of elements (1 for a 0-d tensor).
function M.numel(t)
  local n = 1
  for d = 0, t.ndim - 1 do n = n * tonumber(t.shape_[d]) end
  return n
end

-- Whether a and b have the same shape.
function M.same_shape(a, b)
  if a.ndim ~= b.ndim then return false end
  for d = 0, a.ndim - 1 do
    if a.shape_[d] ~= b.shape_[d] then return false end
  end
  return true
end

-- ---- storage ---------------------------------------------------------------------------------------

-- Whether t has no storage: freed (by free() or lutra.tidy), or an `out` not allocated yet.
function M.is_freed(t) return t.storage == nil end
-- Whether a and b share one storage (a view and its base, or two views of one base).
function M.same_storage(a, b) return a.storage == b.storage end
-- A Lua number naming t's storage (its address), to key tables by storage; t must not be freed.
function M.storage_key(t) return tonumber(cast(uintptr, t.storage)) end
-- How many tensors hold t's storage; t must not be freed.
function M.storage_refs(t) return t.storage.refcount end

-- ---- the Lua side's state, under the registry slot ----------------------------------------------
-- lutra.memory gives every tensor it makes a slot (lua_slot, which the C core never reads and keeps
-- in the views it writes): it calls bind() for a new tensor and unbind() when its sweep frees the
-- slot. The state of slot s is autograd_states[s] and view_kinds[s], in byte arrays that this module
-- owns: unlike Lua tables, the GC does not walk them on every cycle (one entry per live tensor; a small
-- model's training loop runs many short cycles), and a read is one byte load. A free slot's state is
-- 0 (no autograd data, not a view), so that bind() stores nothing there; the arrays grow by doubling
-- as the registry does (new bytes are 0), and slot 0 stays 0.
local byte_array = ffi.typeof("uint8_t[?]")
local capacity = 4096
local autograd_states, view_kinds = byte_array(capacity), byte_array(capacity)

local function grow(slot)
  local n = capacity
  while n <= slot do n = n * 2 end
  local states, kinds = byte_array(n), byte_array(n)
  ffi.copy(states, autograd_states, capacity)
  ffi.copy(kinds, view_kinds, capacity)
  autograd_states, view_kinds, capacity = states, kinds, n
end

-- Gives t the free registry slot `slot`.
function M.bind(t, slot)
  if slot >= capacity then grow(slot) end
  t.lua_slot = slot
end

-- Frees the state of a slot whose tensor is gone.
function M.unbind(slot)
  autograd_states[slot] = 0
  view_kinds[slot] = 0
end

-- t's index in lutra.memory's registry.
function M.slot(t) return t.lua_slot end

local function registered_slot(t, what)
  local s = t.lua_slot
  if s == 0 then error("lutra: internal error: " .. what .. " of a tensor lutra.memory did not register", 3) end
  return s
end

-- M.UNTRACKED, M.LEAF or M.RECORDED.
function M.autograd_state(t) return autograd_states[t.lua_slot] end
function M.set_autograd_state(t, state) autograd_states[registered_slot(t, "autograd state")] = state end
-- Whether autograd tracks t (a leaf that requires grad, or a recorded result).
function M.is_tracked(t) return autograd_states[t.lua_slot] ~= 0 end
-- Whether t is the result of a recorded op (it has a grad_fn).
function M.is_recorded(t) return autograd_states[t.lua_slot] == 2 end

-- M.NOT_VIEW, M.VIEW or M.SAVED_ALIAS.
function M.view_kind(t) return view_kinds[t.lua_slot] end
function M.set_view_kind(t, kind) view_kinds[registered_slot(t, "view kind")] = kind end

return M
