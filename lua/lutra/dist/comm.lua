-- lutra.dist.comm — process groups and collectives on tensors (over host/dist_*.c).
--
--   local comm = require "lutra.dist.comm"
--   local world = comm.init()            -- MPI under mpirun/srun, else a singleton
--   world:all_reduce(t, "avg")           -- in place, blocking
--   local h = world:all_gather(out, inp, {async = true}); ...; h:wait()
--   local recv = world:all_to_all_counts(send)      -- rows each rank sends me, {n1, n2, ...}
--   local out = world:all_to_all(nil, inp, send, recv) -- send[j] rows of inp to rank j
--
-- CPU tensors travel through MPI, CUDA tensors through NCCL. Inputs of every rank are
-- of one dtype; a non-contiguous tensor is copied into a contiguous buffer (and an
-- output copied back when the call completes). Every call is recorded in the flight
-- recorder (comm.recent) and watched by the watchdog (comm.set_timeout, comm.hold).
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local fields = require "lutra.tensor.fields"
local ffi, C = lt.ffi, lt.C

local raise, fail = errors.raise, errors.fail
local Tensor = ffi.typeof("lt_tensor")

local M = {}

local OPS = {sum = C.LT_COMM_SUM, avg = C.LT_COMM_AVG, max = C.LT_COMM_MAX, min = C.LT_COMM_MIN}
local DTYPE_NAMES = {[0] = "f32", "f64", "bf16", "f16", "i32", "i64", "u8", "bool"}

local function check(rc) if rc ~= 0 then fail() end end

local function tensor_arg(op, t, what)
  if type(t) ~= "cdata" or not ffi.istype(Tensor, t) then
    raise(string.format("%s: %s must be a tensor, got %s", op, what, type(t)))
  end
  errors.check_alive(t, op)
  return t
end

-- ---- groups --------------------------------------------------------------------------

local Group = {}
Group.__index = Group
M.Group = Group

local function wrap_group(p)
  local size = C.lt_comm_group_size(p)
  local ranks_c = ffi.new("int[?]", size)
  check(C.lt_comm_group_ranks(p, ranks_c))
  local ranks = {}
  for i = 0, size - 1 do ranks[i + 1] = ranks_c[i] end
  return setmetatable({
    name = ffi.string(C.lt_comm_group_name(p)), size = size, rank = C.lt_comm_group_rank(p), ranks = ranks, ptr = p,
  }, Group)
end

function Group.__tostring(g)
  return string.format("Group(%s, rank %d of %d, world ranks {%s})", g.name, g.rank, g.size, table.concat(g.ranks, ","))
end

local world

function M.init()
  if world then return world end
  check(C.lt_comm_init())
  local p = ffi.new("lt_group *[1]")
  check(C.lt_comm_world(p))
  world = wrap_group(p[0])
  rawset(M, "world", world)
  return world
end

function M.initialized() return C.lt_comm_initialized() ~= 0 end
function M.rank() M.init() return C.lt_comm_rank() end
function M.size() M.init() return C.lt_comm_size() end
function M.local_rank() M.init() return C.lt_comm_local_rank() end
function M.uses_mpi() M.init() return C.lt_comm_uses_mpi() ~= 0 end

-- Collective over `parent` (default the world): ranks with the same color form a group,
-- ordered by key (default: their rank). Returns nil where color < 0.
function M.split(color, key, name, parent)
  local w = M.init()
  parent = parent or w
  errors.int_arg("comm.split", color, "color")
  key = errors.int_arg("comm.split", key, "key", true) or parent.rank
  if name ~= nil and type(name) ~= "string" then raise("comm.split: name must be a string, got " .. type(name)) end
  local p = ffi.new("lt_group *[1]")
  check(C.lt_comm_split(p, parent.ptr, color, key, name or ("split" .. tostring(color))))
  if p[0] == nil then return nil end
  return wrap_group(p[0])
end
function Group.split(g, color, key, name) return M.split(color, key, name, g) end

-- ---- watchdog, debug mode, flight recorder --------------------------------------------

