-- lutra.lora.tp — LoRA adapters on tensor-parallel layers (lutra.dist.tp calls it when a
-- Linear it converts is a lora.LoRALinear; nothing to call by hand).
--
--   lora.apply(model, {...}); tp.parallelize(model, group)   -- the adapters go with their layers
--
-- Column-parallel layers (qkv, mlp fc / gate / up, a targeted lm_head) keep this rank's
-- rows of the base weight. Their adapter: A (r, in) whole on every rank, fed the layer's
-- own input (after its copy or sequence all-gather); B (out_local, r) the same rows as the
-- weight (for the fused qkv this rank's q, k and v head rows, and the row-block mask of
-- split_fused adapters likewise). A's gradient on a rank covers only its rows of the
-- output, so A enters through tp_ops.copy_to: its gradient is summed over the group in
-- backward (before any post-accumulate hook, so ddp and ZeRO see the full gradient).
-- Row-parallel layers (attn.proj, mlp.proj) keep this rank's columns of the weight. Their
-- adapter: A (r, in_local) the same columns; A x is a partial sum, all-reduced (or
-- reduce-scattered on the sequence with sequence parallelism) before B (out, r), whole on
-- every rank. With the reduce-scatter B sees only this rank's tokens: B enters through
-- copy_to too. Dropout on a row-parallel input draws the mask of the whole (..., in) and
-- applies this rank's columns: the masks of one process.
-- Specs: the sharded B (column) or A (row) are boxes as their base weight's; the whole
-- copies are dup on tp ranks > 0 (tp.lua's shard_linear sets them through M.shard).
-- merge / unmerge / disable work unchanged: delta() = s B A is this rank's piece of the
-- update, shaped as its piece of the weight. merge_and_unload leaves the plain parallel
-- layers. lora.save gathers the adapters (a collective over the tp group; tp rank 0
-- writes the files of one process); lora.load puts each rank's pieces in (both in
-- lutra.lora.tp_peft). lora.count is this rank's entries. Not done: lora.apply after tp.parallelize (apply first).
local Linear = require "lutra.nn.linear"
local errors = require "lutra.errors"
local Dropout = require "lutra.nn.dropout"
local F = require "lutra.functional"
local create = require "lutra.create"
local grad = require "lutra.nn.grad"
local spec = require "lutra.dist.spec"
local linear = require "lutra.lora.linear"
local L = require "lutra.dist.tp_layers"
local tp_ops = require "lutra.dist.tp_ops"

local release = grad.release
local LoRALinear, is_lora = linear.LoRALinear, linear.is_lora

local M = {}

local function total(pieces)
  local n = 0
  for _, p in ipairs(pieces) do n = n + p[2] end
  return n
end

local function shape_of(t)
  local s = {}
  for i = 1, t.ndim do s[i] = t:size(i - 1) end
  return s
end

-- A module instance of class cls without running its init (no random draws: the
-- generator advances as in one process).
local function bare(cls)
  return setmetatable({_entries = {}, _by_key = {}, training = true}, cls)
end

-- A bias-free Linear holding w (out, in).
local function linear_of(w)
  local m = bare(Linear)
  m.in_features, m.out_features = w:size(1), w:size(0)
  m:param("weight", w)
  return m
end
M.linear_of = linear_of

local function whole(t) return grad.no_grad(function() return t:detach():clone() end) end

