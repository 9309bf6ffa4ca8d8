-- lutra.autograd.nn — records and backward formulas of matmul/gemm and of the fused
-- kernels (linear, layer_norm, rms_norm, add_layer_norm, add_rms_norm, cross_entropy,
-- embedding, rope, attention), whose backwards are the C entry points (lt_*_backward)
-- through lutra.F.
local lt = require "lutra.ffi"
local S = require "lutra.autograd.state"
local U = require "lutra.autograd.util"
local ops = require "lutra.ops"
local F = require "lutra.functional"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local C = lt.C

local edge, attach, save, save_output, class = S.edge, S.attach, S.save, S.save_output, S.class
local shape_of, reduce_to = U.shape_of, U.reduce_to
local gemm, mul = ops.gemm, ops.mul
local new, fail = memory.new, errors.fail

-- ---- matmul / gemm ---------------------------------------------------------------------
-- out = alpha op(a) op(b) + beta old (op: the transpose of the last two dims when trans_*).

local Gemm = class("MmBackward", {"a", "b"})

function S.gemm(out, a, b, ta, tb, alpha, beta, old)
  local ea, eb = edge(a), edge(b)
  local node = {ea, eb, old ~= nil and edge(old) or false, cls = Gemm, ta = ta, tb = tb, alpha = alpha, beta = beta}
  if ea then
    node.sa = shape_of(a)
    save(node, "b", "ver_b", b)
  end
  if eb then
    node.sb = shape_of(b)
    save(node, "a", "ver_a", a)
  end
  attach(out, node)
end

function Gemm.backward(n, g)
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
end

-- ---- linear: y = x w^T + bias ------------------------------------------------------------

local Linear = class("LinearBackward", {"x", "w"})

function S.linear(y, x, w, bias)
  local ex, ew = edge(x), edge(w)
  local node = {ex, ew, bias ~= nil and edge(bias) or false, cls = Linear}
  if ex then save(node, "w", "ver_w", w) end
  if ew then save(node, "x", "ver_x", x) end
  attach(y, node)
end

function Linear.backward(n, g) -- g (..., out)
  local gx, gw, gb
  local out_features = g:size(-1)
  local g2 = (n[2] or n[3]) and g:reshape(-1, out_features) or nil
  if n[1] then gx = ops.matmul(g, n.w) end
  if n[2] and n[3] and g.dtype_ == n.x.dtype_ then
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
end

-- ---- layer_norm, rms_norm ------------------------------------------------------------------

local LayerNorm = class("LayerNormBackward", {"x", "w", "mean", "rstd"})

function S.layer_norm(out, x, w, b, mean, rstd)
  local node = {edge(x), w ~= nil and edge(w) or false, b ~= nil and edge(b) or false, cls = LayerNorm}
  save(node, "x", "ver_x", x)
  if w ~= nil then save(node, "w", "ver_w", w) end
  save(node, "mean", "ver_mean", mean)
  save(node, "rstd", "ver_rstd", rstd)
  attach(out, node)
end

function LayerNorm.backward(n, g)
  local dx = new()
  local dw = n[2] and new() or nil
  local db = n[3] and new() or nil
  if C.lt_layer_norm_backward(dx, dw, db, g, n.x, n.w, n.mean, n.rstd) ~= 0 then fail() end
  return n[1] and dx or nil, dw, db
end

local RMSNorm = class("RMSNormBackward", {"x", "w", "rstd"})

function S.rms_norm(out, x, w, rstd)
  local node = {edge(x), w ~= nil and edge(w) or false, cls = RMSNorm}
  save(node, "x", "ver_x", x)
  if w ~= nil then save(node, "w", "ver_w", w) end
  save(node, "rstd", "ver_rstd", rstd)
  attach(out, node)
end

function RMSNorm.backward(n, g)
  local dx = new()
  local dw = n[2] and new() or nil
  if C.lt_rms_norm_backward(dx, dw, g, n.x, n.w, n.rstd) ~= 0 then fail() end
  return n[1] and dx or nil, dw
end

-- ---- cross_entropy -----------------------------------------------------------------------------
-- loss: the mean over valid rows, the sum, or the per-row losses (reduction "none").

local CrossEntropy = class("CrossEntropyBackward", {"logits", "targets", "lse", "valid"})

function S.cross_entropy(loss, logits, targets, lse, ignore_index, reduction, valid)
  local node = {edge(logits), cls = CrossEntropy, ignore_index = ignore_index, reduction = reduction}
  save(node, "logits", "ver_logits", logits)
  save(node, "targets", "ver_targets", targets)
  save(node, "lse", "ver_lse", lse)
  if valid ~= nil then save(node, "valid", "ver_valid", valid) end
  attach(loss, node)
end

