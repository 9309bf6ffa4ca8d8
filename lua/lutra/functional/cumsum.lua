-- lutra.functional.cumsum — running sums and products along one dim (lt_cumsum, lt_cumprod:
-- host/ops/cumsum.c), float dtypes, with their backwards.
--
--   F.cumsum(x, dim) -> out        backward: the gradient's cumsum from the end of the row
--   F.cumprod(x, dim) -> out       backward: lt_cumprod_backward, exact where x has zeros (under
--                                  create_graph the same with recorded ops, (..., L, L) in memory)
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local op = require "lutra.autograd.op"
local U = require "lutra.functional.util"
local C = lt.C

local M = {}

local new, fail, int_arg = memory.new, errors.fail, errors.int_arg
local need, tracked = U.need, U.tracked
local edge, attach, save = op.edge, op.attach, op.save

local function cumsum_into(out, x, dim, reverse)
  if C.lt_cumsum(out, x, dim, reverse) ~= 0 then fail() end
  return out
end

-- The running sum from the end, recorded (CumsumBackward's double_backward): its gradient is
-- the running sum from the start.
local record_reverse_cumsum = op.declare {
  name = "ReverseCumsumBackward",
  record = function(cls, out, x, dim) attach(out, {edge(x), cls = cls, dim = dim}) end,
  backward = function(n, g) return M.cumsum(g, n.dim) end,
  twice_differentiable = true,
}

local record_cumsum = op.declare {
  name = "CumsumBackward", op = "cumsum",
  record = function(cls, out, x, dim) attach(out, {edge(x), cls = cls, dim = dim}) end,
  backward = function(n, g) return cumsum_into(new(), g, n.dim, 1) end,
  double_backward = function(n, g)
    local dx = cumsum_into(new(), g, n.dim, 1)
    if tracked(g) then record_reverse_cumsum(dx, g, n.dim) end
    return dx
  end,
}

-- dx of cumprod(x, dim) for g with recorded ops (create_graph), exact where x has zeros:
-- dx_i = sum_{j >= i} g_j prod_{k <= j, k ~= i} x_k, from the running products of x with x_i
-- replaced by 1, one row per i: (..., L, L) along the last two dims.
local function cumprod_backward_graph(g, x, dim)
  local ops = require "lutra.ops"
  local create = require "lutra.create"
  local last = x.ndim - 1
  if dim < 0 then dim = dim + x.ndim end
  local xt, gt = x:transpose(dim, last), g:transpose(dim, last)
  local L = xt:size(-1)
  local i = create.arange(L, {device = x.device})
  local diagonal = ops.eq(i:reshape(L, 1), i:reshape(1, L))
  local after = ops.ge(i:reshape(1, L), i:reshape(L, 1)) -- j >= i
  local shape = xt.shape
  table.insert(shape, #shape, L)
  local others = M.cumprod(ops.where(diagonal, 1, xt:unsqueeze(-2):expand(shape)), -1) -- [..., i, j]
  local dx = ops.sum(ops.where(after, ops.mul(others, gt:unsqueeze(-2)), 0), -1)
  return dx:transpose(dim, last)
end

local record_cumprod = op.declare {
  name = "CumprodBackward", op = "cumprod", save = {"x"},
  double_backward = function(n, g) return cumprod_backward_graph(g, n.x, n.dim) end,
  record = function(cls, out, x, dim)
    local node = {edge(x), cls = cls, dim = dim}
    save(node, "x", x)
    attach(out, node)
  end,
  backward = function(n, g)
    local dx = new()
    if C.lt_cumprod_backward(dx, g, n.x, n.dim) ~= 0 then fail() end
    return dx
  end,
}

function M.cumsum(x, dim)
  need("cumsum", "x", x)
  int_arg("cumsum", dim, "dim")
  local out = cumsum_into(new(), x, dim, 0)
  if tracked(x) then record_cumsum(out, x, dim) end
  return out
end

function M.cumprod(x, dim)
  need("cumprod", "x", x)
  int_arg("cumprod", dim, "dim")
  local out = new()
  if C.lt_cumprod(out, x, dim) ~= 0 then fail() end
  if tracked(x) then record_cumprod(out, x, dim) end
  return out
end

return M
