-- lutra.functional.topk — the k largest (smallest) along one dim and their indices
-- (lt_topk: host/ops/topk.c, the first k of sort's rows).
--
--   F.topk(x, k, dim, largest, sorted) -> values, indices   dim -1, largest true by default
--
-- The results are always sorted (`sorted` is accepted for torch's signature); a tie keeps the
-- lower index first; NaN counts as the largest value, as in torch. The values are
-- differentiable: the gradient goes back to the indices (SortBackward, functional/sort.lua).
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local U = require "lutra.functional.util"
local records = require("lutra.autograd.op").records
local C = lt.C

local M = {}

local new, fail, int_arg = memory.new, errors.fail, errors.int_arg
local need, tracked = U.need, U.tracked

function M.topk(x, k, dim, largest, sorted)
  need("topk", "x", x)
  int_arg("topk", k, "k")
  dim = int_arg("topk", dim, "dim", true) or -1
  local _ = sorted -- the results are always sorted
  local values, indices = new(), new()
  if C.lt_topk(values, indices, x, k, dim, largest == false and 0 or 1) ~= 0 then fail() end
  if tracked(x) then records.topk(values, x, indices, dim) end
  return values, indices
end

return M
