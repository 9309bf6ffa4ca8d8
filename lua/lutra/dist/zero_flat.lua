-- lutra.dist.zero_flat — what data parallel and ZeRO share: raw copies between tensors
-- and flat buffers (no autograd, no version bumps), async collectives with a blocking
-- fallback, and the dim-0 shard geometry.
--
-- Shards (FSDP2 style): a parameter of R rows (dim 0) over n ranks gives rank i the rows
-- [i*ceil(R/n), min((i+1)*ceil(R/n), R)), possibly none. Inside a flat buffer every
-- rank's shard of a parameter takes ceil(R/n) rows (padded), so the buffer of a bucket
-- is n equal chunks, rank-major: one reduce-scatter or all-gather serves the bucket.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local untracked = require("lutra.autograd.op").untracked
local memory = require "lutra.memory"
local create = require "lutra.create"
local fields = require "lutra.tensor.fields"

local C = lt.C
local M = {}

-- Runs fn(...) with grad mode off; returns its first result.
function M.no_grad(fn, ...) return (untracked(fn, ...)) end

-- dst <- src, elementwise in C (shapes must match or broadcast): no autograd record and
-- no version bump, so tensors that backward saved can be refilled.
function M.copy(dst, src)
  if C.lt_copy(dst, src) ~= 0 then errors.fail() end
end

function M.fill(dst, v)
  if C.lt_fill(dst, v) ~= 0 then errors.fail() end
end

-- t as a 1-D view of its n elements (t contiguous).
function M.flat_view(t)
  local n = t:numel()
  return M.no_grad(t.view, t, n)
end

-- The 1-D view [off, off + n) of flat buffer `flat`.
function M.piece(flat, off, n)
  return M.no_grad(flat.narrow, flat, 0, off, n)
end

-- Views made here are freed as soon as the copy is done: a view holds its storage, and
-- one left to the enclosing tidy scope (or the GC) would keep a whole communication
-- buffer or a released parameter's bytes alive until the step ends.
local ffi = lt.ffi
local dims = ffi.new("int64_t[1]")

local function piece_of(t, off, n)
  local flat, part = memory.new(), memory.new()
  dims[0] = C.lt_numel(t)
  if C.lt_view(flat, t, 1, dims) ~= 0 or C.lt_narrow(part, flat, 0, off, n) ~= 0 then
    C.lt_free_storage(flat)
    errors.fail()
  end
  C.lt_free_storage(flat)
  return part
end

-- Elements [doff, doff + n) of dst (contiguous, any shape, taken flat) <- elements
-- [soff, soff + n) of src.
function M.move(dst, doff, src, soff, n)
  if n <= 0 then return end
  local d, s = piece_of(dst, doff, n), piece_of(src, soff, n)
  local rc = C.lt_copy(d, s)
  C.lt_free_storage(d)
  C.lt_free_storage(s)
  if rc ~= 0 then errors.fail() end
end

-- Elements [off, off + n) of dst (taken flat) <- v.
function M.fill_range(dst, off, n, v)
  if n <= 0 then return end
  local d = piece_of(dst, off, n)
  local rc = C.lt_fill(d, v)
  C.lt_free_storage(d)
  if rc ~= 0 then errors.fail() end
end

function M.bytes(t)
  if t == nil or fields.is_freed(t) then return 0 end
  return t:numel() * t:element_size()
end

-- A zeroed 1-D buffer of n elements that outlives any tidy scope.
function M.buffer(n, like)
  return memory.keep(create.zeros(n, {dtype = like.dtype, device = like.device}))
end

-- A list of {name, tensor} pairs that also answers named_parameters() (as a module
-- does), so that optimizers and optim.param_groups take it directly.
local function iterate_pairs(list)
  local i = 0
  return function()
    i = i + 1
    local e = list[i]
    if e ~= nil then return e[1], e[2] end
  end
end
function M.named_pairs(list)
  list.named_parameters = iterate_pairs
  return list
end

-- A handle {wait = fn -> output, done = fn -> bool} for group:method(args..., {async = true}).
-- Where the group has no async calls yet, the call blocks and the handle is complete.
local Done = {}
Done.__index = Done
function Done:wait() return self.out end
function Done:done() return true end

function M.async(group, method, out, ...)
  local n = select("#", ...)
  local args = {...}
  args[n + 1] = {async = true}
  local h = group[method](group, out, unpack(args, 1, n + 1))
  if type(h) == "table" or type(h) == "userdata" then
    if h.wait then return h end
  end
  return setmetatable({out = out}, Done)
end

-- Shard geometry of a tensor of shape `shape` (a list) over n ranks: {rows = R,
-- per = ceil(R/n) rows a rank (padded), row = elements a row, start(i), count(i)}.
-- A 0-d tensor counts as one row.
function M.geometry(shape, n)
  local R = shape[1] or 1
  local row = 1
  for d = 2, #shape do row = row * shape[d] end
  local per = math.ceil(R / n)
  local g = {rows = R, per = per, row = row, n = n}
  function g.start(i) return math.min(i * per, R) end
  function g.count(i) return math.max(0, math.min((i + 1) * per, R) - i * per) end
  return g
end

return M
