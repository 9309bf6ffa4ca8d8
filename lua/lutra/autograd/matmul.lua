-- lutra.autograd.matmul — the declaration of matmul and gemm (MmBackward, record "gemm"), the
-- ops of lutra/ops/matmul.lua, which look the record up by name: this module needs lutra.ops
-- for the math of its backward, so it cannot sit in ops/matmul.lua.
-- out = alpha op(a) op(b) + beta old (op: the transpose of the last two dims when trans_*).
local op = require "lutra.autograd.op"
local U = require "lutra.autograd.util"
local ops = require "lutra.ops"

local declare, edge, attach, save = op.declare, op.edge, op.attach, op.save
local shape_of, reduce_to = U.shape_of, U.reduce_to
local gemm, mul = ops.gemm, ops.mul

local function edge_or_false(t) return t ~= nil and edge(t) or false end

declare {
  name = "MmBackward", twice_differentiable = true, op = "gemm", save = {"a", "b"},
  record = function(cls, out, a, b, ta, tb, alpha, beta, old)
    local ea, eb = edge(a), edge(b)
    local node = {ea, eb, edge_or_false(old), cls = cls, ta = ta, tb = tb, alpha = alpha, beta = beta}
    if ea then
      node.sa = shape_of(a)
      save(node, "b", b)
    end
    if eb then
      node.sb = shape_of(b)
      save(node, "a", a)
    end
    attach(out, node)
  end,
  backward = function(n, g)
    local ta, tb, alpha = n.ta, n.tb, n.alpha
    local ga, gb, gold
    if n[1] then -- d op(a) = g op(b)^T
      if ta then
        ga = gemm(n.b, g, {trans_a = tb, trans_b = true, alpha = alpha})
      else
        ga = gemm(g, n.b, {trans_b = not tb, alpha = alpha})
      end
      ga = reduce_to(ga, n.sa)
    end
    if n[2] then -- d op(b) = op(a)^T g
      if tb then
        gb = gemm(g, n.a, {trans_a = true, trans_b = ta, alpha = alpha})
      else
        gb = gemm(n.a, g, {trans_a = not ta, alpha = alpha})
      end
      gb = reduce_to(gb, n.sb)
    end
    if n[3] then gold = mul(g, n.beta) end
    return ga, gb, gold
  end,
}

return {}
