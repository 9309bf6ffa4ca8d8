-- lutra.autograd.nn — the declarations of matmul/gemm and of the fused kernels (linear,
-- layer_norm, rms_norm, cross_entropy, embedding, rope, attention), whose backwards are the
-- C entry points (lt_*_backward), through lutra.F where it has them. Registered in
-- lutra.autograd.op's records under the op's name ("gemm", "layer_norm", ...). The fused
-- residual add + norm: lutra/autograd/add_norm.lua.
local lt = require "lutra.ffi"
local op = require "lutra.autograd.op"
local S = require "lutra.autograd.state"
local U = require "lutra.autograd.util"
local ops = require "lutra.ops"
local F = require "lutra.functional"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local dtype = require "lutra.dtype"
local fields = require "lutra.tensor.fields"
local C = lt.C

local declare, edge, attach, save, save_output = op.declare, op.edge, op.attach, op.save, op.save_output
local shape_of, reduce_to = U.shape_of, U.reduce_to
local gemm, mul = ops.gemm, ops.mul
local new, fail = memory.new, errors.fail

local function edge_or_false(t) return t ~= nil and edge(t) or false end

-- ---- matmul / gemm ---------------------------------------------------------------------
-- out = alpha op(a) op(b) + beta old (op: the transpose of the last two dims when trans_*).

declare {
  name = "MmBackward", op = "gemm", save = {"a", "b"},
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

-- ---- linear: y = x w^T + bias ------------------------------------------------------------

declare {
  name = "LinearBackward", op = "linear", save = {"x", "w"},
  record = function(cls, y, x, w, bias)
    local ex, ew = edge(x), edge(w)
    local node = {ex, ew, edge_or_false(bias), cls = cls}
    if ex then save(node, "w", w) end
    if ew then save(node, "x", x) end
    attach(y, node)
  end,
  backward = function(n, g) -- g (..., out)
    local gx, gw, gb
    local out_features = g:size(-1)
    local g2 = (n[2] or n[3]) and g:reshape(-1, out_features) or nil
    if n[1] then gx = ops.matmul(g, n.w) end
    if n[2] and n[3] and fields.same_dtype(g, n.x) then
      -- dW = g^T x and db = the row sums of g in one op: one GEMM on CUDA (the bias gradient in
      -- cuBLASLt's epilogue); on the CPU the same two steps as below, bit for bit
      gw, gb = new(), new()
      if C.lt_linear_backward_params(gw, gb, g2, n.x) ~= 0 then fail() end
      return gx, gw, gb
    end
    if n[2] then
      local x = n.x
      gw = gemm(g2, x:reshape(-1, x:size(-1)), {trans_a = true})
    end
    if n[3] then gb = ops.sum(g2, 0) end
    return gx, gw, gb
  end,
}

-- ---- layer_norm, rms_norm ------------------------------------------------------------------

declare {
  name = "LayerNormBackward", op = "layer_norm", save = {"x", "w", "mean", "rstd"},
  record = function(cls, out, x, w, b, mean, rstd)
    local node = {edge(x), edge_or_false(w), edge_or_false(b), cls = cls}
    save(node, "x", x)
    if w ~= nil then save(node, "w", w) end
    save(node, "mean", mean)
    save(node, "rstd", rstd)
    attach(out, node)
  end,
  backward = function(n, g)
    local dx, dw, db = F.layer_norm_backward(g, n.x, n.w, n.mean, n.rstd, nil, n[2], n[3])
    return n[1] and dx or nil, dw, db
  end,
}

declare {
  name = "RMSNormBackward", op = "rms_norm", save = {"x", "w", "rstd"},
  record = function(cls, out, x, w, rstd)
    local node = {edge(x), edge_or_false(w), cls = cls}
    save(node, "x", x)
    if w ~= nil then save(node, "w", w) end
    save(node, "rstd", rstd)
    attach(out, node)
  end,
  backward = function(n, g)
    local dx, dw = F.rms_norm_backward(g, n.x, n.w, n.rstd, nil, n[2])
    return n[1] and dx or nil, dw
  end,
}

-- ---- cross_entropy -----------------------------------------------------------------------------
-- loss: the mean over valid rows, the sum, or the per-row losses (reduction "none").

declare {
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
    return F.cross_entropy_backward(dlosses, logits, n.targets, n.lse, n.ignore_index, out)
  end,
}

-- ---- embedding, rope -----------------------------------------------------------------------------

declare {
  name = "EmbeddingBackward", op = "embedding", save = {"ids"},
  record = function(cls, out, ids, weight)
    local node = {edge(weight), cls = cls, wshape = shape_of(weight)}
    save(node, "ids", ids)
    attach(out, node)
  end,
  backward = function(n, g) return F.embedding_backward(g, n.ids, n.wshape) end,
}

declare {
  name = "RopeBackward", op = "rope", save = {"positions"},
  record = function(cls, out, x, positions, theta)
    local node = {edge(x), cls = cls, theta = theta}
    if positions ~= nil then save(node, "positions", positions) end
    attach(out, node)
  end,
  backward = function(n, g) return F.rope_backward(g, n.positions, n.theta) end,
}

-- ---- attention -------------------------------------------------------------------------------------

declare {
  name = "AttentionBackward", op = "attention", save = {"q", "k", "v", "out", "lse", "segment_ids"},
  record = function(cls, out, lse, q, k, v, segment_ids, scale, causal)
    local node = {edge(q), edge(k), edge(v), cls = cls, scale = scale, causal = causal}
    save(node, "q", q)
    save(node, "k", k)
    save(node, "v", v)
    save_output(node, "out", out)
    save(node, "lse", lse)
    if segment_ids ~= nil then save(node, "segment_ids", segment_ids) end
    attach(out, node)
  end,
  backward = function(n, g)
    local dq, dk, dv = new(), new(), new()
    if C.lt_attention_backward(dq, dk, dv, g, n.q, n.k, n.v, n.out, n.lse, n.segment_ids, n.scale, n.causal) ~= 0 then
      fail()
    end
    return n[1] and dq or nil, n[2] and dk or nil, n[3] and dv or nil
  end,
}

return {}
