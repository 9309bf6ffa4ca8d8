-- lutra.functional.tril — the lower and upper triangles of the last two dims (lt_tril, lt_triu:
-- host/ops/tril.c), every dtype; the rest is zero. The backward masks the gradient the same way.
--
--   F.tril(x, diagonal) -> out     keeps j - i <= diagonal (0 by default: the main diagonal)
--   F.triu(x, diagonal) -> out     keeps j - i >= diagonal
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local op = require "lutra.autograd.op"
local U = require "lutra.functional.util"
local C = lt.C

local M = {}

local new, fail, int_arg = memory.new, errors.fail, errors.int_arg
local need, tracked = U.need, U.tracked
local edge, attach = op.edge, op.attach

local FN = {tril = C.lt_tril, triu = C.lt_triu}

local function masked(name, x, diagonal)
  local out = new()
  if FN[name](out, x, diagonal) ~= 0 then fail() end
  return out
end

local record_tri = op.declare {
  name = "TrilBackward", op = {"tril", "triu"},
  record = function(cls, out, x, name, diagonal)
    attach(out, {edge(x), cls = cls, name = name, diagonal = diagonal})
  end,
  backward = function(n, g) return masked(n.name, g, n.diagonal) end,
  double_backward = function(n, g) return M[n.name](g, n.diagonal) end, -- recorded
}

for name in pairs(FN) do
  M[name] = function(x, diagonal)
    need(name, "x", x)
    diagonal = int_arg(name, diagonal, "diagonal", true) or 0
    local out = masked(name, x, diagonal)
    if tracked(x) then record_tri(out, x, name, diagonal) end
    return out
  end
end

return M
