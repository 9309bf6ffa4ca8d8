-- nn.CausalSelfAttention{d_model =, n_head =, n_kv_head = n_head, bias = true,
--   dropout = 0, rope = false, rope_theta = 10000, rope_freq =, window = 0, head_dim = d_model / n_head,
--   qk_norm = false, norm_eps = 1e-6, qkv_bias = bias, out_bias = bias, dtype =, device =}
--
-- Multi-head causal self-attention, x (B, T, C) -> (B, T, C), C = d_model. n_kv_head
-- below n_head shares each key/value head among n_head / n_kv_head query heads: GQA,
-- or MQA with n_kv_head = 1. One fused projection makes q, k and v:
--   qkv.weight is (H*D + 2*Hkv*D, C): rows [q heads | k heads | v heads], D = head_dim;
-- proj.weight (C, H*D) maps the heads back. qk_norm = true normalises each query and key head
-- (RMSNorm over D with q_norm.weight, k_norm.weight, eps norm_eps) before RoPE, as Qwen3 does.
-- rope = true rotates q and k by their positions (the "rotate half" convention of Hugging Face's
-- Llama); otherwise the model adds learned positions to its input. rope_freq = {inv_freq =,
-- scale =} replaces rope_theta with the D/2 frequencies of a Hugging Face rope type (llama3, yarn,
-- ...; a list or an f64 cpu tensor) and its attention_scaling (nil: 1), as F.rope takes them.
-- Dropout applies to the output (the fused attention kernel has no dropout on the attention
-- weights). window W > 0 makes it sliding-window
-- attention (Mistral, Qwen2): a query sees the W positions ending at its own.
--
-- forward(x, cache, pos): with a cache {k =, v =} (B, S_max, Hkv, D) tensors (made by
-- the model's kv_cache), the new keys and values are written at positions
-- [pos, pos + T) and the queries attend to everything up to there: incremental
-- decoding. Use it under lutra.no_grad.
--
-- forward(x, nil, 0, {positions =, segments =}): packed rows (training, no cache).
-- positions (B, T) i32/i64 are the RoPE positions of the tokens (restarting at 0 in each
-- document of a row); segments (B, T) i32/i64 the document of each token: a query only
-- attends to earlier keys of its own document. opts.cp: context parallel (lutra.dist.cp), x
-- this rank's tokens, positions their global ones.
local Module = require "lutra.nn.module"
local create = require "lutra.create"
local F = require "lutra.functional"
local errors = require "lutra.errors"
local O = require "lutra.nn.options"
local Linear = require "lutra.nn.linear"
local RMSNorm = require "lutra.nn.rms_norm"
local Dropout = require "lutra.nn.dropout"
local grad = require "lutra.nn.grad"
local op = require "lutra.autograd.op"
local S = require "lutra.autograd.state"
local lt = require "lutra.ffi"
local memory = require "lutra.memory"
local fields = require "lutra.tensor.fields"
local is_tracked = fields.is_tracked

local raise = errors.raise
local release = grad.release

local Attention = Module:extend("CausalSelfAttention")

local KEYS = {"d_model", "n_head", "n_kv_head", "bias", "dropout", "rope", "rope_theta", "rope_freq", "window",
              "head_dim", "qk_norm", "norm_eps", "qkv_bias", "out_bias", "dtype", "device"}

function Attention:init(cfg)
  local name = "CausalSelfAttention"
  cfg = O.check(name, cfg, KEYS)
  local C = O.positive_int(name, "d_model", cfg.d_model)
  local H = O.positive_int(name, "n_head", cfg.n_head)
  local Hkv = O.positive_int(name, "n_kv_head", cfg.n_kv_head or H)
  if cfg.head_dim == nil and C % H ~= 0 then
    raise(string.format("%s: d_model %d is not a multiple of n_head %d", name, C, H))
  end
  if H % Hkv ~= 0 then raise(string.format("%s: n_head %d is not a multiple of n_kv_head %d", name, H, Hkv)) end
  local D = cfg.head_dim and O.positive_int(name, "head_dim", cfg.head_dim) or C / H
  self.d_model, self.n_head, self.n_kv_head, self.head_dim = C, H, Hkv, D
  self.rope = O.boolean(name, "rope", cfg.rope, false)
  if self.rope then
    if D % 2 ~= 0 then raise(string.format("%s: rope needs an even head dim, got %d", name, D)) end
    self.rope_theta = O.positive(name, "rope_theta", cfg.rope_theta or 10000)
    if cfg.rope_freq ~= nil and cfg.rope_theta ~= nil then raise(name .. ": give rope_theta or rope_freq, not both") end
    if cfg.rope_freq ~= nil then self.rope_freq = F.rope_table(name .. ": rope_freq", cfg.rope_freq, D / 2) end
  elseif cfg.rope_freq ~= nil then
    raise(name .. ": rope_freq needs rope = true")
  end
  self.window = cfg.window and cfg.window ~= 0 and O.positive_int(name, "window", cfg.window) or 0
  local bias = O.boolean(name, "bias", cfg.bias, true)
  self.qkv = Linear(C, (H + 2 * Hkv) * D, {bias = O.boolean(name, "qkv_bias", cfg.qkv_bias, bias), dtype = cfg.dtype,
                                          device = cfg.device})
  self.proj = Linear(H * D, C, {bias = O.boolean(name, "out_bias", cfg.out_bias, bias), dtype = cfg.dtype,
                                device = cfg.device})
  if O.boolean(name, "qk_norm", cfg.qk_norm, false) then
    local norm = {eps = cfg.norm_eps, dtype = cfg.dtype, device = cfg.device}
    self.q_norm, self.k_norm = RMSNorm(D, norm), RMSNorm(D, norm)
  end
  self.drop = Dropout(cfg.dropout or 0)
end

local arange = create.arange

local function split(qkv, H, Hkv)
  return qkv:narrow(2, 0, H), qkv:narrow(2, H, Hkv), qkv:narrow(2, H + Hkv, Hkv)
end

-- q, k, v of qkv, q and k rotated when theta (at positions, or 0..T-1 when nil).
local function split_rotated(qkv, H, Hkv, theta, positions)
  local q, k, v = split(qkv, H, Hkv)
  if theta then
    local qr, kr = F.rope(q, positions, theta), F.rope(k, positions, theta)
    q:free() -- views: qkv keeps the storage
    k:free()
    q, k = qr, kr
  end
  return q, k, v
end

-- Attention straight from the fused projection qkv (B, T, H + 2 Hkv, D), recorded as one op
-- of qkv. Its backward has lt_attention_backward write dq, dk and dv into the three slices
-- of one dqkv: through the narrow views, autograd would build a zero tensor of qkv's shape
-- for each of q, k, v and sum the three (4x qkv's size in memory traffic, per layer). With
-- theta, q and k are rotated (RoPE, positions from 0) first; backward rotates them again
-- rather than keeping them, and rotates their gradients back into dqkv.
local record_qkv_attention = op.declare {
  name = "QKVAttentionBackward", save = {"qkv", "out", "lse"},
  record = function(cls, y, lse, qkv, H, Hkv, scale, theta, positions, segments, window)
    local node = {op.edge(qkv), cls = cls, H = H, Hkv = Hkv, scale = scale, theta = theta, positions = positions,
                  segments = segments, window = window}
    op.save(node, "qkv", qkv)
    op.save_output(node, "out", y)
    op.save(node, "lse", lse)
    op.attach(y, node)
  end,
  backward = function(n, g)
    local qkv = n.qkv
    local dqkv = memory.new()
    if lt.C.lt_empty(dqkv, qkv.ndim, fields.dims(qkv), fields.dtype_id(qkv), fields.device_id(qkv)) ~= 0 then
      errors.fail()
    end
    local q, k, v = split_rotated(qkv, n.H, n.Hkv, n.theta, n.positions)
    local dq, dk, dv = split(dqkv, n.H, n.Hkv)
    local dqr, dkr = dq, dk
    if n.theta then dqr, dkr = memory.new(), memory.new() end
    if lt.C.lt_attention_backward(dqr, dkr, dv, g, q, k, v, n.out, n.lse, n.segments, n.scale, 1, n.window) ~= 0 then
      errors.fail()
    end
    if n.theta then
      F.rope_backward(dqr, n.positions, n.theta, dq)
      F.rope_backward(dkr, n.positions, n.theta, dk)
    end
    return dqkv
  end,
  -- recorded (create_graph): q, k, v split and rotated again from qkv, the attention's and the
  -- rotations' backward with recorded ops, the three gradients put side by side
  double_backward = function(n, g)
    local q, k, v = split_rotated(n.qkv, n.H, n.Hkv, n.theta, n.positions)
    local dq, dk, dv = F.attention_backward_graph(g, q, k, v, {causal = true, scale = n.scale,
      segment_ids = n.segments, window = n.window})
    if n.theta then
      dq, dk = F.rope_backward_graph(dq, n.positions, n.theta), F.rope_backward_graph(dk, n.positions, n.theta)
    end
    return create.cat({dq, dk, dv}, 2)
  end,
}

-- The views and kernels of qkv_attention: one recorded op (run untracked).
local function attend(qkv, H, Hkv, scale, theta, positions, segments, window)
  local q, k, v = split_rotated(qkv, H, Hkv, theta, positions)
  local y, lse = F.scaled_dot_product_attention {q, k, v, causal = true, scale = scale, segment_ids = segments,
    window = window}
  q:free()
  k:free()
  v:free()
  return y, lse
end

local function qkv_attention(qkv, H, Hkv, scale, theta, positions, segments, window)
  local y, lse = op.untracked(attend, qkv, H, Hkv, scale, theta, positions, segments, window)
  if S.enabled and is_tracked(qkv) then
    record_qkv_attention(y, lse, qkv, H, Hkv, scale, theta, positions, segments, window)
  end
  return y
end

-- packed-row opts: {positions =, segments =} (B, T) integer tensors, or nil.
local function packed_args(opts, B, T)
  if opts == nil then return nil, nil end
  local function check(what, t)
    if t == nil then return nil end
    if type(t) ~= "cdata" or t.ndim ~= 2 or t:size(0) ~= B or t:size(1) ~= T then
      raise(string.format("CausalSelfAttention: %s must be a (B, T) = (%d, %d) integer tensor, got %s", what, B, T,
        type(t) == "cdata" and "[" .. table.concat(t.shape, ", ") .. "]" or type(t)))
    end
    return t
  end
  return check("positions", opts.positions), check("segments", opts.segments)
end

-- Writes the new keys and values k, v (B, T, Hkv, D) at [pos, pos + T) of the cache; returns the
-- cache's keys and values up to there.
local function cached_keys(cache, k, v, pos, T)
  if grad.grad_enabled() and (k.requires_grad or v.requires_grad) then
    raise("CausalSelfAttention: the key/value cache is for inference: run under lutra.no_grad")
  end
  local S_max = cache.k:size(1)
  if pos + T > S_max then
    raise(string.format("CausalSelfAttention: the cache holds %d positions; %d + %d do not fit", S_max, pos, T))
  end
  cache.k:narrow(1, pos, T):copy_(k)
  cache.v:narrow(1, pos, T):copy_(v)
  return cache.k:narrow(1, 0, pos + T), cache.v:narrow(1, 0, pos + T)
end

function Attention:forward(x, cache, pos, opts)
  if x.ndim ~= 3 or x:size(2) ~= self.d_model then
    raise(string.format("CausalSelfAttention: expected x (B, T, %d), got [%s]", self.d_model,
      table.concat(x.shape, ", ")))
  end
  local B, T = x:size(0), x:size(1)
  local H, Hkv, D = self.n_head, self.n_kv_head, self.head_dim
  pos = pos or 0
  local positions, segments = packed_args(opts, B, T)
  if cache ~= nil and (positions ~= nil or segments ~= nil) then
    raise("CausalSelfAttention: positions/segments (packed rows) are for training: not with a key/value cache")
  end
  local lin = self.qkv(x)
  local qkv = lin:view(B, T, H + 2 * Hkv, D)
  release(lin, x)
  if opts and opts.cp then return self:forward_cp(qkv, positions, opts.cp) end
  if self.q_norm ~= nil then return self:forward_qk_norm(qkv, cache, pos, positions, segments) end
  if cache == nil then
    local y = qkv_attention(qkv, H, Hkv, 1 / math.sqrt(D), self.rope and (self.rope_freq or self.rope_theta) or nil,
      positions, segments, self.window)
    release(qkv, x)
    local yv = y:view(B, T, H * D)
    release(y, x)
    local o = self.proj(yv)
    release(yv, x)
    return self.drop(o)
  end
  local q, k, v = split(qkv, H, Hkv)
  if self.rope then
    local positions = pos > 0 and arange(pos, pos + T, {device = q.device}) or nil
    q = F.rope(q, positions, self.rope_freq or self.rope_theta)
    k = F.rope(k, positions, self.rope_freq or self.rope_theta)
  end
  if cache ~= nil then k, v = cached_keys(cache, k, v, pos, T) end
  local y = F.scaled_dot_product_attention {q, k, v, causal = true, window = self.window}
  return self.drop(self.proj(y:view(B, T, H * D)))
end

-- The attention of qkv (B, T, H + 2 Hkv, D) with q and k normalised per head before RoPE: plain
-- autograd ops (the fused qkv op rotates the projection as it is).
function Attention:forward_qk_norm(qkv, cache, pos, positions, segments)
  local B, T = qkv:size(0), qkv:size(1)
  local H, Hkv, D = self.n_head, self.n_kv_head, self.head_dim
  local q, k, v = split(qkv, H, Hkv)
  q, k = self.q_norm(q:contiguous()), self.k_norm(k:contiguous())
  if self.rope then
    if positions == nil and pos > 0 then positions = arange(pos, pos + T, {device = q.device}) end
    local r = self.rope_freq or self.rope_theta
    q, k = F.rope(q, positions, r), F.rope(k, positions, r)
  end
  if cache ~= nil then k, v = cached_keys(cache, k, v, pos, T) end
  local y = F.scaled_dot_product_attention {q, k, v, causal = true, scale = 1 / math.sqrt(D), segment_ids = segments,
                                            window = self.window}
  return self.drop(self.proj(y:view(B, T, H * D)))
end

-- Context parallel (lutra.dist.cp): this rank's tokens of the rows, q and k rotated at their
-- global positions, ring attention over the cp group (cp_attention: the whole rows' masks).
function Attention:forward_cp(qkv, positions, ctx)
  local B, T = qkv:size(0), qkv:size(1)
  local H, Hkv, D = self.n_head, self.n_kv_head, self.head_dim
  local q, k, v = split(qkv, H, Hkv)
  if self.q_norm ~= nil then q, k = self.q_norm(q:contiguous()), self.k_norm(k:contiguous()) end
  if self.rope then
    local r = self.rope_freq or self.rope_theta
    q, k = F.rope(q, positions, r), F.rope(k, positions, r)
  end
  local y = require("lutra.dist.cp_attention").attention(q, k, v, ctx, 1 / math.sqrt(D), self.window)
  return self.drop(self.proj(y:view(B, T, H * D)))
end

-- Empty key/value buffers for `batch` sequences of up to `len` positions.
function Attention:new_cache(batch, len)
  local opts = {dtype = self.qkv.weight.dtype, device = self.qkv.weight.device}
  return {k = create.zeros(batch, len, self.n_kv_head, self.head_dim, opts),
          v = create.zeros(batch, len, self.n_kv_head, self.head_dim, opts)}
end

function Attention:extra_repr()
  local s = string.format("d_model=%d, n_head=%d", self.d_model, self.n_head)
  if self.n_kv_head ~= self.n_head then s = s .. ", n_kv_head=" .. self.n_kv_head end
  if self.head_dim * self.n_head ~= self.d_model then s = s .. ", head_dim=" .. self.head_dim end
  if self.q_norm ~= nil then s = s .. ", qk_norm" end
  if self.rope then
    s = s .. (self.rope_freq and ", rope_freq" or string.format(", rope_theta=%g", self.rope_theta))
  end
  if self.window > 0 then s = s .. ", window=" .. self.window end
  return s
end

return Attention
