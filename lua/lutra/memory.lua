-- lutra.memory — where every tensor is born, and how its memory comes back.
--
-- The Lua GC sees a tensor as a few bytes of cdata, not as the megabytes its
-- storage holds, so waiting for the GC alone lets memory pile up (Torch7's old
-- lesson). Three tools return it deterministically:
--   t:free()            drops t's storage now; later use of t is an error
--                       "tensor was freed" (views of t keep their storage).
--   lutra.tidy(fn, ...) runs fn and frees the storage of every tensor created
--                       inside it, except those it returns (directly or inside
--                       plain tables) and those passed to lutra.keep(). Scopes
--                       nest: what an inner scope returns belongs to the outer
--                       one. Tensors created inside are held until the scope
--                       ends, so wrap one step, not a whole training loop.
--   GC pressure         new() reads the C allocation counter (a plain memory
--                       load): past max(256 MiB, bytes live after the last
--                       collection) it runs a full collectgarbage(), which
--                       releases the unreachable tensors.
--
-- How unreachable tensors are released: not with one ffi.gc finalizer per tensor
-- (LuaJIT calls each C finalizer through the interpreter: ~0.3 us per tensor, as
-- much as a small op), but through a registry. new() appends the C pointer (as a
-- number) to a plain list and the tensor to a parallel weak-valued list; once per
-- GC cycle a sentinel's finalizer walks the lists and lt_release()s the pointers
-- whose tensor the GC cleared. Weak values are cleared after everything that
-- finalizers can still reach is marked, so a tensor is released only when no Lua
-- code can see it any more. A full collectgarbage() runs the sweep before it
-- returns, as finalizers did.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local dtype = require "lutra.dtype"
local fields = require "lutra.tensor.fields"
local bind_slot, unbind_slot = fields.bind, fields.unbind
local ffi, C = lt.ffi, lt.C

local M = {}

local C_new, C_release, C_free_storage = C.lt_tensor_new, C.lt_release, C.lt_free_storage
local collectgarbage, max, tonumber, type = collectgarbage, math.max, tonumber, type

-- A tensor is a few bytes to the GC but stands for C memory (its struct, storage and
-- data) that comes back only when a GC cycle finds it unreachable. The default pace
-- (a cycle once the Lua heap doubled) lets tens of thousands of small tensors die
-- between cycles, and malloc handles the resulting batch of frees badly (a tiny add took
-- 1.9 us instead of 0.6). Shorter cycles keep the batches small; the Lua heap of a
-- training script is small, so their cost is too. Scripts may set their own pace.
collectgarbage("setpause", 130)
collectgarbage("setstepmul", 400)

local MIN_THRESHOLD = 256 * 1024 * 1024
local cpu_counters = C.lt_memory_cpu_counters()
local cpu_threshold = MIN_THRESHOLD

-- CUDA counters are read through a call, only once a CUDA tensor was made.
local cuda_count = C.lt_cuda_device_count()
local cuda_active = false
local cuda_thresholds = {}
local cuda_stats = ffi.new("lt_memory_stats")

local scope = nil -- the innermost tidy scope: a list of the tensors created in it
local scope_n = 0

local function collect()
  collectgarbage()
  C.lt_memory_collected(-1)
  cpu_threshold = max(MIN_THRESHOLD, tonumber(cpu_counters.allocated))
  for d = 0, cuda_count - 1 do
    C.lt_memory_collected(d)
    C.lt_memory_get_stats(d, cuda_stats)
    cuda_thresholds[d] = max(MIN_THRESHOLD, tonumber(cuda_stats.allocated))
  end
end
M.collect = collect

local function cuda_pressure()
  for d = 0, cuda_count - 1 do
    C.lt_memory_get_stats(d, cuda_stats)
    if cuda_stats.since_collect > (cuda_thresholds[d] or MIN_THRESHOLD) then return collect() end
  end
end

-- Marks that CUDA tensors exist, so that new() also watches the GPU counters.
function M.note_cuda()
  cuda_active = cuda_count > 0
end

-- ---- the registry of live tensors ------------------------------------------------------
-- Slot i holds one live tensor: addresses[i] its lt_tensor * (a number), tensors[i] the
-- tensor itself in a weak-valued list, records[i] autograd's record of it. A tensor keeps
-- its slot for life (its lua_slot); the sweep releases the C tensors of the slots whose tensor
-- the GC cleared and puts those slots on a free list. GC steps (and so the sweep, a
-- finalizer) only run where Lua allocates, which new() does before it touches the lists.

local tensor_ptr = ffi.typeof("lt_tensor *")
local uintptr = ffi.typeof("uintptr_t")
local cast = ffi.cast
local addresses = {}
local tensors = setmetatable({}, {__mode = "v"})
local records = {}
local free_slots = {}
-- The registry's counters are fields of a table, not upvalues: LuaJIT keeps an upvalue in a
-- register across a compiled loop only while no store to an upvalue of another function may
-- alias it, and upvalues of different functions alias by a hash of where their functions happen
-- to be loaded; a store here then made every op reload its upvalues (a tiny op's cost moved by
-- 15% with unrelated code). Table fields with distinct names never alias upvalues.
local counts = {nfree = 0, top = 0, until_sweep = 0}
M.records = records

-- Releases the C tensors whose Lua tensor is gone; their slots become free.
local function sweep()
  for i = 1, counts.top do
    local a = addresses[i]
    if a ~= nil and tensors[i] == nil then
      addresses[i] = nil
      records[i] = nil
      unbind_slot(i)
      local nfree = counts.nfree + 1
      counts.nfree = nfree
      free_slots[nfree] = i
      C_release(cast(tensor_ptr, a))
    end
  end
