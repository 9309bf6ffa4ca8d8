-- lutra.functional.cross_entropy — F.cross_entropy over logits' last dim, its backward, and its
-- autograd declaration (CrossEntropyBackward). The C side: lt_cross_entropy_forward /
-- lt_cross_entropy_backward (host/ops/cross_entropy.c).
--
--   F.cross_entropy(logits, targets, opts)   -> loss, losses, lse
--       opts: {ignore_index = -100, reduction = "mean" | "sum" | "none", out = } (or ignore_index)
--       logits (..., V), targets (...) i32/i64 class indices (0-based); "mean" averages over
--       the targets that are not ignore_index.
--   F.cross_entropy_backward(dlosses, logits, targets, lse, ignore_index, out) -> dlogits
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local ops = require "lutra.ops"
local dtype = require "lutra.dtype"
local S = require "lutra.autograd.state"
local op = require "lutra.autograd.op"
local fields = require "lutra.tensor.fields"
local U = require "lutra.functional.util"
local C = lt.C

local M = {}

local new, fail, raise = memory.new, errors.fail, errors.raise
local need, tracked, row_stats = U.need, U.tracked, U.row_stats
local edge, attach, save = op.edge, op.attach, op.save

local record_cross_entropy -- the declaration's, below

local function ce_options(opts)
  if type(opts) == "number" then return opts, "mean", nil end
  opts = opts or {}
  return opts.ignore_index or -100, opts.reduction or "mean", opts.out
end

-- Flattens logits (..., V) to (N, V) and targets (...) to (N).
local function flat_rows(logits, targets)
  local v = logits:size(-1)
  return logits:reshape(-1, v), targets:reshape(-1)
end

function M.cross_entropy(logits, targets, opts)
  need("cross_entropy", "logits", logits)
  need("cross_entropy", "targets", targets)
  local ignore_index, reduction, out = ce_options(opts)
  if reduction ~= "none" and reduction ~= "sum" and reduction ~= "mean" then
    raise("cross_entropy: reduction must be \"mean\", \"sum\" or \"none\", got " .. tostring(reduction))
  end
  local track = tracked(logits)
  -- the pieces below are one recorded op
  local loss, losses, lse, valid = op.untracked(function()
    local l2, t1 = flat_rows(logits, targets)
    local losses, lse = row_stats(l2), row_stats(l2)
    if C.lt_cross_entropy_forward(losses, lse, l2, t1, ignore_index) ~= 0 then fail() end
    -- the flat view is dropped now: a tidy scope would keep the logits' storage to its end
    if not rawequal(l2, logits) then l2:free() end
    if reduction == "none" then
      if out then out:copy_(losses) end
      return out or losses, losses, lse
    end
    local total = ops.sum(losses, nil, false, out)
    if reduction == "sum" then return total, losses, lse end
    local valid = ops.sum(ops.ne(t1, ignore_index):to(dtype.name(fields.dtype_id(losses))))
    return ops.div(total, valid, total), losses, lse, valid
  end)
  if track then record_cross_entropy(loss, logits, targets, lse, ignore_index, reduction, valid) end
  return loss, losses, lse
end

-- dlogits (N, V) from dlosses (N); logits and targets as given to the forward. out (logits'
-- shape) may be logits itself: the gradient overwrites them.
function M.cross_entropy_backward(dlosses, logits, targets, lse, ignore_index, out)
  local l2, t1 = flat_rows(logits, targets)
  local dlogits = out and out:reshape(l2.shape) or new()
  if C.lt_cross_entropy_backward(dlogits, dlosses, l2, t1, lse, ignore_index or -100) ~= 0 then fail() end
  return dlogits:view(logits.shape)
end
local cross_entropy_backward = M.cross_entropy_backward

-- loss: the mean over valid rows, the sum, or the per-row losses (reduction "none").
record_cross_entropy = op.declare {
  name = "CrossEntropyBackward", op = "cross_entropy", save = {"logits", "targets", "lse", "valid"},
  record = function(cls, loss, logits, targets, lse, ignore_index, reduction, valid)
    local node = {edge(logits), cls = cls, ignore_index = ignore_index, reduction = reduction}
    save(node, "logits", logits)
    save(node, "targets", targets)
    save(node, "lse", lse)
    if valid ~= nil then save(node, "valid", valid) end
    attach(loss, node)
  end,
  backward = function(n, g)
    local rows = n.lse:size(0)
    local dlosses
    if n.reduction == "none" then
      dlosses = g:reshape(rows)
    else
      if n.reduction == "mean" then g = ops.div(g, n.valid:to(dtype.name(fields.dtype_id(g)))) end
      dlosses = g:reshape(1):expand(rows):contiguous()
    end
    -- The logits are dead once this node ran: when autograd's alias is all that holds their
    -- storage, their gradient overwrites them (one logits-sized buffer less at backward's peak).
    local logits, out = n.logits, nil
    if fields.view_kind(logits) == fields.SAVED_ALIAS and fields.storage_refs(logits) == 1
      and C.lt_is_contiguous(logits) ~= 0
        and not S.retain_graph then
      out = logits
    end
    return cross_entropy_backward(dlosses, logits, n.targets, n.lse, n.ignore_index, out)
  end,
  -- (softmax(logits) - one_hot(targets)) dlosses with recorded ops; rows of ignore_index get 0
  double_backward = function(n, g)
    local logits = n.logits
    local rows, v = n.lse:size(0), logits:size(-1)
    local dt = dtype.name(fields.dtype_id(logits))
    local t1 = n.targets:reshape(-1)
    local valid = ops.ne(t1, n.ignore_index)
    local dlosses
    if n.reduction == "none" then
      dlosses = g:reshape(rows)
    else
      if n.reduction == "mean" then g = ops.div(g, n.valid:to(dtype.name(fields.dtype_id(g)))) end
      dlosses = g:reshape(1):expand(rows)
    end
    dlosses = ops.where(valid, dlosses, 0):to(dt)
    local picked = require("lutra.create").zeros({rows, v}, {dtype = dt, device = logits.device})
    picked = require("lutra.functional.gather").scatter(picked, 1, ops.where(valid, t1, 0):unsqueeze(1), 1)
    local p = ops.softmax(logits:reshape(rows, v), -1)
    return ops.mul(ops.sub(p, picked), dlosses:unsqueeze(1)):reshape(logits.shape)
  end,
}

return M
