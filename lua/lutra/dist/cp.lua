-- lutra.dist.cp — context parallel: the sequence of every row split over a cp group.
--
--   local part = cp.split(batch, mesh.cp)   -- {x =, y =, positions =, segments =, cp = ctx}
--   local _, loss = model:forward(part.x, part.y, {cp = part.cp})
--
-- (lutra.dist.parallelize does this for the trainer, and sets the context on the model as
-- model.cp_context for the forward, so that a loss_fn calling model:forward(x, y) gets it.)
--
-- Load balance for causal attention: a row of T tokens is cut into 2 * cp chunks of
-- T / (2 cp); rank i holds chunks i and 2cp-1-i (an early chunk sees few keys, a late one
-- many: each rank gets one of each). Positions (RoPE, learned) are the global ones (the
-- batch's own `positions` for packed rows, else the index in the row); attention runs over
-- the whole row as ring attention (lutra.dist.cp_attention) with the masks of the global
-- positions and, for packed rows, of the segments (the whole row's, kept in the context).
--
-- The loss: every rank's cross-entropy sum over its tokens divided by the count of the
-- group's tokens (all-reduced), times cp: the average over the cp ranks is the mean over the
-- whole rows, and gradients averaged over cp (and dp: the trainer's dp_cp group) are the
-- one-process gradients.
local create = require "lutra.create"
local errors = require "lutra.errors"
local ops = require "lutra.ops"
local F = require "lutra.functional"

local raise = errors.raise

local M = {}

-- The global indices (a Lua list, 0-based) of the tokens of cp rank i: chunks i and 2n-1-i of c.
function M.indices(i, n, c)
  local out = {}
  for t = 0, c - 1 do out[#out + 1] = i * c + t end
  for t = 0, c - 1 do out[#out + 1] = (2 * n - 1 - i) * c + t end
  return out
end

-- This rank's part of t (B, T, ...) along dim 1: its two chunks side by side.
function M.take(t, i, n)
  local T = t:size(1)
  local c = T / (2 * n)
  return create.cat({t:narrow(1, i * c, c), t:narrow(1, (2 * n - 1 - i) * c, c)}, 1)
end

local Ctx = {}
Ctx.__index = Ctx

-- The cross-entropy of this rank's logits (B, Tl, V) and targets (B, Tl) (-100 ignored),
-- scaled so that its average over the cp ranks is the mean over the group's tokens. model: one
-- whose loss(logits, targets, "sum") sums (a zoo model's: the vocab-parallel one under tp), or nil.
function Ctx:loss(logits, targets, model)
  local sum = model and model:loss(logits, targets, "sum")
    or F.cross_entropy(logits, targets, {ignore_index = -100, reduction = "sum"})
  local count = create.tensor({ops.ne(targets, -100):to("f64"):sum():item()}, {dtype = "f64"})
  self.group:all_reduce(count, "sum")
  local n = count:item()
  count:free()
  if n == 0 then return sum * 0 end
  return sum * (self.n / n)
end

-- The part of batch {x =, y =, positions =, segments =, ...} (every (B, T) tensor) that this
-- rank of the cp group holds, with the context the model's attention needs in `cp`.
function M.split(batch, group)
  local n, r = group.size, group.rank
  local x = batch.x or batch[1]
  local B, T = x:size(0), x:size(1)
  if T % (2 * n) ~= 0 then
    raise(string.format("context parallel: the sequence of %d tokens does not split into 2 * cp = %d equal chunks", T,
      2 * n))
  end
  local out = {}
  local cut = {}
  for k, v in pairs(batch) do
    if ops.is_tensor(v) and v.ndim >= 2 and v:size(0) == B and v:size(1) == T then
      cut[v] = cut[v] or M.take(v, r, n) -- x and [1] stay one tensor
      v = cut[v]
    end
    out[k] = v
  end
  out.x, out.y = out.x or out[1], out.y or out[2]
  if batch.positions == nil then
    local idx = create.tensor(M.indices(r, n, T / (2 * n)), {dtype = "i64", device = x.device})
    out.positions = idx:reshape(1, T / n):expand(B, T / n):contiguous()
  end
  out.cp = setmetatable({group = group, n = n, rank = r, T = T, chunk = T / (2 * n), segments = batch.segments,
                         positions = out.positions, local_segments = out.segments}, Ctx)
  return out
end

return M