function CrossEntropy.backward(n, g)
  local rows = n.lse:size(0)
  local dlosses
  if n.reduction == "none" then
    dlosses = g:reshape(rows)
  else
    if n.reduction == "mean" then g = ops.div(g, n.valid:to(require("lutra.dtype").name(g.dtype_))) end
    dlosses = g:reshape(1):expand(rows):contiguous()
  end
  -- The logits are dead once this node ran: when autograd's alias is all that holds their
  -- storage, their gradient overwrites them (one logits-sized buffer less at backward's peak).
  local logits, out = n.logits, nil
  if logits.view_ == 2 and logits.storage.refcount == 1 and C.lt_is_contiguous(logits) ~= 0
      and not S.retain_graph then
    out = logits
  end
  return F.cross_entropy_backward(dlosses, logits, n.targets, n.lse, n.ignore_index, out)
end

-- ---- embedding, rope -----------------------------------------------------------------------------

local Embedding = class("EmbeddingBackward", {"ids"})

function S.embedding(out, ids, weight)
  local node = {edge(weight), cls = Embedding, wshape = shape_of(weight)}
  save(node, "ids", "ver_ids", ids)
  attach(out, node)
end

function Embedding.backward(n, g) return F.embedding_backward(g, n.ids, n.wshape) end

local Rope = class("RopeBackward", {"positions"})

function S.rope(out, x, positions, theta)
  local node = {edge(x), cls = Rope, theta = theta}
  if positions ~= nil then save(node, "positions", "ver_positions", positions) end
  attach(out, node)
end

function Rope.backward(n, g) return F.rope_backward(g, n.positions, n.theta) end

-- ---- attention -------------------------------------------------------------------------------------

local Attention = class("AttentionBackward", {"q", "k", "v", "out", "lse", "segment_ids"})

function S.attention(out, lse, q, k, v, segment_ids, scale, causal)
  local node = {edge(q), edge(k), edge(v), cls = Attention, scale = scale, causal = causal}
  save(node, "q", "ver_q", q)
  save(node, "k", "ver_k", k)
  save(node, "v", "ver_v", v)
  save_output(node, "out", "ver_out", out)
  save(node, "lse", "ver_lse", lse)
  if segment_ids ~= nil then save(node, "segment_ids", "ver_segment_ids", segment_ids) end
  attach(out, node)
end

function Attention.backward(n, g)
  local dq, dk, dv = new(), new(), new()
  if C.lt_attention_backward(dq, dk, dv, g, n.q, n.k, n.v, n.out, n.lse, n.segment_ids, n.scale, n.causal) ~= 0 then
    fail()
  end
  return n[1] and dq or nil, n[2] and dk or nil, n[3] and dv or nil
end

-- ---- add_layer_norm, add_rms_norm: res = x + residual, y = norm(res) --------------------------------
-- Two outputs that both take gradients. res carries the op's node (AddNormBackward: edges x,
-- residual, weight, bias); y's record (AddNormOutput) hands y's gradient to that node, as
-- checkpoint's outputs do. The node runs once res's own gradient (from its other uses) and y's
-- have both arrived, and one kernel gives dx = norm_backward(dy) + dres for x and residual.

local AddNorm = class("AddNormBackward", {"res", "w", "mean", "rstd"})
AddNorm.always = true -- runs from y's gradient even when res got none of its own

-- It keeps an alias of y's gradient: a reference of its own to the storage, made outside the
-- formula's temporaries. The engine then frees the gradient as usual, and the storage lives
-- until AddNormBackward used and freed the alias. (The extra reference also keeps the engine
-- from summing into that storage in place meanwhile.)
local AddNormOutput = class("AddNormOutput")
function AddNormOutput.backward(n, g)
  local owner = memory.set_owner(nil)
  n[1].dy = S.alias(g)
  memory.set_owner(owner)
  return require("lutra.autograd.engine").DELIVERED
end

-- mean is nil for rms_norm.
function S.add_norm(res, y, x, residual, w, b, mean, rstd)
  local node = {edge(x), edge(residual), w ~= nil and edge(w) or false, b ~= nil and edge(b) or false, cls = AddNorm,
                center = mean ~= nil}
  save_output(node, "res", "ver_res", res)
  if w ~= nil then save(node, "w", "ver_w", w) end
  if mean ~= nil then save(node, "mean", "ver_mean", mean) end
  save(node, "rstd", "ver_rstd", rstd)
  attach(res, node)
  attach(y, {node, cls = AddNormOutput})
end

function AddNorm.backward(n, g) -- g: res's own gradient (nil when it had none)
  local dy = n.dy
  n.dy = nil
  if dy == nil then -- y took no gradient: res's passes through the add
    if g == nil then return nil end
    return g, g
  end
  local dx = new()
  local dw = n[3] and new() or nil
  local db = n[4] and new() or nil
  local rc
  if n.center then
    rc = C.lt_layer_norm_backward_add(dx, dw, db, dy, g, n.res, n.w, n.mean, n.rstd)
  else
    rc = C.lt_rms_norm_backward_add(dx, dw, dy, g, n.res, n.w, n.rstd)
  end
  dy:free()
  if rc ~= 0 then fail() end
  local gx = (n[1] or n[2]) and dx or nil
  return {n[1] and gx or nil, n[2] and gx or nil, dw, db}
end

return {}