function M.set_timeout(seconds)
  if type(seconds) ~= "number" then raise("comm.set_timeout: seconds must be a number, got " .. type(seconds)) end
  check(C.lt_comm_set_timeout(seconds))
end
function M.timeout() return C.lt_comm_timeout() end

-- Runs fn(...) with this rank's watchdog off and the hold file present (env LUTRA_HOLD_FILE,
-- else one per job in /tmp), so that the other ranks' watchdogs wait too instead of ending
-- the job; returns fn's results, rethrows its error.
function M.hold(fn, ...)
  if type(fn) ~= "function" then raise("comm.hold: fn must be a function, got " .. type(fn)) end
  check(C.lt_comm_hold(1))
  local function finish(ok, ...)
    C.lt_comm_hold(0)
    if not ok then error((...), 0) end
    return ...
  end
  return finish(errors.pcall(fn, ...))
end

-- Lets MPI advance posted (async) calls; call it between pieces of compute to overlap.
function M.progress() C.lt_comm_progress() end

-- Seconds this process has spent blocked in collectives and waits (lt_comm_blocked_seconds): the
-- trainer's comm_wait_ms; the rank that waits least is the one the others wait for.
local blocked_box = ffi.new("double[1]")
function M.blocked_seconds()
  check(C.lt_comm_blocked_seconds(blocked_box))
  return blocked_box[0]
end

function M.set_debug(on) check(C.lt_comm_set_debug(on and 1 or 0)) end
function M.debug() return C.lt_comm_debug() ~= 0 end

local STATES = {[0] = "posted", "waiting", "done", "failed"}

-- The last n (default 16) calls of this rank, oldest first.
function M.recent(n)
  n = n or 16
  errors.int_arg("comm.recent", n, "n")
  local buf = ffi.new("lt_comm_record[?]", math.max(n, 1))
  local count = ffi.new("int[1]")
  check(C.lt_comm_recent(n, buf, count))
  local list = {}
  for i = 0, count[0] - 1 do
    local r = buf[i]
    list[#list + 1] = {
      seq = tonumber(r.seq), op = ffi.string(r.op), group = ffi.string(r.group), dtype = DTYPE_NAMES[r.dtype],
      count = tonumber(r.count), shape = ffi.string(r.shape), state = STATES[r.state], peer = r.peer >= 0 and r.peer or nil,
      start = r.start, seconds = r["end"] > 0 and r["end"] - r.start or nil,
    }
  end
  return list
end

