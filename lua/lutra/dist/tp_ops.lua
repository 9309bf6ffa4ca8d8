-- lutra.dist.tp_ops — the collectives of tensor parallelism as autograd ops (Megatron's f
-- and g, and the sequence-parallel pair), each recorded as one op with its own backward.
--
--   copy_to(x, group)             identity forward; backward all-reduces (sums) the gradient (f)
--   reduce_from(x, group)         forward all-reduces (sums) x; identity backward (g)
--   gather_seq(x, group)          x (B, T/n, ...) -> (B, T, ...): all-gather along dim 1;
--                                 backward reduce-scatters the gradient to (B, T/n, ...)
--   reduce_scatter_seq(x, group)  x (B, T, ...) partial sums -> this rank's (B, T/n, ...) of
--                                 their sum; backward all-gathers the gradient
--   split_seq(x, group)           x (B, T, ...) the same on every rank -> this rank's piece
--                                 (B, T/n, ...); backward all-gathers the gradient
--   gather_seq_whole(x, group)    x (B, T/n, ...) -> (B, T, ...) like gather_seq, for a region
--                                 that computes the same on every rank (its gradient is whole
--                                 on every rank): backward takes this rank's piece of it
-- n is group.size; rank i holds the positions [i T/n, (i+1) T/n). With a group of one
-- every op returns x itself. Gradients of gradients (create_graph): each backward is recorded
-- as its conjugate op (copy_to's as reduce_from and back, gather_seq's as reduce_scatter_seq
-- and back, split_seq's as gather_seq, gather_seq_whole's as split_seq), whose own backward is
-- the first op's forward. Every rank of the group must call the same ops in the same order (the
-- collectives pair up by order), forward and backward.
local op = require "lutra.autograd.op"
local S = require "lutra.autograd.state"
local create = require "lutra.create"
local errors = require "lutra.errors"
local dtype = require "lutra.dtype"
local fields = require "lutra.tensor.fields"
local is_tracked = fields.is_tracked

local raise = errors.raise

local M = {}

