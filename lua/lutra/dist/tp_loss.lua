-- lutra.dist.tp_loss — cross-entropy over logits sharded on the vocab dim (Megatron's
-- vocab-parallel cross-entropy), recorded as one autograd op.
--
--   local loss, losses = tp_loss.cross_entropy(logits, targets, group, vocab_start, vocab_size,
--                                              {ignore_index = -100, reduction = "mean" | "sum"})
--   logits (..., Vl): this rank's columns [vocab_start, vocab_start + Vl) of the (..., V) logits;
--   targets (...) i32/i64 global class ids (the same on every rank), ignore_index skipped.
--
-- Per row: the max and the sum of exp over the whole vocab are all-reduced (max, then sum),
-- lse = max + log(sum); the target's logit comes from the rank that holds it (an
-- all-reduced sum of one-hot picks); loss = lse - target logit. "mean" averages over the
-- rows whose target is not ignore_index (nan when there are none, as F.cross_entropy).
-- Backward: dlogits = (softmax shard - one-hot shard) * dloss, zero on ignored rows; no
-- communication. bf16/f16 logits are computed in f32, and the loss is f32 (as F.cross_entropy's).
local op = require "lutra.autograd.op"
local S = require "lutra.autograd.state"
local create = require "lutra.create"
local errors = require "lutra.errors"
local dtype = require "lutra.dtype"
local ops = require "lutra.ops"
local fields = require "lutra.tensor.fields"
local is_tracked = fields.is_tracked

local raise = errors.raise

local M = {}

local function compute_dtype(t)
  local dt = dtype.name(fields.dtype_id(t))
  return (dt == "bf16" or dt == "f16") and "f32" or dt
end

-- The (N, Vl) one-hot of targets t1 (N) i64 within columns [lo, lo + Vl), in dtype dt.
local function one_hot(t1, lo, Vl, dt)
  local cols = create.arange(lo, lo + Vl, {device = dtype.device_name(fields.device_id(t1))})
  return t1:unsqueeze(1):eq(cols:unsqueeze(0)):to(dt)
end

local function forward(logits, targets, group, lo, V, ignore_index, reduction)
  local Vl = logits:size(-1)
  local dt = compute_dtype(logits)
  local l2 = logits:reshape(-1, Vl)
  if dtype.name(fields.dtype_id(l2)) ~= dt then l2 = l2:to(dt) end
  local t1 = targets:reshape(-1):to("i64")
  local N = l2:size(0)
  if t1:size(0) ~= N then
    raise(string.format("tp.cross_entropy: %d rows of logits but %d targets", N, t1:size(0)))
  end
  local valid_b = t1:ne(ignore_index)
  local checked = ops.where(valid_b, t1, 0)
  if N > 0 and (checked:min():item() < 0 or checked:max():item() >= V) then
    raise(string.format("tp.cross_entropy: a target is outside [0, %d) (and is not ignore_index %d)", V, ignore_index))
  end
  local m = l2:max({1}, true) -- (N, 1)
  group:all_reduce(m, "max")
  local s = (l2 - m):exp():sum({1}, true)
  group:all_reduce(s, "sum")
  local lse = m + s:log()
  local picked = (l2 * one_hot(t1, lo, Vl, dt)):sum({1}, true)
  group:all_reduce(picked, "sum")
  local valid = valid_b:to(dt)
  local losses = (lse - picked):reshape(N) * valid
  local loss = losses:sum()
  local scale = 1
  if reduction == "mean" then
    scale = 1 / valid:sum():item() -- inf with no valid row: the loss is nan, as F.cross_entropy's
    loss = loss * scale
  end
  return loss, losses, lse, t1, valid:reshape(N, 1) * scale
end

local record_cross_entropy = op.declare {
  name = "VocabParallelCrossEntropyBackward", save = {"logits", "targets", "lse", "scale"},
  no_double = "for gradients of gradients run the model without tensor parallelism (no tp.parallelize)",
  record = function(cls, loss, logits, t1, lse, scale, lo)
    local node = {op.edge(logits), cls = cls, lo = lo, shape = logits.shape}
    op.save(node, "logits", logits)
    op.save(node, "targets", t1)
    op.save(node, "lse", lse)
    op.save(node, "scale", scale)
    op.attach(loss, node)
  end,
  -- dlogits = (exp(logits - lse) - one_hot) * scale * g; scale (N, 1) is 1/count (or 1) on
  -- valid rows and 0 on ignored ones.
  backward = function(n, g)
    local logits = n.logits
    local Vl = logits:size(-1)
    local out_dt = dtype.name(fields.dtype_id(logits))
    local l2 = logits:reshape(-1, Vl)
    local dt = compute_dtype(logits)
    if out_dt ~= dt then l2 = l2:to(dt) end
    if dtype.name(fields.dtype_id(g)) ~= dt then g = g:to(dt) end
    local d = ((l2 - n.lse):exp() - one_hot(n.targets, n.lo, Vl, dt)) * (n.scale * g)
    if out_dt ~= dt then d = d:to(out_dt) end
    return d:view(n.shape)
  end,
}

function M.cross_entropy(logits, targets, group, vocab_start, vocab_size, opts)
  if not ops.is_tensor(logits) then raise("tp.cross_entropy: logits must be a tensor, got " .. type(logits)) end
  if not ops.is_tensor(targets) then raise("tp.cross_entropy: targets must be a tensor, got " .. type(targets)) end
  opts = opts or {}
  local ignore_index, reduction = opts.ignore_index or -100, opts.reduction or "mean"
  if reduction ~= "mean" and reduction ~= "sum" then
    raise("tp.cross_entropy: reduction must be \"mean\" or \"sum\", got " .. tostring(reduction))
  end
  if vocab_start + logits:size(-1) > vocab_size then
    raise(string.format("tp.cross_entropy: the shard [%d, %d) does not fit the vocab of %d", vocab_start,
      vocab_start + logits:size(-1), vocab_size))
  end
  -- the pieces are one recorded op
  local loss, losses, lse, t1, scale = op.untracked(forward, logits, targets, group, vocab_start, vocab_size,
    ignore_index, reduction)
  if S.enabled and is_tracked(logits) then record_cross_entropy(loss, logits, t1, lse, scale, vocab_start) end
  return loss, losses
end


return M