-- In debug mode the fingerprint carries the user's file:line.
local prefix = errors.library_prefix
local function note_callsite()
  local level = 3
  while true do
    local info = debug.getinfo(level, "Sl")
    if not info then return end
    if info.what ~= "C" and info.source:sub(1, #prefix) ~= prefix then
      C.lt_comm_set_callsite(info.short_src .. ":" .. tostring(info.currentline))
      return
    end
    level = level + 1
  end
end

-- ---- handles ---------------------------------------------------------------------------

local Handle = {}
Handle.__index = Handle
M.Handle = Handle

-- Waits for the call; copies results back into non-contiguous outputs; returns the output.
-- Every handle must be waited for (a dropped one leaves its MPI request pending).
function Handle.wait(h)
  if h.req ~= nil then
    local req = h.req
    h.req = nil
    check(C.lt_comm_wait(req))
    if h.finish then h.finish() end
  end
  return h.result
end

function Handle.done(h)
  if h.req == nil then return true end
  local done = ffi.new("int[1]")
  check(C.lt_comm_test(h.req, done))
  return done[0] ~= 0
end

-- Async calls box the request pointer; the Handle keeps what completion needs.
local function posted(box, result, finish)
  return setmetatable({req = box[0], result = result, finish = finish}, Handle)
end
local req_box_type = ffi.typeof("lt_comm_request *[1]")
local C_debug = C.lt_comm_debug

-- The call path makes no closures (LuaJIT compiles it): an op posts its C call with a request
-- box when opts.async, else with none (blocking), and ends in completed().

-- The request box for opts.async, else nil (the C call blocks).
local function request_box(opts)
  if opts and opts.async then return req_box_type() end
  return nil
end

-- The end of a collective call: a Handle when it was posted (box), else the blocking call's
-- end: the staged output copied back into result (back), result returned.
local function completed(box, result, back)
  if box ~= nil then return posted(box, result, back) end
  if back then back() end
  return result
end

-- A contiguous tensor holding t's values (t itself when contiguous) and, for outputs,
-- the function that copies the buffer back into t.
local function contiguous_in(t)
  if C.lt_is_contiguous(t) ~= 0 then return t end
  return t:contiguous()
end
-- (the closure is made in a function of its own: a function that closes over its locals
-- cannot be compiled by LuaJIT, and contiguous_out is on every call's path)
local function copier(t, buf) return function() check(C.lt_copy(t, buf)) end end
local function contiguous_out(t, copy_values)
  if C.lt_is_contiguous(t) ~= 0 then return t, nil end
  local buf = copy_values and t:contiguous() or memory.new()
  if not copy_values then check(C.lt_empty(buf, t.ndim, fields.dims(t), fields.dtype_id(t), fields.device_id(t))) end
  return buf, copier(t, buf)
end

local function op_arg(name, g, op)
  if op == nil then return OPS.sum end
  local v = OPS[op]
  if v == nil then
    raise(string.format("%s on group %s: unknown op '%s' (expected sum, avg, max or min)", name, g.name, tostring(op)))
  end
  return v
end

local function opts_arg(name, opts)
  if opts ~= nil and type(opts) ~= "table" then raise(name .. ": opts must be a table, got " .. type(opts)) end
  return opts
end

local function counts_arg(name, g, opts)
  local counts = opts and opts.counts
  if counts == nil then return nil end
  if type(counts) ~= "table" or #counts ~= g.size then
    raise(string.format("%s on group %s: opts.counts must be a list of %d integers", name, g.name, g.size))
  end
  local c = ffi.new("int64_t[?]", g.size)
  for i = 1, g.size do c[i - 1] = errors.int_arg(name, counts[i], "counts[" .. i .. "]") end
  return c
end

-- The output of a gathering call: out, or an undefined tensor that the C call allocates when
-- out is nil; the buffer the call writes (out, or a contiguous stand-in for a defined
-- non-contiguous out) and the copy back.
local function gathered_out(name, out)
  if out == nil then out = memory.new() else tensor_arg(name, out, "out") end
  if C.lt_is_defined(out) ~= 0 then return out, contiguous_out(out, false) end
  return out, out, nil
end

-- The checked arguments of a send or recv: opts and the message tag (default 0).
local function point_to_point_args(name, t, peer, opts)
  tensor_arg(name, t, "t")
  errors.int_arg(name, peer, "peer")
  opts = opts_arg(name, opts)
  return opts, opts and opts.tag or 0
end

-- ---- collectives -----------------------------------------------------------------------

function Group.all_reduce(g, t, op, opts)
  tensor_arg("all_reduce", t, "t")
  local o = op_arg("all_reduce", g, op)
  opts = opts_arg("all_reduce", opts)
  local buf, back = contiguous_out(t, true)
  if C_debug() ~= 0 then note_callsite() end
  local box = request_box(opts)
  check(C.lt_comm_all_reduce(g.ptr, buf, o, box))
  return completed(box, t, back)
end

-- out may be nil (allocated: this rank's piece, 1-d)
function Group.reduce_scatter(g, out, inp, op, opts)
  tensor_arg("reduce_scatter", inp, "inp")
  local o = op_arg("reduce_scatter", g, op)
  opts = opts_arg("reduce_scatter", opts)
  local counts = counts_arg("reduce_scatter", g, opts)
  local buf, back
  out, buf, back = gathered_out("reduce_scatter", out)
  local src = contiguous_in(inp)
  if C_debug() ~= 0 then note_callsite() end
  local box = request_box(opts)
  check(C.lt_comm_reduce_scatter(g.ptr, buf, src, o, counts, box))
  return completed(box, out, back)
end

-- out may be nil (allocated: (size, inp's shape...), or 1-d with counts)
function Group.all_gather(g, out, inp, opts)
  tensor_arg("all_gather", inp, "inp")
  opts = opts_arg("all_gather", opts)
  local counts = counts_arg("all_gather", g, opts)
  local buf, back
  out, buf, back = gathered_out("all_gather", out)
  local src = contiguous_in(inp)
  if C_debug() ~= 0 then note_callsite() end
  local box = request_box(opts)
  check(C.lt_comm_all_gather(g.ptr, buf, src, counts, box))
  return completed(box, out, back)
end

-- Every rank's string, in rank order: an all_gather of the bytes (small metadata: a
-- checkpoint's plans, names). Blocking; every rank of g calls it.
function Group.all_gather_text(g, text)
  if type(text) ~= "string" then raise("all_gather_text on group " .. g.name .. ": expected a string, got " .. type(text)) end
  local create = require "lutra.create"
  local counts = g:all_gather(nil, create.tensor({#text}, {dtype = "i64"})):view(-1):tolist()
  local list, total = {}, 0
  for r = 1, g.size do
    list[r] = tonumber(counts[r])
    total = total + list[r]
  end
  local mine = create.empty({#text}, {dtype = "u8"})
  if #text > 0 then ffi.copy(C.lt_data_ptr(mine), text, #text) end
  local all = create.empty({total}, {dtype = "u8"})
  g:all_gather(all, mine, {counts = list})
  local out, off, base = {}, 0, ffi.cast("const char *", C.lt_data_ptr(all))
  for r = 1, g.size do
    out[r] = ffi.string(base + off, list[r])
    off = off + list[r]
  end
  return out
end

-- A list of g.size integers into an int64_t array: one scratch array per role, grown as
-- needed (the C call reads the counts before it returns), so the call path allocates nothing.
local scratch, scratch_n = {}, {}
local function count_list(name, g, list, what)
  if type(list) ~= "table" or #list ~= g.size then
    raise(string.format("%s on group %s: %s must be a list of %d integers, got %s", name, g.name, what, g.size,
                        type(list) == "table" and ("a list of " .. #list) or type(list)))
  end
  local c = scratch[what]
  if c == nil or scratch_n[what] < g.size then
    c = ffi.new("int64_t[?]", g.size)
    scratch[what], scratch_n[what] = c, g.size
  end
  for i = 1, g.size do
    local v = list[i]
    if type(v) ~= "number" or v ~= math.floor(v) then errors.int_arg(name, v, what .. "[" .. i .. "]") end
    c[i - 1] = v
  end
  return c
end

-- The rows every rank will send to this one, given the rows this one sends to each
-- (send_counts[j] to rank j - 1): an all_to_all of one i64 per rank. Blocking.
function Group.all_to_all_counts(g, send_counts)
  local c = count_list("all_to_all_counts", g, send_counts, "counts")
  local create = require "lutra.create"
  local inp, out = create.empty({g.size}, {dtype = "i64"}), create.empty({g.size}, {dtype = "i64"})
  ffi.copy(C.lt_data_ptr(inp), c, 8 * g.size)
  local ones = ffi.new("int64_t[?]", g.size)
  for i = 0, g.size - 1 do ones[i] = 1 end
  if C_debug() ~= 0 then note_callsite() end
  check(C.lt_comm_all_to_all(g.ptr, out, inp, ones, ones, nil))
  local got, list = ffi.cast("const int64_t *", C.lt_data_ptr(out)), {}
  for i = 1, g.size do list[i] = tonumber(got[i - 1]) end
  return list
end

-- Rows (dim 0) of inp to every rank: send_counts[j] rows, in order, to rank j - 1; out gets
-- recv_counts[i] rows from rank i - 1, in order. recv_counts nil: exchanged first
-- (all_to_all_counts). out may be nil (allocated: (sum of recv_counts, inp's other dims...)).
function Group.all_to_all(g, out, inp, send_counts, recv_counts, opts)
  tensor_arg("all_to_all", inp, "inp")
  opts = opts_arg("all_to_all", opts)
  local send = count_list("all_to_all", g, send_counts, "send_counts")
  if recv_counts == nil then recv_counts = g:all_to_all_counts(send_counts) end
  local recv = count_list("all_to_all", g, recv_counts, "recv_counts")
  local buf, back
  out, buf, back = gathered_out("all_to_all", out)
  local src = contiguous_in(inp)
  if C_debug() ~= 0 then note_callsite() end
  local box = request_box(opts)
  check(C.lt_comm_all_to_all(g.ptr, buf, src, send, recv, box))
  return completed(box, out, back)
end

function Group.broadcast(g, t, root, opts)
  tensor_arg("broadcast", t, "t")
  root = errors.int_arg("broadcast", root or 0, "root")
  opts = opts_arg("broadcast", opts)
  local buf, back = contiguous_out(t, true)
  if C_debug() ~= 0 then note_callsite() end
  local box = request_box(opts)
  check(C.lt_comm_broadcast(g.ptr, buf, root, box))
  return completed(box, t, back)
end

function Group.send(g, t, peer, opts)
  local tag
  opts, tag = point_to_point_args("send", t, peer, opts)
  local box = request_box(opts)
  check(C.lt_comm_send(g.ptr, contiguous_in(t), peer, tag, box))
  return completed(box, t, nil)
end

function Group.recv(g, t, peer, opts)
  local tag
  opts, tag = point_to_point_args("recv", t, peer, opts)
  local buf, back = contiguous_out(t, false)
  local box = request_box(opts)
  check(C.lt_comm_recv(g.ptr, buf, peer, tag, box))
  return completed(box, t, back)
end

-- list: {{"send", t, peer}, {"recv", t, peer}, ...}, posted together; returns a Handle
-- (opts.async == false waits and returns nothing).
function Group.p2p(g, list, opts)
  if type(list) ~= "table" then raise("p2p: list must be a table, got " .. type(list)) end
  opts = opts_arg("p2p", opts)
  local n = #list
  local kinds, peers = ffi.new("int[?]", math.max(n, 1)), ffi.new("int[?]", math.max(n, 1))
  local tensors = ffi.new("lt_tensor *[?]", math.max(n, 1))
  local keep, backs = {}, {}
  for i, item in ipairs(list) do
    local kind, t, peer = item[1], item[2], item[3]
    if kind ~= "send" and kind ~= "recv" then
      raise(string.format("p2p on group %s: item %d: expected {\"send\" or \"recv\", tensor, peer}", g.name, i))
    end
    tensor_arg("p2p", t, "item " .. i .. " tensor")
    errors.int_arg("p2p", peer, "item " .. i .. " peer")
    local buf, back
    if kind == "send" then buf = contiguous_in(t) else buf, back = contiguous_out(t, false) end
    keep[i], kinds[i - 1], peers[i - 1], tensors[i - 1] = buf, kind == "send" and C.LT_COMM_SEND or C.LT_COMM_RECV, peer, buf
    if back then backs[#backs + 1] = back end
  end
  local finish = nil
  if #backs > 0 then finish = function() for _, b in ipairs(backs) do b() end end end
  local tag = opts and opts.tag or 0
  if opts and opts.async == false then
    check(C.lt_comm_p2p(g.ptr, n, kinds, tensors, peers, tag, nil))
    if finish then finish() end
    return nil
  end
  local box = req_box_type()
  check(C.lt_comm_p2p(g.ptr, n, kinds, tensors, peers, tag, box))
  local h = posted(box, nil, finish)
  h.keep = keep
  return h
end

function Group.barrier(g, opts)
  opts = opts_arg("barrier", opts)
  local box = request_box(opts)
  check(C.lt_comm_barrier(g.ptr, box))
  if box ~= nil then return posted(box, nil, nil) end
end

-- comm.world after init (read before it: initializes)
return setmetatable(M, {__index = function(_, k) if k == "world" then return M.init() end end})
