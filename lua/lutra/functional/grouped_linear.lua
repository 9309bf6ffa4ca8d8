-- lutra.functional.grouped_linear — F.grouped_linear, one linear layer per group of rows (the
-- experts' matmuls of a mixture of experts, lutra/nn/moe.lua), and its autograd declaration
-- (GroupedLinearBackward). Composed of lt_matmul calls on views, one per non-empty group.
--
--   F.grouped_linear(x, weight, counts)   x (M, in), weight (G, out, in), counts {n_1, ..., n_G}
--                                         -> y (M, out): rows 1..n_1 of x times weight[1]^T, the
--                                            next n_2 rows times weight[2]^T, ...
--
-- counts is a Lua list of G non-negative integers that sum to M (the rows must already be sorted
-- by group, as an argsort of the group ids and an index_select make them). weight holds the
-- groups' matrices stacked, so it is one parameter; a group with no rows gets a zero gradient.
-- Backward: dx's rows of group g = dy_g @ weight[g], dweight[g] = dy_g^T @ x_g, each written
-- straight into its slice of the gradient (no per-group gradient of the whole weight).
-- Under autocast (lutra.autocast) its f32 x and weight are cast per call, as F.linear's.
local errors = require "lutra.errors"
local create = require "lutra.create"
local op = require "lutra.autograd.op"
local fields = require "lutra.tensor.fields"
local shape = require "lutra.shape"
local U = require "lutra.functional.util"
local AC = require "lutra.autocast"
local C = require("lutra.ffi").C

local M = {}

local raise, fail = errors.raise, errors.fail
local need, tracked = U.need, U.tracked
local edge, attach, save = op.edge, op.attach, op.save

local record -- the declaration's, below

local function check(x, weight, counts)
  need("grouped_linear", "x", x)
  need("grouped_linear", "weight", weight)
  if x.ndim ~= 2 or weight.ndim ~= 3 or fields.size(x, 1) ~= fields.size(weight, 2) then
    raise(string.format("grouped_linear: expected x (M, in) and weight (G, out, in), got x %s and weight %s",
      shape.shape_string(x), shape.shape_string(weight)))
  end
  if not fields.same_kind(x, weight) then
    raise(string.format("grouped_linear: x is %s on %s, weight %s on %s", x.dtype, x.device, weight.dtype,
      weight.device))
  end
  local G = fields.size(weight, 0)
  if type(counts) ~= "table" or #counts ~= G then
    raise(string.format("grouped_linear: counts must be a list of %d row counts (one per group of weight), got %s",
      G, type(counts) == "table" and #counts .. " entries" or type(counts)))
  end
  local total = 0
  for g = 1, G do
    local n = counts[g]
    if type(n) ~= "number" or n < 0 or n ~= math.floor(n) then
      raise(string.format("grouped_linear: counts[%d] must be a non-negative integer, got %s", g, tostring(n)))
    end
    total = total + n
  end
  if total ~= fields.size(x, 0) then
    raise(string.format("grouped_linear: counts sum to %d, x has %d rows", total, fields.size(x, 0)))
  end
end

-- For every non-empty group g: out's view = op(a's view) @ op(b's view), where a view is either
-- the group's rows (narrow along dim 0) or the group's matrix (select along dim 0). Raw views made
-- with lt_narrow/lt_select, released at the end: nothing is recorded, no Lua tensor is made.
-- which = {out, a, b}: "rows" or "stacked" for each.
local function each_group(counts, out, a, b, trans_a, trans_b, which)
  local vo, va, vb = C.lt_tensor_new(), C.lt_tensor_new(), C.lt_tensor_new()
  local function view(v, t, kind, off, n, g)
    if kind == "rows" then return C.lt_narrow(v, t, 0, off, n) == 0 end
    return C.lt_select(v, t, 0, g - 1) == 0
  end
  local off, ok = 0, true
  for g = 1, #counts do
    local n = counts[g]
    if n > 0 then
      ok = view(vo, out, which[1], off, n, g) and view(va, a, which[2], off, n, g) and view(vb, b, which[3], off, n, g)
        and C.lt_matmul(vo, va, vb, trans_a, trans_b, 1.0, 0.0) == 0
      if not ok then break end
    end
    off = off + n
  end
  C.lt_release(vo)
  C.lt_release(va)
  C.lt_release(vb)
  if not ok then fail() end
end

-- Zeroes the matrices of stacked (G, ...) whose group has no rows (the others were written whole).
local function zero_empty_groups(stacked, counts)
  local v, ok = C.lt_tensor_new(), true
  for g = 1, #counts do
    if counts[g] == 0 then
      ok = C.lt_select(v, stacked, 0, g - 1) == 0 and C.lt_fill(v, 0) == 0
      if not ok then break end
    end
  end
  C.lt_release(v)
  if not ok then fail() end
end

local FORWARD, DX, DW = {"rows", "rows", "stacked"}, {"rows", "rows", "stacked"}, {"stacked", "rows", "rows"}

function M.grouped_linear(x, weight, counts)
  need("grouped_linear", "x", x)
  need("grouped_linear", "weight", weight)
  if AC.dtype then x, weight = AC.low(x), AC.low(weight) end
  check(x, weight, counts)
  local opts = {dtype = x.dtype, device = x.device}
  local y = create.empty({fields.size(x, 0), fields.size(weight, 1)}, opts)
  each_group(counts, y, x, weight, 0, 1, FORWARD) -- y_g = x_g @ weight[g]^T
  if tracked(x, weight) then record(y, x, weight, counts) end
  return y
end

record = op.declare {
  name = "GroupedLinearBackward", op = "grouped_linear", save = {"x", "w"},
  record = function(cls, y, x, w, counts)
    local ex, ew = edge(x), edge(w)
    local node = {ex, ew, cls = cls, counts = counts}
    if ex then save(node, "w", w) end
    if ew then save(node, "x", x) end
    attach(y, node)
  end,
  backward = function(n, g) -- g (M, out)
    g = g:contiguous()
    local opts = {dtype = g.dtype, device = g.device}
    local dx, dw
    if n[1] then -- dx_g = dy_g @ weight[g]
      dx = create.empty({fields.size(g, 0), fields.size(n.w, 2)}, opts)
      each_group(n.counts, dx, g, n.w, 0, 0, DX)
    end
    if n[2] then -- dweight[g] = dy_g^T @ x_g (zero for a group without rows)
      dw = create.empty({#n.counts, fields.size(g, 1), fields.size(n.x, 1)}, opts)
      each_group(n.counts, dw, g, n.x, 1, 0, DW)
      zero_empty_groups(dw, n.counts)
    end
    return dx, dw
  end,
  -- the same with recorded ops (gradients of gradients): one matmul per group on narrowed rows
  double_backward = function(n, g)
    local dx, dw, row = {}, {}, 0
    local opts = {dtype = g.dtype, device = g.device}
    for e, count in ipairs(n.counts) do
      local ge = g:narrow(0, row, count)
      if n[1] and count > 0 then dx[#dx + 1] = ge:matmul(n.w:select(0, e - 1)) end
      if n[2] then
        dw[e] = count > 0 and ge:t():matmul(n.x:narrow(0, row, count))
          or create.zeros({fields.size(g, 1), fields.size(n.x, 1)}, opts)
      end
      row = row + count
    end
    local gx = nil
    if n[1] then gx = #dx > 0 and create.cat(dx, 0) or create.zeros({0, fields.size(n.w, 2)}, opts) end
    return gx, n[2] and create.stack(dw, 0) or nil
  end,
}

return M