end
M.sweep = sweep

-- A userdata whose finalizer sweeps, then arms the next one: one sweep per GC cycle.
local function arm_sweeper()
  local sentinel = newproxy(true)
  getmetatable(sentinel).__gc = function()
    sweep()
    arm_sweeper()
  end
end
arm_sweeper()

-- Registers tensor t (= p[0]) in a slot.
local function register(p, t)
  local address = tonumber(cast(uintptr, p)) -- may allocate (and so run the sweep): before the lists change
  local slot
  local nfree = counts.nfree
  if nfree > 0 then
    slot = free_slots[nfree]
    free_slots[nfree] = nil
    counts.nfree = nfree - 1
  else
    slot = counts.top + 1
    counts.top = slot
  end
  tensors[slot] = t
  addresses[slot] = address
  bind_slot(t, slot)
  return t
end

-- Set by autograd while backward runs: every tensor made then is recorded in it.
local owner = nil
function M.set_owner(tbl)
  local previous = owner
  owner = tbl
  return previous
end

-- A new undefined tensor (an op's `out`), released once the GC finds it unreachable.
-- Every 65536 tensors new() also sweeps itself: the finalizer's sweep then runs the
-- compiled trace of the loop (LuaJIT does not compile code while the GC runs it, and
-- interpreted, the sweep cost three times as much).
local function new()
  local until_sweep = counts.until_sweep - 1
  counts.until_sweep = until_sweep
  if until_sweep <= 0 then
    counts.until_sweep = 65536
    sweep()
  end
  if cpu_counters.since_collect > cpu_threshold then collect() end
  if cuda_active then cuda_pressure() end
  local p = C_new()
  if p == nil then errors.fail() end
  local t = register(p, p[0])
  if scope then
    scope_n = scope_n + 1
    scope[scope_n] = t
  end
  if owner then owner[t] = true end
  return t
end
M.new = new

-- Takes a tensor made elsewhere (lt_tensor_new(), not yet owned by Lua) under the registry.
function M.adopt(p)
  return register(p, p[0])
end

-- ---- free / tidy / keep ------------------------------------------------------------

function M.free(t)
  C_free_storage(t)
end

local kept = setmetatable({}, {__mode = "k"})

-- Excludes tensors from the enclosing tidy scopes; returns its arguments.
function M.keep(...)
  for i = 1, select("#", ...) do
    local t = select(i, ...)
    if type(t) == "cdata" then kept[t] = true end
  end
  return ...
end

local Tensor = ffi.typeof("lt_tensor")
local istype = ffi.istype

-- Collects the tensors in a returned value (plain tables searched recursively).
local function mark_returned(v, marks, seen)
  if type(v) == "cdata" then
    if istype(Tensor, v) then marks[v] = true end
  elseif type(v) == "table" and not seen[v] then
    seen[v] = true
    for k, x in pairs(v) do
      mark_returned(k, marks, seen)
      mark_returned(x, marks, seen)
    end
  end
end

function M.tidy(fn, ...)
  if type(fn) ~= "function" and not (type(fn) == "table" and getmetatable(fn) and getmetatable(fn).__call) then
    errors.raise("tidy: expected a function, got " .. type(fn))
  end
  local parent, parent_n = scope, scope_n
  local mine = {}
  scope, scope_n = mine, 0
  local res = {errors.pcall(fn, ...)}
  local n_mine = scope_n
  scope, scope_n = parent, parent_n
  local marks = {}
  if res[1] then
    local seen = {}
    for i = 2, table.maxn(res) do mark_returned(res[i], marks, seen) end
  end
  for i = 1, n_mine do
    local t = mine[i]
    if marks[t] or kept[t] then
      if scope and not kept[t] then -- returned tensors belong to the enclosing scope
        scope_n = scope_n + 1
        scope[scope_n] = t
      end
    else
      C_free_storage(t)
    end
  end
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

-- ---- statistics ------------------------------------------------------------------

local stats = ffi.new("lt_memory_stats")

-- memory_stats(device) -> {allocated =, peak =, reserved =, num_allocs =, num_frees =, ...} in bytes
-- and counts, for the CPU (default) or a CUDA device ("cuda", "cuda:1", or its index).
function M.memory_stats(device)
  local d = dtype.device_id(device, dtype.CPU)
  if C.lt_memory_get_stats(d, stats) ~= 0 then errors.fail() end
  return {
    allocated = tonumber(stats.allocated),
    peak = tonumber(stats.peak),
    reserved = tonumber(stats.reserved),
    num_allocs = tonumber(stats.num_allocs),
    num_frees = tonumber(stats.num_frees),
    -- a CUDA device's caching allocator (0 on the CPU)
    peak_reserved = tonumber(stats.peak_reserved),
    cache_hits = tonumber(stats.cache_hits),
    num_segments = tonumber(stats.num_segments),
    segment_allocs = tonumber(stats.segment_allocs),
    segment_frees = tonumber(stats.segment_frees),
    num_ooms = tonumber(stats.num_ooms),
  }
end

-- Starts the device's peak (memory_stats().peak) again from what is allocated now.
function M.reset_peak_memory_stats(device)
  if C.lt_memory_reset_peak(dtype.device_id(device, dtype.CPU)) ~= 0 then errors.fail() end
end

-- Collects unreachable tensors, then returns cached blocks to the system.
function M.empty_cache(device)
  collect()
  if C.lt_memory_empty_cache(dtype.device_id(device, dtype.CPU)) ~= 0 then errors.fail() end
end

return M
