-- lutra.cuda — devices, memory, and the streams and events that order GPU work.
--
--   lt.cuda.is_available(), device_count(), status(), synchronize(device)
--   lt.cuda.availability()          "ready", or why not: "not built", "no device" (no GPU or no
--                                   driver here), "broken" (a driver that fails); status() in words
--   lt.cuda.memory_stats(device), reset_peak_memory_stats(device), empty_cache(device)
--   lt.cuda.set_tf32(on), get_tf32()
--   lt.cuda.event()                 an event: ev:record(device, "compute"|"copy"), ev:synchronize(),
--                                   ev:query() (true when done), ev:elapsed(later_event) in ms,
--                                   ev:wait(device, stream) (that stream waits for it)
--   lt.cuda.copy_async(dst, src)    pinned CPU <-> CUDA copy on the copy stream; returns an event
--                                   that marks the copy for the host (nil when the copy was
--                                   synchronous: any other pair of tensors)
--   lt.cuda.stream_synchronize(device, stream)
--   t:pin_memory(), t:is_pinned()   a page-locked copy of a CPU tensor; lt.empty(..., {pin_memory = true})
--
-- Every op runs on its device's compute stream, so ordinary code needs none of this: it is
-- for overlapping copies with compute (prefetching batches, staging checkpoints) and timing.
local lt = require "lutra.ffi"
local ffi, C = lt.ffi, lt.C
local dtype = require "lutra.dtype"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local tensor = require "lutra.tensor"

local fail, raise = errors.fail, errors.raise
local M = {}

M.is_available = function() return C.lt_cuda_device_count() > 0 end
M.device_count = function() return C.lt_cuda_device_count() end
M.status = function() return ffi.string(C.lt_cuda_status()) end
local AVAILABILITY = {[C.LT_CUDA_READY] = "ready", [C.LT_CUDA_NOT_BUILT] = "not built",
                      [C.LT_CUDA_NO_DEVICE] = "no device", [C.LT_CUDA_BROKEN] = "broken"}
M.availability = function() return AVAILABILITY[C.lt_cuda_availability()] end
M.synchronize = function(device)
  if C.lt_cuda_synchronize(dtype.device_id(device, 0)) ~= 0 then fail() end
end
M.memory_stats = function(device) return memory.memory_stats(device or "cuda:0") end
M.reset_peak_memory_stats = function(device) return memory.reset_peak_memory_stats(device or "cuda:0") end
M.empty_cache = function(device) return memory.empty_cache(device or "cuda:0") end
M.set_tf32 = function(on) C.lt_cuda_set_tf32(on and 1 or 0) end -- TF32 tensor cores for f32 matmuls
M.get_tf32 = function() return C.lt_cuda_get_tf32() ~= 0 end

local STREAMS = {compute = C.LT_STREAM_COMPUTE, copy = C.LT_STREAM_COPY}

local function stream_id(op, name)
  local id = STREAMS[name or "compute"]
  if not id then raise(op .. ": stream must be \"compute\" or \"copy\", got " .. tostring(name)) end
  return id
end

local function cuda_device(op, device)
  local id = dtype.device_id(device or "cuda", 0)
  if id < 0 then raise(op .. ": needs a CUDA device, got " .. tostring(device)) end
  return id
end

-- ---- events ----------------------------------------------------------------------------------

local Event = {}
Event.__index = Event

local function wrap_event(ptr)
  return setmetatable({ptr = ffi.gc(ptr, C.lt_cuda_event_destroy)}, Event)
end

function M.event()
  local p = ffi.new("void *[1]")
  if C.lt_cuda_event_create(p) ~= 0 then fail() end
  return wrap_event(p[0])
end

function Event:record(device, stream)
  if C.lt_cuda_event_record(self.ptr, cuda_device("event:record", device), stream_id("event:record", stream)) ~= 0 then
    fail()
  end
  return self
end

function Event:synchronize()
  if C.lt_cuda_event_synchronize(self.ptr) ~= 0 then fail() end
end

function Event:query()
  local r = C.lt_cuda_event_query(self.ptr)
  if r < 0 then fail() end
  return r == 1
end

-- Milliseconds from this event to `later` (both recorded, `later` complete).
function Event:elapsed(later)
  local ms = ffi.new("double[1]")
  if C.lt_cuda_event_elapsed_ms(self.ptr, later.ptr, ms) ~= 0 then fail() end
  return ms[0]
end

function Event:wait(device, stream)
  if C.lt_cuda_stream_wait_event(cuda_device("event:wait", device), stream_id("event:wait", stream), self.ptr) ~= 0 then
    fail()
  end
end

function M.stream_synchronize(device, stream)
  if C.lt_cuda_stream_synchronize(cuda_device("stream_synchronize", device), stream_id("stream_synchronize", stream))
      ~= 0 then
    fail()
  end
end

-- ---- pinned memory and async copies -----------------------------------------------------------

function M.copy_async(dst, src)
  if not tensor.is_tensor(dst) or not tensor.is_tensor(src) then raise("copy_async: expected two tensors") end
  local p = ffi.new("void *[1]")
  if C.lt_copy_async(dst, src, p) ~= 0 then fail() end
  if p[0] == nil then return nil end
  return wrap_event(p[0])
end

function tensor.methods.is_pinned(t) return C.lt_is_pinned(t) ~= 0 end

function tensor.methods.pin_memory(t)
  if t.device ~= "cpu" then raise("pin_memory: only CPU tensors can be pinned, this one is on " .. t.device) end
  if C.lt_is_pinned(t) ~= 0 then return t end
  local out = require("lutra.create").empty(t.shape, {dtype = t.dtype, pin_memory = true})
  out:copy_(t)
  return out
end

return M
