-- lutra.dist.tp_layers — the tensor-parallel layers, each made from its full-size
-- counterpart by narrowing copies of its weights (so the init equals the single process).
--
--   ColumnParallelLinear(linear, group, pieces, {input = "copy" | "gather" | "none"})
--     weight (out_local, in): the rows of linear.weight listed in pieces ({{start, count},
--     ...}, concatenated in order), bias likewise; y (..., out_local) stays sharded.
--     input "copy": x is the same on every rank (f: identity, gradient all-reduced);
--     "gather": x is this rank's sequence piece (B, T/n, in), all-gathered first (sequence
--     parallel); "none": the caller already did either.
--   RowParallelLinear(linear, group, pieces, {output = "reduce" | "reduce_scatter"})
--     weight (out, in_local): the columns of linear.weight in pieces; x (..., in_local) is
--     sharded on its last dim; the partial products are all-reduced ("reduce_scatter":
--     reduce-scattered on the sequence dim, sequence parallel), then bias (replicated) is
--     added once.
--   VocabParallelEmbedding(embedding, group, start, count)
--     weight: the rows [start, start + count) of embedding.weight; ids outside are looked up
--     as row 0 and zeroed, then the pieces are all-reduced: (..., C) on every rank.
-- The parameters keep the names of the layers they replace (weight, bias). The module
-- fields in_features / out_features / num_embeddings are the local sizes; global_* the
-- full ones.
local Module = require "lutra.nn.module"
local F = require "lutra.functional"
local create = require "lutra.create"
local ops = require "lutra.ops"
local errors = require "lutra.errors"
local grad = require "lutra.nn.grad"
local release = grad.release
local tp_ops = require "lutra.dist.tp_ops"

local raise = errors.raise

local M = {}

-- A new tensor (a leaf): the pieces {{start, count}, ...} of t along dim, concatenated.
function M.take(t, dim, pieces)
  return grad.no_grad(function()
    local parts = {}
    for i, p in ipairs(pieces) do parts[i] = t:detach():narrow(dim, p[1], p[2]) end
    if #parts == 1 then return parts[1]:clone() end
    return create.cat(parts, dim)
  end)
end

local function total(pieces)
  local n = 0
  for _, p in ipairs(pieces) do n = n + p[2] end
  return n
end

-- ---- column parallel -----------------------------------------------------------------------

local Column = Module:extend("ColumnParallelLinear")
M.ColumnParallelLinear = Column

local INPUTS = {copy = true, gather = true, none = true}

function Column:init(linear, group, pieces, opts)
  opts = opts or {}
  local input = opts.input or "copy"
  if not INPUTS[input] then raise("ColumnParallelLinear: input must be \"copy\", \"gather\" or \"none\", got "
    .. tostring(input)) end
  rawset(self, "group", group)
  rawset(self, "input", input)
  self.in_features = linear.in_features
  self.global_out_features = linear.out_features
  self.out_features = total(pieces)
  self:param("weight", opts.weight or M.take(linear.weight, 0, pieces))
  if linear.bias ~= nil then self:param("bias", M.take(linear.bias, 0, pieces)) end
end

function Column:forward(x)
  local xi = x
  if self.input == "copy" then
    xi = tp_ops.copy_to(x, self.group)
  elseif self.input == "gather" then
    xi = tp_ops.gather_seq(x, self.group)
  end
  local y = F.linear(xi, self.weight, self.bias)
  release(xi, x)
  return y
end

function Column:extra_repr()
  return string.format("%d, %d of %d, bias=%s, tp=%d", self.in_features, self.out_features,
    self.global_out_features, tostring(self.bias ~= nil), self.group.size)
end

-- ---- row parallel --------------------------------------------------------------------------

local Row = Module:extend("RowParallelLinear")
M.RowParallelLinear = Row

function Row:init(linear, group, pieces, opts)
  opts = opts or {}
  local output = opts.output or "reduce"
  if output ~= "reduce" and output ~= "reduce_scatter" then
    raise("RowParallelLinear: output must be \"reduce\" or \"reduce_scatter\", got " .. tostring(output))
  end
  rawset(self, "group", group)
  rawset(self, "output", output)
  self.global_in_features = linear.in_features
  self.in_features = total(pieces)
  self.out_features = linear.out_features
  self:param("weight", M.take(linear.weight, 1, pieces))
  if linear.bias ~= nil then self:param("bias", linear.bias:detach():clone()) end
end

function Row:forward(x)
  local partial = F.linear(x, self.weight)
  local y
  if self.output == "reduce" then
    y = tp_ops.reduce_from(partial, self.group)
  else
    y = tp_ops.reduce_scatter_seq(partial, self.group)
  end
  release(partial, x, y)
  if self.bias == nil then return y end
  -- (under autocast y is bf16/f16 while the bias stays an f32 master weight)
  local z = y + (self.bias.dtype == y.dtype and self.bias or self.bias:to(y.dtype))
  release(y, x)
  return z
end

function Row:extra_repr()
  return string.format("%d of %d, %d, bias=%s, tp=%d", self.in_features, self.global_in_features,
    self.out_features, tostring(self.bias ~= nil), self.group.size)
end

-- ---- vocab-parallel embedding --------------------------------------------------------------

local Embedding = Module:extend("VocabParallelEmbedding")
M.VocabParallelEmbedding = Embedding

function Embedding:init(embedding, group, start, count)
  rawset(self, "group", group)
  self.vocab_start, self.num_embeddings = start, count
  self.global_num_embeddings = embedding.num_embeddings
  self.embedding_dim = embedding.embedding_dim
  self:param("weight", M.take(embedding.weight, 0, {{start, count}}))
end

function Embedding:forward(ids)
  local lo, n = self.vocab_start, self.num_embeddings
  local local_ids, keep = grad.no_grad(function()
    local inside = ops.where(ids:ge(lo), ids:lt(lo + n), false)
    return ops.where(inside, ids - lo, 0), inside:to(self.weight.dtype):unsqueeze(-1)
  end)
  local e = F.embedding(local_ids, self.weight)
  if keep.dtype ~= e.dtype then keep = keep:to(e.dtype) end
  local masked = e * keep
  release(e)
  local y = tp_ops.reduce_from(masked, self.group)
  release(masked, nil, y)
  return y
end

function Embedding:extra_repr()
  return string.format("%d of %d from %d, %d, tp=%d", self.num_embeddings, self.global_num_embeddings,
    self.vocab_start, self.embedding_dim, self.group.size)
end

return M