-- Runs fn(...) with autograd off (the op's pieces are not recorded one by one).
local function quiet(fn, ...) return (op.untracked(fn, ...)) end

-- Declares a collective whose node keeps the group; returns a function attaching it to out
-- when x takes part in autograd. conjugate: the name of the op (in M) that computes backward's
-- result and records it (create_graph).
local function declare(name, backward, conjugate)
  local record = op.declare {
    name = name, backward = backward, double_backward = function(n, g) return M[conjugate](g, n.group) end,
    record = function(cls, out, x, group) op.attach(out, {op.edge(x), cls = cls, group = group}) end,
  }
  return function(out, x, group)
    if S.enabled and is_tracked(x) then record(out, x, group) end
    return out
  end
end

local function check(op, x, group)
  if not require("lutra.ops").is_tensor(x) then raise(op .. ": expected a tensor, got " .. type(x)) end
  if type(group) ~= "table" or type(group.size) ~= "number" then
    raise(op .. ": expected a process group (lutra.dist.comm), got " .. type(group))
  end
end

local function empty(shape, like)
  return create.empty(shape, {dtype = dtype.name(fields.dtype_id(like)),
    device = dtype.device_name(fields.device_id(like))})
end

-- A contiguous copy of x (a new tensor, never x's storage: collectives write in place).
local function fresh(x) return x:clone() end

local function all_reduced(x, group)
  local y = fresh(x)
  group:all_reduce(y, "sum")
  return y
end

-- ---- f and g ---------------------------------------------------------------------------------

local record_copy_to = declare("TPCopyToBackward", function(n, g) return all_reduced(g, n.group) end, "reduce_from")

function M.copy_to(x, group)
  check("tp.copy_to", x, group)
  if group.size == 1 then return x end
  return record_copy_to(S.share(x), x, group)
end

local record_reduce_from = declare("TPReduceFromBackward", function(_, g) return g end, "copy_to")

function M.reduce_from(x, group)
  check("tp.reduce_from", x, group)
  if group.size == 1 then return x end
  return record_reduce_from(quiet(all_reduced, x, group), x, group)
end

-- ---- sequence parallel -------------------------------------------------------------------------
-- (B, T, ...) is handled as (B, T, R); the all-gather and reduce-scatter buffers are rank-major
-- (n, B, T/n, R), permuted to and from (B, n, T/n, R) = (B, T, R).

local function dims3(op, x, n, whole)
  if x.ndim < 2 then raise(string.format("%s: expected x (B, T, ...), got %d dims", op, x.ndim)) end
  local shape = x.shape
  local B, T = shape[1], shape[2]
  local R = 1
  for i = 3, #shape do R = R * shape[i] end
  if whole and T % n ~= 0 then
    raise(string.format("%s: the sequence length %d does not divide among the %d tensor-parallel ranks", op, T, n))
  end
  return shape, B, T, R
end

local function with_t(shape, T)
  local s = {}
  for i, v in ipairs(shape) do s[i] = v end
  s[2] = T
  return s
end

-- x (B, Tl, R) local pieces -> (B, n Tl, R) on every rank
local function gather_t(x, group, shape)
  local n = group.size
  local _, B, Tl, R = dims3("tp.gather_seq", x, n)
  local buf = empty({n, B, Tl, R}, x)
  group:all_gather(buf, x:contiguous())
  local y = buf:permute {1, 0, 2, 3}:contiguous():view(with_t(shape, n * Tl))
  buf:free()
  return y
end

-- x (B, T, R) partial sums -> this rank's (B, T/n, R) of their sum
local function reduce_scatter_t(x, group, shape)
  local n = group.size
  local _, B, T, R = dims3("tp.reduce_scatter_seq", x, n, true)
  local buf = x:contiguous():view(B, n, T / n, R):permute {1, 0, 2, 3}:contiguous()
  local out = empty(with_t(shape, T / n), x)
  group:reduce_scatter(out, buf, "sum")
  buf:free()
  return out
end

local record_gather_seq = declare("TPGatherSeqBackward", function(n, g) return reduce_scatter_t(g, n.group, g.shape) end,
  "reduce_scatter_seq")

function M.gather_seq(x, group)
  check("tp.gather_seq", x, group)
  if group.size == 1 then return x end
  return record_gather_seq(quiet(gather_t, x, group, x.shape), x, group)
end

local record_reduce_scatter_seq = declare("TPReduceScatterSeqBackward",
  function(n, g) return gather_t(g, n.group, g.shape) end, "gather_seq")

function M.reduce_scatter_seq(x, group)
  check("tp.reduce_scatter_seq", x, group)
  if group.size == 1 then return x end
  return record_reduce_scatter_seq(quiet(reduce_scatter_t, x, group, x.shape), x, group)
end

-- x (B, T, ...) the same on every rank -> this rank's (B, T/n, ...) (no autograd)
local function piece_t(x, group)
  local n = group.size
  local _, _, T = dims3("tp.split_seq", x, n, true)
  return x:narrow(1, group.rank * (T / n), T / n):contiguous()
end

local record_split_seq = declare("TPSplitSeqBackward", function(n, g) return gather_t(g, n.group, g.shape) end,
  "gather_seq")

function M.split_seq(x, group)
  check("tp.split_seq", x, group)
  if group.size == 1 then return x end
  return record_split_seq(quiet(piece_t, x, group), x, group)
end

local record_gather_seq_whole = declare("TPGatherSeqWholeBackward", function(n, g) return piece_t(g, n.group) end,
  "split_seq")

function M.gather_seq_whole(x, group)
  check("tp.gather_seq_whole", x, group)
  if group.size == 1 then return x end
  return record_gather_seq_whole(quiet(gather_t, x, group, x.shape), x, group)
end

-- Rank i's piece of a length n split into `parts` near-equal pieces: [floor(i n / parts),
-- floor((i + 1) n / parts)), as (start, count).
function M.range(n, parts, i)
  local lo, hi = math.floor(i * n / parts), math.floor((i + 1) * n / parts)
  return lo, hi - lo
end

return M
