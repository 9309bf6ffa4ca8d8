-- lutra.functional.sort — sort and argsort along one dim (lt_sort: host/ops/sort.c), and the
-- backward that topk shares: the gradient of the values scattered back to their indices.
--
--   F.sort(x, dim, descending, stable) -> values, indices   dim -1 by default; indices i64
--   F.argsort(x, dim, descending, stable) -> indices
--   F.sort_backward(grad, indices, dim, n) -> grad_in       n: the length of x along dim
--
-- The order is always the stable one (`stable` is accepted for torch's signature): equal values
-- keep their index order, NaN counts as larger than every number (last ascending, first
-- descending), as torch's stable sort. Only the values are differentiable.
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

function M.sort_backward(grad, indices, dim, n, out)
  out = out or new()
  if C.lt_sort_backward(out, grad, indices, dim, n) ~= 0 then fail() end
  return out
end
local sort_backward = M.sort_backward

-- Records values = x's elements at indices along dim (sort; topk as op.records.topk).
local record_picked = op.declare {
  name = "SortBackward", op = {"sort", "topk"}, save = {"indices"},
  record = function(cls, values, x, indices, dim)
    local node = {edge(x), cls = cls, dim = dim, n = x.ndim > 0 and x:size(dim) or 1}
    save(node, "indices", indices)
    attach(values, node)
  end,
  backward = function(n, g) return sort_backward(g, n.indices, n.dim, n.n) end,
  double_backward = function(n, g) -- g scattered to its indices in zeros, recorded
    if g.ndim == 0 then return g end
    local shape, dim = g.shape, n.dim < 0 and n.dim + g.ndim or n.dim
    shape[dim + 1] = n.n
    local z = require("lutra.create").zeros(shape, {dtype = g.dtype, device = g.device})
    return require("lutra.functional.gather").scatter(z, dim, n.indices, g)
  end,
}

function M.sort(x, dim, descending, stable)
  need("sort", "x", x)
  dim = int_arg("sort", dim, "dim", true) or -1
  local _ = stable -- every sort is stable
  local values, indices = new(), new()
  if C.lt_sort(values, indices, x, dim, descending and 1 or 0) ~= 0 then fail() end
  if tracked(x) then record_picked(values, x, indices, dim) end
  return values, indices
end

function M.argsort(x, dim, descending, stable)
  need("argsort", "x", x)
  dim = int_arg("argsort", dim, "dim", true) or -1
  local _ = stable
  local values, indices = new(), new()
  if C.lt_sort(values, indices, x, dim, descending and 1 or 0) ~= 0 then fail() end
  return indices
end

return M
