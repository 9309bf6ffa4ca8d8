-- lutra.functional.attention — F.scaled_dot_product_attention, its backward, and its autograd
-- declaration (AttentionBackward). The C side: lt_attention_forward / lt_attention_backward
-- (host/ops/attention.c).
--
--   F.scaled_dot_product_attention{q, k, v, causal=, scale=, segment_ids=, window=, out=}
--       -> out, lse; q (B, T, H, D), k, v (B, S, Hkv, D); scale 1/sqrt(D) by default
--   F.attention_backward{dout, q, k, v, out, lse, causal=, scale=, segment_ids=, window=} -> dq, dk, dv
--   F.attention_backward_graph(dout, q, k, v, {causal=, scale=, segment_ids=, window=}) -> dq, dk, dv
--       the same with recorded ops (gradients of gradients), the scores materialized
--
-- window (nil or 0: none) is a sliding window of causal attention: query t, at absolute position
-- t + S - T, sees the keys at positions p with t + S - T - p < window (Hugging Face's
-- sliding_window: window keys counting its own).
--
-- Under autocast (lutra.autocast) its f32 q, k, v are cast per call, through autograd.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local ops = require "lutra.ops"
local op = require "lutra.autograd.op"
local AC = require "lutra.autocast"
local U = require "lutra.functional.util"
local C = lt.C

local M = {}

local new, fail, raise = memory.new, errors.fail, errors.raise
local need, tensor_or_nil, tracked, writing = U.need, U.tensor_or_nil, U.tracked, U.writing
local edge, attach, save, save_output = op.edge, op.attach, op.save, op.save_output
local is_tensor = ops.is_tensor
local low = AC.low

local record_attention -- the declaration's, below

local function attention_args(args)
  if type(args) ~= "table" or is_tensor(args) then
    raise("scaled_dot_product_attention: expected a table {q, k, v, causal=, scale=, segment_ids=, window=}")
  end
  local q, k, v = args[1] or args.q, args[2] or args.k, args[3] or args.v
  need("scaled_dot_product_attention", "q", q)
  need("scaled_dot_product_attention", "k", k)
  need("scaled_dot_product_attention", "v", v)
  tensor_or_nil("scaled_dot_product_attention", "segment_ids", args.segment_ids)
  local scale = args.scale or 1 / math.sqrt(q:size(-1))
  local window = args.window or 0
  if type(window) ~= "number" or window ~= math.floor(window) then
    raise("scaled_dot_product_attention: window must be an integer (0 or nil: none), got " .. tostring(window))
  end
  return q, k, v, scale, args.causal and 1 or 0, args.segment_ids, window
end

function M.scaled_dot_product_attention(args)
  local q, k, v, scale, causal, seg, window = attention_args(args)
  if AC.dtype and args.out == nil then q, k, v = low(q), low(k), low(v) end
  writing("scaled_dot_product_attention", args.out, q, k, v)
  local out, lse = args.out or new(), new()
  if C.lt_attention_forward(out, lse, q, k, v, seg, scale, causal, window) ~= 0 then fail() end
  if tracked(q, k, v) then record_attention(out, lse, q, k, v, seg, scale, causal, window) end
  return out, lse
end

-- {dout, q, k, v, out, lse, causal=, scale=, segment_ids=, window=} -> dq, dk, dv
function M.attention_backward(args)
  local q, k, v, scale, causal, seg, window = attention_args {args[2], args[3], args[4], causal = args.causal,
    scale = args.scale, segment_ids = args.segment_ids, window = args.window}
  local dq, dk, dv = new(), new(), new()
  if C.lt_attention_backward(dq, dk, dv, args[1], q, k, v, args[5], args[6], seg, scale, causal, window) ~= 0 then
    fail()
  end
  return dq, dk, dv
end

-- The dtype's most negative finite value: masked scores (a fully masked row stays finite, its
-- weights are zeroed after the softmax, as the kernel's out 0).
local LOWEST = {f64 = -1.7976931348623157e308, f32 = -3.4028234663852886e38, bf16 = -3.3895313892515355e38,
                f16 = -65504}

