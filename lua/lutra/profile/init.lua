-- lutra.profile — a profiler: every op, autograd node, collective, checkpoint save and data batch
-- while it runs, as a table like torch.profiler's key_averages().table() and as a Chrome trace
-- (ui.perfetto.dev or chrome://tracing open it).
--
--   local prof, loss = lt.profile(function() ... return loss end, opts) -- prof, then fn's results
--   print(prof:table{sort_by = "self_ms", top = 20})      -- lutra/profile/report.lua
--   prof:export_chrome_trace("trace.json")  -- several ranks: every rank calls it, rank 0 writes all
--   local p = lt.profile.start(opts) ... p:stop()          -- a span of calls (the trainer's steps)
--   lt.profile.region("my part", fn, ...)  -- a named range of your own (torch's record_function)
-- opts: sync (false: on CUDA tensors, each op is timed by a pair of CUDA events, read at stop,
-- as cuda_ms and a "cuda" track; true: the device is also synchronized after each op, so that
-- its CPU time is its device time), cuda_events (default true), rank (the trace's pid; default
-- the rank in lutra.dist.comm's world).
--
-- Off costs nothing: start() swaps wrappers into the tables that calls look their functions up
-- in (lutra.ops and its parts, the tensor methods, lutra.functional and its op modules, the lutra
-- table, the autograd node classes' backward, lutra.dist.comm's Group and Handle, lutra.ckpt,
-- lutra.data's Loader), and stop() puts the very same functions back, then drops the traces
-- LuaJIT compiled meanwhile (jit.flush) so the code runs as if never profiled. Library code that
-- holds a function in a local (F.linear's gemm) runs unrecorded, inside the op that called it.
-- Only the main Lua thread is recorded: ckpt_async's writer is a C thread, shown as one
-- "ckpt.write" span on a track of its own from the save's own statistics.
--
-- An event: {name, cat ("op", "backward", "comm", "ckpt", "data", "user"), ts, dur (microseconds;
-- ts since the epoch, a clock common to the ranks of a machine), self (dur less its children's),
-- depth, shapes (a list of "[2,3]" strings, inputs then outputs), dtype, device, bytes (read and
-- written), flops (nil where unknown), cuda_ts, cuda_dur (CUDA events)}.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local fields = require "lutra.tensor.fields"
local dtype = require "lutra.dtype"
local cost = require "lutra.profile.cost"
local ffi, C = lt.ffi, lt.C

local M = {}

local Profile = {}
Profile.__index = Profile
M.Profile = Profile

local raise = errors.raise
local select, type, istype = select, type, ffi.istype
local Tensor = ffi.typeof("lt_tensor")
local is_freed, dtype_id, device_id, numel, dims = fields.is_freed, fields.dtype_id, fields.device_id, fields.numel,
  fields.dims
local sizes = dtype.sizes
local C_wall = lt.fn("lt_wall_time")

pcall(ffi.cdef, "struct lt_profile_timespec { long sec; long nsec; }; "
  .. "int clock_gettime(int clk, struct lt_profile_timespec *ts);")

-- Microseconds since the epoch: the monotonic clock, offset once to the real time.
local function epoch_offset_us()
  local ok, us = pcall(function()
    local ts = ffi.new("struct lt_profile_timespec")
    if ffi.C.clock_gettime(0, ts) ~= 0 then error("clock_gettime") end -- CLOCK_REALTIME
    return tonumber(ts.sec) * 1e6 + tonumber(ts.nsec) / 1e3
  end)
  return (ok and us or os.time() * 1e6) - C_wall() * 1e6
end

-- ---- the active profile and the hot path ---------------------------------------------------

local cur -- the active Profile, or nil
local stack, events, offset, sync = {}, {}, 0, false
local function clock() return C_wall() * 1e6 + offset end

-- CUDA events, from a pool; nil where the build has none.
local C_ev_create, C_ev_record = lt.fn("lt_cuda_event_create"), lt.fn("lt_cuda_event_record")
local C_ev_elapsed, C_ev_destroy, C_sync = lt.fn("lt_cuda_event_elapsed_ms"), lt.fn("lt_cuda_event_destroy"),
  lt.fn("lt_cuda_synchronize")
local pool, used = {}, {}
local function cuda_event(dev)
  if not cur.refs[dev] and not cur:cuda_ref(dev) then return nil end
  local e = pool[#pool]
  if e then
    pool[#pool] = nil
  else
    local box = ffi.new("void *[1]")
    if C_ev_create(box) ~= 0 then return nil end
    e = box[0]
  end
  used[#used + 1] = e
  if C_ev_record(e, dev, 0) ~= 0 then return nil end
  return e
end

local function shape_string(t)
  local n = t.ndim
  if n == 0 then return "[]" end
  local d, parts = dims(t), {}
  for i = 0, n - 1 do parts[i + 1] = tostring(tonumber(d[i])) end
  return "[" .. table.concat(parts, ",") .. "]"
end

-- Notes tensor t (an input or a result) on event ev: its shape, bytes, the first dtype and device.
local function note(ev, t)
  if is_freed(t) then return end
  if ev.first_in == nil then ev.first_in = t end
  local shapes = ev.shapes
  shapes[#shapes + 1] = shape_string(t)
  ev.bytes = ev.bytes + numel(t) * sizes[dtype_id(t)]
  if ev.dtype == nil then
    ev.dtype, ev.dev = dtype_id(t), device_id(t)
  end
end

local function note_value(ev, v)
  if type(v) == "cdata" then
    if istype(Tensor, v) then note(ev, v) end
  elseif type(v) == "table" and getmetatable(v) == nil then -- an argument list: F.sdpa{q, k, v}
    for i = 1, 4 do
      local x = v[i]
      if type(x) == "cdata" and istype(Tensor, x) then note(ev, x) end
    end
  end
end

-- The ops that return a view of their input: no bytes of their own (reshape and flatten only when
-- the result shares the input's memory).
local VIEWS = {}
for _, k in ipairs {"view", "reshape", "flatten", "narrow", "select", "transpose", "t", "permute", "expand",
                    "expand_as", "unsqueeze", "squeeze", "split", "chunk", "unbind", "detach", "as_strided",
                    "view_as", "unflatten", "movedim"} do
  VIEWS[k] = true
end

local function enter(name, cat, ...)
  local depth = #stack + 1
  local ev = {name = name, cat = cat, depth = depth, shapes = {}, bytes = 0, child = 0}
  for i = 1, select("#", ...) do note_value(ev, (select(i, ...))) end
  ev.n_in = #ev.shapes
  local rule = cost[name]
  if rule then ev.per_out, ev.flops = rule(...) end
  stack[depth] = ev
  ev.ts = clock()
  if ev.dev ~= nil and ev.dev >= 0 and cur.cuda_events and cat ~= "comm" then ev.e0 = cuda_event(ev.dev) end
  return ev
end

local function leave(ev, ...)
  local dev = ev.dev
  if ev.e0 ~= nil and cur ~= nil then ev.e1 = cuda_event(dev) end
  if sync and dev ~= nil and dev >= 0 then C_sync(dev) end
  local t = clock()
  ev.dur = t - ev.ts
  ev.self = ev.dur - ev.child
  local depth = ev.depth
  for i = #stack, depth, -1 do stack[i] = nil end -- also what an error inside left
  local parent = stack[depth - 1]
  if parent then parent.child = parent.child + ev.dur end
  local out_bytes = ev.bytes
  for i = 1, select("#", ...) do note_value(ev, (select(i, ...))) end
  if ev.per_out then -- flops per element of the first result (matmul: 2K)
    local y = ...
    if type(y) == "cdata" and istype(Tensor, y) and not is_freed(y) then
      ev.flops = (ev.flops or 0) + ev.per_out * numel(y)
    end
  end
  ev.out_bytes = ev.bytes - out_bytes
  if VIEWS[ev.name] then -- a view reads and writes nothing; reshape and flatten may copy
    local y = ...
    local x = ev.first_in
    if ev.name ~= "reshape" and ev.name ~= "flatten" or (x ~= nil and type(y) == "cdata" and istype(Tensor, y)
        and not is_freed(y) and not is_freed(x) and C.lt_data_ptr(y) == C.lt_data_ptr(x)) then
      ev.bytes, ev.out_bytes = 0, 0
    end
  end
  ev.first_in = nil -- an event keeps no tensor
  events[#events + 1] = ev
  if cur ~= nil then
    if ev.cat == "op" then cur:link(ev, ...) elseif ev.cat == "ckpt" then cur:ckpt_note() end
  end
  return ...
end

-- ---- wrappers --------------------------------------------------------------------------------

-- The wrapper of fn named `name`, one per function (an op under several names keeps its first).
local function wrapper(p, name, cat, fn)
  local w = p.wrappers[fn]
  if w then return w end
  w = function(...) return leave(enter(name, cat, ...), fn(...)) end
  p.wrappers[fn] = w
  return w
end

-- A node class's backward(node, grad, ...): the event notes the gradient, and twice the flops of
-- the forward op that recorded the node (Profile:link).
local function node_wrapper(p, name, cat, fn)
  return function(node, g, ...)
    local ev = enter(name, cat, g)
    local f = p.node_flops[node]
    if f then ev.flops = 2 * f end
    return leave(ev, fn(node, g, ...))
  end
end

-- Swaps the wrapper of tbl[key] in (a function), remembering the original.
function Profile:swap(tbl, key, name, cat, make)
  local fn = rawget(tbl, key)
  if type(fn) ~= "function" or self.wrapped_fn[fn] then return end
  local w = (make or wrapper)(self, name or key, cat or "op", fn)
  self.wrapped_fn[w] = true
  self.saved[#self.saved + 1] = {tbl, key, fn}
  rawset(tbl, key, w)
end

local CATS = {backward = "autograd"} -- t:backward(): the engine's pass, the nodes inside

-- Every function of tbl but the names in skip.
function Profile:swap_all(tbl, cat, prefix, skip)
  local keys = {}
  for k, v in pairs(tbl) do
    if type(k) == "string" and type(v) == "function" and not (skip and skip[k]) then keys[#keys + 1] = k end
  end
  table.sort(keys) -- the first name of a function shared by several is the same every run
  for _, k in ipairs(keys) do self:swap(tbl, k, (prefix or "") .. k, CATS[k] or cat) end
end

-- Helpers, accessors and what is no op of its own (the names of a table are skipped there).
local NOT_OPS = {is_tensor = true, before_write = true, binary = true, unary = true, size = true, stride = true,
                 dim = true, numel = true, nelement = true, element_size = true, is_contiguous = true,
                 is_floating_point = true, is_freed = true, data_ptr = true, free = true, autocast = true,
                 rope_table = true, requires_grad_ = true, retain_grad = true, register_hook = true,
                 manual_seed = true, get_rng_state = true, set_rng_state = true, options = true}
local OP_MODULES = {"lutra.ops.elementwise", "lutra.ops.reduce", "lutra.ops.matmul", "lutra.ops", "lutra.create"}

-- Swaps the wrappers into every table of the header's list that is loaded.
function Profile:install()
  local function loaded(name) return package.loaded[name] end
  for _, name in ipairs(OP_MODULES) do
    if type(loaded(name)) == "table" then self:swap_all(loaded(name), "op", nil, NOT_OPS) end
  end
  local tensor = loaded("lutra.tensor")
  if tensor then self:swap_all(tensor.methods, "op", nil, NOT_OPS) end
  for name, mod in pairs(package.loaded) do -- F and its op modules (lutra/functional/<op>.lua)
    if type(mod) == "table" and (name == "lutra.functional" or name:match("^lutra%.functional%.")) then
      self:swap_all(mod, "op", nil, NOT_OPS)
    end
  end
  -- the lutra table's aliases of these functions (lt.matmul, lt.zeros); its lt.exp(x) and the
  -- like call the method, looked up per call
  local lutra = loaded("lutra")
  if type(lutra) == "table" then
    for k, v in pairs(lutra) do
      if type(v) == "function" and self.wrappers[v] then self:swap(lutra, k) end
    end
  end
  local op = loaded("lutra.autograd.op")
  if op then
    for cname, cls in pairs(op.classes) do self:swap(cls, "backward", cname, "backward", node_wrapper) end
  end
  local comm = loaded("lutra.dist.comm")
  if comm then
    self:swap_all(comm.Group, "comm", nil, {split = true, __tostring = true})
    self:swap(comm.Handle, "wait", "comm.wait", "comm")
  end
  local ckpt = loaded("lutra.ckpt")
  if ckpt then
    for _, k in ipairs {"save", "wait", "fence", "load", "save_weights"} do self:swap(ckpt, k, "ckpt." .. k, "ckpt") end
  end
  local optimizer = loaded("lutra.optim.optimizer") -- every optimizer's step (AdamW, Lion, SGD, ...)
  if optimizer then self:swap(optimizer, "step", "optimizer.step", "optim") end
  local data = loaded("lutra.data")
  if data then
    self:swap(data.Loader, "next", "data.next", "data")
    self:swap(data.TokenFile, "batch", "data.batch", "data")
  end
end

-- Puts every original function back, in the reverse order of the swaps.
function Profile:uninstall()
  for i = #self.saved, 1, -1 do
    local s = self.saved[i]
    rawset(s[1], s[2], s[3])
  end
  self.saved = {}
end

-- ---- links: a backward node's flops from its forward op's, the writer thread's span ---------

local record_of = nil -- lutra.autograd.state's record(t), when autograd is loaded

-- Notes the forward op's flops on the node its result carries (the backward costs about twice).
function Profile:link(ev, y)
  if ev.flops and record_of and type(y) == "cdata" and istype(Tensor, y) and not is_freed(y)
      and fields.is_recorded(y) then
    local rec = record_of(y)
    if rec then self.node_flops[rec] = ev.flops end
  end
end

-- ---- start, stop ---------------------------------------------------------------------------

-- Starts profiling (one profile at a time); returns the Profile.
function M.start(opts)
  opts = opts or {}
  if type(opts) ~= "table" then raise("profile: opts must be a table, got " .. type(opts)) end
  for k in pairs(opts) do
    if k ~= "sync" and k ~= "cuda_events" and k ~= "rank" then
      raise("profile: unknown option " .. tostring(k) .. " (sync, cuda_events, rank)")
    end
  end
  if cur then raise("profile: a profile is already running (stop it first)") end
  local S = package.loaded["lutra.autograd.state"]
  record_of = S and S.record or nil
  local comm = package.loaded["lutra.dist.comm"]
  local rank = opts.rank or (comm and comm.initialized() and comm.rank()) or 0
  local p = setmetatable({wrappers = {}, wrapped_fn = {}, saved = {}, node_flops = setmetatable({}, {__mode = "k"}),
                          rank = rank, sync = opts.sync and true or false, cuda_events = opts.cuda_events ~= false,
                          refs = {}, writer = {}}, Profile)
  offset = epoch_offset_us()
  stack, events, sync = {}, {}, p.sync
  pool, used = {}, {}
  p.events = events
  local ok, err = pcall(Profile.install, p)
  if not ok then
    p:uninstall()
    error(err, 0)
  end
  local fmt = package.loaded["lutra.ckpt.format"]
  p.last_save = fmt and fmt.last
  p.t0 = clock()
  cur = p
  return p
end

-- The CUDA events' times: each op's device span, on the clock of the CPU events (device d's
-- reference event recorded right after a synchronize, at a known CPU time).
local function read_cuda(p)
  local devs = {}
  for _, ev in ipairs(p.events) do
    if ev.e0 ~= nil and ev.e1 ~= nil then devs[ev.dev] = true end
  end
  local ms = ffi.new("double[1]")
  for d in pairs(devs) do
    C_sync(d)
  end
  for _, ev in ipairs(p.events) do
    local ref = ev.e0 and p.refs[ev.dev]
    if ref and ev.e1 and C_ev_elapsed(ev.e0, ev.e1, ms) == 0 then
      ev.cuda_dur = ms[0] * 1e3
      if C_ev_elapsed(ref.event, ev.e0, ms) == 0 then ev.cuda_ts = ref.ts + ms[0] * 1e3 end
    end
    ev.e0, ev.e1 = nil, nil
  end
  for _, e in ipairs(used) do C_ev_destroy(e) end
  for _, e in ipairs(pool) do C_ev_destroy(e) end
  pool, used = {}, {}
end

-- Stops profiling and puts every original function back. Returns the Profile.
function Profile:stop()
  if cur ~= self then return self end
  cur = nil
  self:uninstall()
  self.t1 = clock()
  stack = {}
  if jit and jit.flush then jit.flush() end -- traces that called the wrappers go
  read_cuda(self)
  return self
end

-- The profile running now, or nil.
function M.active() return cur end

-- ---- annotations, and the reference event of each CUDA device -----------------------------

-- A named range of its own (cat "user") while profiling: local r = push(name) ... pop(r); nil when
-- no profile runs (pop(nil) does nothing).
function M.push(name, args)
  if not cur then return nil end
  local ev = enter(name, "user")
  ev.args = args
  return ev
end
-- Closes the range push returned (and any left open inside it).
function M.pop(ev)
  if cur and ev then leave(ev) end
end

-- fn(...) as the range `name` when profiling, else just fn(...).
function M.region(name, fn, ...)
  if not cur then return fn(...) end
  return leave(enter(name, "user"), fn(...))
end

-- Device d's reference event: after a synchronize, so that its device time is this CPU time.
-- Returns whether it has one (a device whose events fail is timed on the CPU only).
function Profile:cuda_ref(d)
  if self.refs[d] ~= nil then return self.refs[d] ~= false end
  self.refs[d] = false
  local box = ffi.new("void *[1]")
  if C_sync(d) ~= 0 or C_ev_create(box) ~= 0 then return false end
  used[#used + 1] = box[0]
  if C_ev_record(box[0], d, 0) ~= 0 then return false end
  self.refs[d] = {event = box[0], ts = clock()}
  return true
end

-- After a checkpoint call: a save that finished meanwhile (lutra.ckpt.format's statistics of the
-- last save) shows as a span on the writer's track, ending now.
function Profile:ckpt_note()
  local fmt = package.loaded["lutra.ckpt.format"]
  local last = fmt and fmt.last
  if last and last ~= self.last_save and type(last.seconds) == "number" then
    self.last_save = last
    local dur = last.seconds * 1e6
    events[#events + 1] = {name = "ckpt.write", cat = "ckpt", ts = clock() - dur, dur = dur, self = dur, depth = 1,
                           thread = "ckpt writer", shapes = {}, bytes = tonumber(last.compressed) or 0,
                           args = {dir = last.dir, raw_bytes = tonumber(last.raw)}}
  end
end

-- ---- lt.profile(fn, opts) ----------------------------------------------------------------------

-- Runs fn under a new profile; returns the profile, then fn's results. An error in fn stops the
-- profile (every function back in its place) and goes on.
function M.profile(fn, opts)
  if type(fn) ~= "function" then raise("profile: expected a function, got " .. type(fn)) end
  local p = M.start(opts)
  local function done(ok, ...)
    p:stop()
    if not ok then error((...), 0) end
    return p, ...
  end
  return done(errors.pcall(fn))
end

-- The report's methods: table, key_averages, export_chrome_trace (lutra/profile/report.lua).
local report = require "lutra.profile.report"
for k, f in pairs(report.methods) do Profile[k] = f end
-- a profile still running stops first (its events are final then)
function Profile:export_chrome_trace(path)
  if cur == self then self:stop() end
  return report.methods.export_chrome_trace(self, path)
end
function Profile:table(opts)
  if cur == self then self:stop() end
  return report.methods.table(self, opts)
end

return setmetatable(M, {__call = function(_, fn, opts) return M.profile(fn, opts) end})