-- The settings and flags of the full LoRALinear, the dropout module, the flags of the
-- parameters (registration turns requires_grad on: back to the full layer's).
local function settings(self, full)
  if rawget(full, "lora_magnitude") ~= nil then
    errors.raise("tp: DoRA layers (lora.apply dora = true, peft's use_dora) are not tensor parallel in lutra")
  end
  self.r, self.alpha, self.rslora, self.scaling = full.r, full.alpha, full.rslora, full.scaling
  self.dropout_p = full.dropout_p
  rawset(self, "merged", full.merged)
  rawset(self, "disabled", full.disabled)
  rawset(self, "blocks", rawget(full, "blocks"))
  rawset(self, "_cols", rawget(full, "_cols"))
  rawset(self, "training", full.training)
end

local function dropout_of(self, full)
  if not full.lora_dropout then return end
  self.lora_dropout = Dropout(full.dropout_p)
  rawset(self.lora_dropout, "training", full.lora_dropout.training)
end

local function flags(self, full)
  grad.set_requires_grad(self.weight, full.weight.requires_grad)
  if self.bias ~= nil then grad.set_requires_grad(self.bias, full.bias.requires_grad) end
  grad.set_requires_grad(self.lora_A.weight, full.lora_A.weight.requires_grad)
  grad.set_requires_grad(self.lora_B.weight, full.lora_B.weight.requires_grad)
end


-- ---- column parallel ------------------------------------------------------------------------

local Column = LoRALinear:extend("ColumnParallelLoRALinear")
M.ColumnParallelLoRALinear = Column

-- full: a LoRALinear; pieces: this rank's rows ({{start, count}, ...}); opts as
-- ColumnParallelLinear's (input = "copy" | "gather" | "none", weight = a shared shard).
function Column:init(full, group, pieces, opts)
  opts = opts or {}
  local input = opts.input or "copy"
  rawset(self, "group", group)
  rawset(self, "input", input)
  rawset(self, "pieces", pieces)
  settings(self, full)
  self.in_features = full.in_features
  self.global_out_features = full.out_features
  self.out_features = total(pieces)
  self:param("weight", opts.weight or L.take(full.weight, 0, pieces))
  if full.bias ~= nil then self:param("bias", L.take(full.bias, 0, pieces)) end
  self.lora_A = linear_of(whole(full.lora_A.weight))
  self.lora_B = linear_of(L.take(full.lora_B.weight, 0, pieces))
  dropout_of(self, full)
  local mask = rawget(full, "_mask")
  if mask then rawset(self, "_mask", L.take(mask, 0, pieces)) end
  flags(self, full)
end

-- x (..., in) the same on every rank (or this rank's sequence piece with input "gather")
-- -> (..., out_local)
function Column:forward(x)
  local group = self.group
  local xi = x
  if self.input == "copy" then
    xi = tp_ops.copy_to(x, group)
  elseif self.input == "gather" then
    xi = tp_ops.gather_seq(x, group)
  end
  local y = F.linear(xi, self.weight, self.bias)
  if self.merged or self.disabled then
    release(xi, x)
    return y
  end
  local xd = self.lora_dropout and self.lora_dropout(xi) or xi
  local a = tp_ops.copy_to(self.lora_A.weight, group) -- its gradient summed over the ranks' rows
  local h = F.linear(xd, a) -- (..., r), the same on every rank
  release(xd, xi)
  release(xi, x)
  return self:add_update(y, h, self.lora_B.weight)
end

-- Trainable adapter entries on this rank: A, and B's rows (less the masked zeros).
function Column:adapter_size()
  local n = self.lora_A.weight:numel()
  local mask = rawget(self, "_mask")
  if mask then return n + grad.no_grad(function() return mask:sum():item() end) end
  return n + self.lora_B.weight:numel()
end

function Column:extra_repr()
  return string.format("%d, %d of %d, r=%d, alpha=%g, scaling=%g, tp=%d%s", self.in_features, self.out_features,
    self.global_out_features, self.r, self.alpha, self.scaling, self.group.size, self.merged and ", merged" or "")
end

-- The plain ColumnParallelLinear of this layer (lora.merge_and_unload).
function Column:unloaded()
  local m = bare(L.ColumnParallelLinear)
  rawset(m, "group", self.group)
  rawset(m, "input", self.input)
  m.in_features, m.out_features, m.global_out_features = self.in_features, self.out_features, self.global_out_features
  m:param("weight", self.weight)
  if self.bias ~= nil then m:param("bias", self.bias) end
  return m
end

-- ---- row parallel ---------------------------------------------------------------------------

local Row = LoRALinear:extend("RowParallelLoRALinear")
M.RowParallelLoRALinear = Row

-- full: a LoRALinear; pieces: this rank's columns; opts as RowParallelLinear's (output =
-- "reduce" | "reduce_scatter").
function Row:init(full, group, pieces, opts)
  opts = opts or {}
  rawset(self, "group", group)
  rawset(self, "output", opts.output or "reduce")
  rawset(self, "pieces", pieces)
  settings(self, full)
  self.global_in_features = full.in_features
  self.in_features = total(pieces)
  self.out_features = full.out_features
  self:param("weight", L.take(full.weight, 1, pieces))
  if full.bias ~= nil then self:param("bias", whole(full.bias)) end
  self.lora_A = linear_of(L.take(full.lora_A.weight, 1, pieces))
  self.lora_B = linear_of(whole(full.lora_B.weight))
  dropout_of(self, full)
  local mask = rawget(full, "_mask")
  if mask then rawset(self, "_mask", whole(mask)) end
  flags(self, full)
end

-- Dropout of x (..., in_local): the mask of the whole (..., in), this rank's columns.
local function dropout_columns(self, x)
  local d = self.lora_dropout
  if d == nil or not d.training or d.p == 0 then return x end
  local p = d.p
  local shape = x.shape
  shape[#shape] = self.global_in_features
  local mask = grad.no_grad(function()
    local full = create.bernoulli_(create.empty(shape, {dtype = x.dtype, device = x.device}), 1 - p)
    local piece = L.take(full, #shape - 1, self.pieces)
    full:free()
    return piece:mul_(1 / (1 - p))
  end)
  return x * mask
end

-- x (..., in_local), this rank's columns -> (..., out) on every rank (or this rank's
-- sequence piece with output "reduce_scatter")
function Row:forward(x)
  local group, scatter = self.group, self.output == "reduce_scatter"
  local partial = F.linear(x, self.weight)
  local y = scatter and tp_ops.reduce_scatter_seq(partial, group) or tp_ops.reduce_from(partial, group)
  release(partial, x, y)
  if self.bias ~= nil then
    local z = y + self.bias
    release(y, x)
    y = z
  end
  if self.merged or self.disabled then return y end
  local xd = dropout_columns(self, x)
  local hp = F.linear(xd, self.lora_A.weight) -- (..., r): this rank's part of A x
  release(xd, x)
  local h = scatter and tp_ops.reduce_scatter_seq(hp, group) or tp_ops.reduce_from(hp, group)
  release(hp, nil, h)
  local b = self.lora_B.weight
  if scatter then b = tp_ops.copy_to(b, group) end -- B saw this rank's tokens: summed in backward
  return self:add_update(y, h, b)
end

function Row:adapter_size() return self.lora_A.weight:numel() + self.lora_B.weight:numel() end

function Row:extra_repr()
  return string.format("%d of %d, %d, r=%d, alpha=%g, scaling=%g, tp=%d%s", self.in_features,
    self.global_in_features, self.out_features, self.r, self.alpha, self.scaling, self.group.size,
    self.merged and ", merged" or "")
end

function Row:unloaded()
  local m = bare(L.RowParallelLinear)
  rawset(m, "group", self.group)
  rawset(m, "output", self.output)
  m.in_features, m.out_features, m.global_in_features = self.in_features, self.out_features, self.global_in_features
  m:param("weight", self.weight)
  if self.bias ~= nil then m:param("bias", self.bias) end
  return m
end

-- ---- tp.lua's hooks ---------------------------------------------------------------------------

M.is_lora = is_lora

-- tp.parallelize's constructors: the LoRA variant when full is a LoRALinear.
function M.column(full, group, pieces, opts)
  if is_lora(full) then return Column(full, group, pieces, opts) end
  return L.ColumnParallelLinear(full, group, pieces, opts)
end

function M.row(full, group, pieces, opts)
  if is_lora(full) then return Row(full, group, pieces, opts) end
  return L.RowParallelLinear(full, group, pieces, opts)
end

-- The adapters' specs (m converted from full along dim: 0 column, 1 row); shard is tp.lua's
-- shard(t, global, dim, ranks, rank) for the cut one. The whole copies: dup on ranks > 0
-- (set here, so that tp.lua does not count them among its sequence-parallel sums: copy_to
-- already sums what must be).
function M.shard(m, full, dim, ranks, rank, shard)
  if not is_lora(m) then return end
  local A, B = m.lora_A.weight, m.lora_B.weight
  if dim == 0 then
    shard(B, shape_of(full.lora_B.weight), 0, ranks, rank)
    spec.set(A, {global = shape_of(A), dup = rank > 0})
  else
    shard(A, shape_of(full.lora_A.weight), 1, ranks, rank)
    spec.set(B, {global = shape_of(B), dup = rank > 0})
  end
end

-- Whether the module is one of this file's layers.
function M.is_parallel(m)
  local mt = getmetatable(m)
  return mt == Column or mt == Row
end

return M