local function either(a, b) return ops.gt(ops.add(a:to("f32"), b:to("f32")), 0) end -- a or b (bool)

-- dq, dk, dv of attention for dout (B, T, H, D) with recorded ops, so that they are differentiable
-- again (create_graph): the scores and weights P (B, H, T, S) are recomputed from q, k, v;
-- dV = P^T dO, dS = P (dO V^T - rowsum(P dO V^T)), dQ = scale dS K, dK = scale dS^T Q, kv heads'
-- gradients summed over their H / Hkv query heads.
function M.attention_backward_graph(dout, q, k, v, opts)
  opts = opts or {}
  local B, T, H, D = q:size(0), q:size(1), q:size(2), q:size(3)
  local S, Hkv = k:size(1), k:size(2)
  local group = math.floor(H / Hkv)
  local scale = opts.scale or 1 / math.sqrt(D)
  local function heads(t, n) -- (B, n, H', D) -> (B, H', n, D), kv heads repeated for their query heads
    t = t:permute(0, 2, 1, 3)
    if group > 1 and t:size(1) ~= H then t = t:unsqueeze(2):expand(B, Hkv, group, n, D):reshape(B, H, n, D) end
    return t
  end
  local qh, kh, vh, gh = heads(q, T), heads(k, S), heads(v, S), dout:permute(0, 2, 1, 3)
  local s = ops.mul(qh:matmul(kh:transpose(-1, -2)), scale) -- (B, H, T, S)
  local mask -- true where a score is hidden
  if opts.causal then
    local t = require("lutra.create").arange(T, {device = q.device}):reshape(T, 1) + (S - T)
    local p = require("lutra.create").arange(S, {device = q.device}):reshape(1, S)
    mask = ops.gt(p, t)
    if opts.window and opts.window > 0 then mask = either(mask, ops.ge(t - p, opts.window)) end
  end
  if opts.segment_ids ~= nil then
    local seg = opts.segment_ids
    local apart = ops.ne(seg:reshape(B, 1, T, 1), seg:reshape(B, 1, 1, S))
    mask = mask and either(mask, apart) or apart
  end
  if mask then s = ops.where(mask, LOWEST[q.dtype], s) end
  local p = ops.softmax(s, -1)
  if mask then p = ops.where(mask, 0, p) end
  local dv = p:transpose(-1, -2):matmul(gh) -- (B, H, S, D)
  local dp = gh:matmul(vh:transpose(-1, -2))
  local ds = ops.mul(p, ops.sub(dp, ops.sum(ops.mul(dp, p), -1, true)))
  local dq = ops.mul(ds:matmul(kh), scale)
  local dk = ops.mul(ds:transpose(-1, -2):matmul(qh), scale)
  local function back(t) -- (B, H, S, D) -> (B, S, Hkv, D)
    if group > 1 then t = ops.sum(t:reshape(B, Hkv, group, S, D), 2) end
    return t:permute(0, 2, 1, 3)
  end
  return dq:permute(0, 2, 1, 3), back(dk), back(dv)
end
local attention_backward_graph = M.attention_backward_graph

record_attention = op.declare {
  name = "AttentionBackward", op = "attention", save = {"q", "k", "v", "out", "lse", "segment_ids"},
  record = function(cls, out, lse, q, k, v, segment_ids, scale, causal, window)
    local node = {edge(q), edge(k), edge(v), cls = cls, scale = scale, causal = causal, window = window}
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
    if C.lt_attention_backward(dq, dk, dv, g, n.q, n.k, n.v, n.out, n.lse, n.segment_ids, n.scale, n.causal,
        n.window) ~= 0 then
      fail()
    end
    return n[1] and dq or nil, n[2] and dk or nil, n[3] and dv or nil
  end,
  double_backward = function(n, g)
    local dq, dk, dv = attention_backward_graph(g, n.q, n.k, n.v, {causal = n.causal == 1, scale = n.scale,
      segment_ids = n.segment_ids, window = n.window})
    return n[1] and dq or nil, n[2] and dk or nil, n[3] and dv or nil
  end,
}

return M
