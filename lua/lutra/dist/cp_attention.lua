-- lutra.dist.cp_attention — ring attention over a context-parallel group (lutra.dist.cp).
--
--   y = cp_attention.attention(q, k, v, ctx, scale, window)
--       q (B, Tl, H, D), k, v (B, Tl, Hkv, D): this rank's tokens (lutra.dist.cp.split); y as q;
--       window (0 or nil: none): sliding-window attention (a query sees the `window` positions
--       ending at its own), as F.scaled_dot_product_attention
--
-- Causal attention over the whole rows: the key/value blocks of the cp ranks travel around
-- the ring (send to rank + 1, receive from rank - 1, posted before the block at hand is
-- computed so that the transfer overlaps it); each block's scores are masked by the global
-- positions of its queries and keys (and, for packed rows, their segments) and merged into
-- the running output with the online softmax: running max m, running sum l,
--   m' = max(m, rowmax S), acc' = acc e^(m - m') + e^(S - m') V, l' = l e^(m - m') + rowsum e^(S - m'),
-- y = acc / l, lse = m + log l. Step 0 is the rank's own block, where every query sees
-- itself: m is finite from the start.
--
-- Backward sends the blocks around again with their dK, dV accumulators: with the final y
-- and lse, P = e^(S - lse) of a block is exact, delta = rowsum(dY * y), dS = P (dY V^T - delta),
-- dQ += scale dS K, dK += scale dS^T Q, dV += P^T dY; a block's accumulators are sent on while
-- the next block computes, and after the last block one more hop brings each dK, dV home.
-- GQA: each kv head serves H / Hkv query heads (its gradients summed over them).
--
-- Two ways to compute a block. f32, bf16, f16 without segments or window: the fused kernel
-- (F.scaled_dot_product_attention, no (T, T) scores in memory) on each pair of a query chunk and
-- a key chunk, causal on the diagonal, whole below it, skipped above; the pairs merged by their
-- log-sum-exp. f64, packed segments (the kernel takes one segment tensor for queries and keys)
-- or sliding windows (its window is relative to aligned ends): plain ops (matmul, exp, max) on
-- the whole block with its mask, exact in f64 where the kernel's f32 log-sum-exp is not.
-- Not yet: a fused kernel for segments and windows across chunks (bf16/f16 with them).
local create = require "lutra.create"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local ops = require "lutra.ops"
local op = require "lutra.autograd.op"
local U = require "lutra.functional.util"
local cp = require "lutra.dist.cp"

local raise = errors.raise
local tidy = memory.tidy

local M = {}

-- The dtype's most negative finite value (masked scores; see functional/attention.lua).
local LOWEST = {f64 = -1.7976931348623157e308, f32 = -3.4028234663852886e38}

local Fattn = require "lutra.functional.attention"

local function either(a, b) return ops.gt(ops.add(a:to("f32"), b:to("f32")), 0) end -- a or b (bool)

-- The hidden scores (true: masked) of this rank's queries against the keys of cp rank j (with
-- a sliding window > 0: also the keys `window` or more positions back):
-- (Tl, Tl), or (B, 1, Tl, Tl) with segments; made once per forward, kept in the context.
local function hidden(ctx, j, device, window)
  ctx.masks = ctx.masks or {}
  local key = j .. ":" .. window
  if ctx.masks[key] then return ctx.masks[key] end
  local n, c = ctx.n, ctx.chunk
  local Tl = 2 * c
  local gq = create.tensor(cp.indices(ctx.rank, n, c), {dtype = "i64", device = device}):reshape(Tl, 1)
  local gk = create.tensor(cp.indices(j, n, c), {dtype = "i64", device = device}):reshape(1, Tl)
  local mask = ops.gt(gk, gq)
  if window > 0 then mask = either(mask, ops.ge(ops.sub(gq, gk), window)) end -- (Hugging Face's sliding window)
  if ctx.segments ~= nil then
    local seg = ctx.segments
    local B = seg:size(0)
    local sq, sk = cp.take(seg, ctx.rank, n), cp.take(seg, j, n)
    mask = either(mask:reshape(1, 1, Tl, Tl), ops.ne(sq:reshape(B, 1, Tl, 1), sk:reshape(B, 1, 1, Tl)))
  end
  memory.keep(mask)
  ctx.masks[key] = mask
  return mask
end

-- (B, T, Hkv, D) -> (B, H, T, D): heads first, kv heads repeated for their query heads.
local function heads(t, H)
  local B, T, Hkv, D = t:size(0), t:size(1), t:size(2), t:size(3)
  t = t:permute(0, 2, 1, 3)
  if Hkv ~= H then t = t:unsqueeze(2):expand(B, Hkv, H / Hkv, T, D):reshape(B, H, T, D) end
  return t:contiguous()
end

-- (B, H, T, D) gradients -> (B, Hkv, T, D): summed over the query heads of each kv head.
local function kv_heads(t, Hkv)
  local B, H, T, D = t:size(0), t:size(1), t:size(2), t:size(3)
  if Hkv == H then return t end
  return ops.sum(t:reshape(B, Hkv, H / Hkv, T, D), 2)
end

-- The ring exchange of a list of tensors: each to rank + 1, into fresh buffers from rank - 1.
-- Returns the handle and the buffers. (tag: the gradients' own, apart from the blocks'.)
local function pass(ctx, list, tag)
  local g, n = ctx.group, ctx.n
  local items, bufs = {}, {}
  for i, t in ipairs(list) do
    bufs[i] = create.empty_like(t)
    items[#items + 1] = {"send", t, (ctx.rank + 1) % n}
    items[#items + 1] = {"recv", bufs[i], (ctx.rank - 1) % n}
  end
  return g:p2p(items, {tag = tag}), bufs
end

-- Frees the storage of the tensors of a list that are not `keep` (ring buffers done with: the
-- allocator gets them back now, not at the next collection).
local function drop(list, keep)
  for _, t in ipairs(list) do
    if t ~= keep then t:free() end
  end
end

-- The next block of the ring once its transfer h is done; the one done with is dropped (not
-- the rank's own k, v: autograd keeps them).
local function advance(h, next, kb, vb, k, v)
  h:wait()
  drop({kb}, k)
  drop({vb}, v)
  return next[1], next[2]
end

local function scores(qh, k, H, scale, mask)
  local s = ops.mul(qh:matmul(heads(k, H):transpose(-1, -2)), scale) -- (B, H, Tl, Tl)
  return ops.where(mask, LOWEST[qh.dtype], s)
end

-- y (B, Tl, H, D) and lse (B, H, Tl, 1) of ring attention.
local function forward(q, k, v, ctx, scale, window)
  local H = q:size(2)
  local qh = q:permute(0, 2, 1, 3):contiguous()
  local acc, l, m
  local kb, vb = k:contiguous(), v:contiguous()
  for step = 0, ctx.n - 1 do
    local j = (ctx.rank - step) % ctx.n
    local h, next
    if step < ctx.n - 1 then h, next = pass(ctx, {kb, vb}) end
    local mask = hidden(ctx, j, q.device, window)
    local pacc, pl, pm = acc, l, m
    acc, l, m = tidy(function()
      local s = scores(qh, kb, H, scale, mask)
      local mb = ops.max(s, -1, true)
      local mn = m and ops.maximum(m, mb) or mb
      local p = ops.where(mask, 0, ops.exp(ops.sub(s, mn)))
      local pv, ps = p:matmul(heads(vb, H)), ops.sum(p, -1, true)
      if m == nil then return pv, ps, mn end
      local alpha = ops.exp(ops.sub(m, mn))
      return ops.add(ops.mul(acc, alpha), pv), ops.add(ops.mul(l, alpha), ps), mn
    end)
    if pacc then drop({pacc, pl, pm}) end
    if h then kb, vb = advance(h, next, kb, vb, k, v) end
  end
  if ctx.n > 1 then drop({kb, vb}) end
  local y = ops.div(acc, l):permute(0, 2, 1, 3):contiguous()
  local lse = ops.add(m, ops.log(l))
  return y, lse
end

-- The backward ring: share(kb, vb, j) adds the block of cp rank j's part into this rank's dq and
-- returns the block's dK, dV shares. The accumulators follow their block one step behind, sent
-- while the next block computes; the last hop takes them home. Returns this rank's dK, dV.
local function backward_ring(ctx, k, v, share)
  local n = ctx.n
  local kb, vb = k:contiguous(), v:contiguous()
  local hacc, got, sent
  for step = 0, n - 1 do
    local j = (ctx.rank - step) % n
    local h, next
    if step < n - 1 then h, next = pass(ctx, {kb, vb}) end
    local dk, dv = share(kb, vb, j)
    if hacc then
      hacc:wait()
      drop(sent)
      local sk, sv = ops.add(got[1], dk), ops.add(got[2], dv)
      drop({got[1], got[2], dk, dv})
      dk, dv = sk, sv
    end
    sent = {dk, dv}
    hacc, got = pass(ctx, sent, 1)
    if h then kb, vb = advance(h, next, kb, vb, k, v) end
  end
  hacc:wait()
  drop(sent)
  if n > 1 then drop({kb, vb}) end
  return got[1], got[2]
end

-- dq, dk, dv of ring attention for dy (B, Tl, H, D).
local function backward(dy, q, k, v, y, lse, ctx, scale, window)
  local H, Hkv = q:size(2), k:size(2)
  local qh, dyh = q:permute(0, 2, 1, 3):contiguous(), dy:permute(0, 2, 1, 3):contiguous()
  local delta = ops.sum(ops.mul(dyh, y:permute(0, 2, 1, 3)), -1, true) -- (B, H, Tl, 1)
  local dq = create.zeros_like(qh)
  local dk, dv = backward_ring(ctx, k, v, function(kb, vb, j)
    local mask = hidden(ctx, j, q.device, window)
    return tidy(function()
      local kh = heads(kb, H)
      local s = ops.mul(qh:matmul(kh:transpose(-1, -2)), scale)
      local p = ops.where(mask, 0, ops.exp(ops.sub(s, lse)))
      local dvs = kv_heads(p:transpose(-1, -2):matmul(dyh), Hkv)
      local dp = dyh:matmul(heads(vb, H):transpose(-1, -2))
      local ds = ops.mul(p, ops.sub(dp, delta))
      ops.add(dq, ops.mul(ds:matmul(kh), scale), dq)
      local dks = kv_heads(ops.mul(ds:transpose(-1, -2):matmul(qh), scale), Hkv)
      return dks:permute(0, 2, 1, 3):contiguous(), dvs:permute(0, 2, 1, 3):contiguous() -- (B, Tl, Hkv, D)
    end)
  end)
  return dq:permute(0, 2, 1, 3):contiguous(), dk, dv
end

-- ---- fused: chunk pairs through the attention kernel --------------------------------------------

-- The global chunk index of half h (0, 1) of cp rank i's tokens.
local function chunk_of(i, h, n) return h == 0 and i or 2 * n - 1 - i end

-- How query chunk a sees key chunk b: "causal" (the diagonal), "full" (b before a) or nil (after).
local function pair(a, b)
  if a == b then return "causal" elseif b < a then return "full" end
end

-- (B, H, c) f32 lse -> (B, c, H, 1): the weights' shape against an output (B, c, H, D).
local function per_token(l) return l:permute(0, 2, 1):unsqueeze(3) end

local function f32(t) return t.dtype == "f32" and t or t:to("f32") end

-- y (B, Tl, H, D) and lse {two (B, H, c) f32, one per half} of ring attention, fused per pair
-- (bf16/f16: the running output merged in f32, y rounded once at the end).
local function forward_fused(q, k, v, ctx, scale)
  local n, c = ctx.n, ctx.chunk
  local halves = {q:narrow(1, 0, c), q:narrow(1, c, c)}
  local acc, lse = {}, {}
  local kb, vb = k:contiguous(), v:contiguous()
  for step = 0, n - 1 do
    local j = (ctx.rank - step) % n
    local h, next
    if step < n - 1 then h, next = pass(ctx, {kb, vb}) end
    for a = 0, 1 do
      for b = 0, 1 do
        local how = pair(chunk_of(ctx.rank, a, n), chunk_of(j, b, n))
        if how then
          local pacc, plse = acc[a], lse[a]
          acc[a], lse[a] = tidy(function()
            local o, l = Fattn.scaled_dot_product_attention {halves[a + 1], kb:narrow(1, b * c, c),
              vb:narrow(1, b * c, c), causal = how == "causal", scale = scale}
            o = f32(o)
            if acc[a] == nil then return o, l end
            local m = ops.maximum(lse[a], l) -- log(e^x + e^y) = m + log(e^(x-m) + e^(y-m))
            local wa, wb = ops.exp(ops.sub(lse[a], m)), ops.exp(ops.sub(l, m))
            local sum = ops.add(wa, wb)
            local out = ops.add(ops.mul(acc[a], per_token(ops.div(wa, sum))), ops.mul(o, per_token(ops.div(wb, sum))))
            return out, ops.add(m, ops.log(sum))
          end)
          if pacc then drop({pacc, plse}) end
        end
      end
    end
    if h then kb, vb = advance(h, next, kb, vb, k, v) end
  end
  if n > 1 then drop({kb, vb}) end
  local y = create.cat({acc[0], acc[1]}, 1)
  return y.dtype == q.dtype and y or y:to(q.dtype), lse
end

-- dq, dk, dv of ring attention for dy, fused per pair: with the final out and lse the kernel's
-- backward of a pair is that pair's exact share.
local function backward_fused(dy, q, k, v, y, lse, ctx, scale)
  local n, c = ctx.n, ctx.chunk
  local qs, dys, ys = {q:narrow(1, 0, c), q:narrow(1, c, c)}, {dy:narrow(1, 0, c), dy:narrow(1, c, c)},
    {y:narrow(1, 0, c), y:narrow(1, c, c)}
  local dq = create.zeros_like(q, {dtype = "f32"}) -- (gradients summed in f32, rounded at the end)
  local dk, dv = backward_ring(ctx, k, v, function(kb, vb, j)
    local dks, dvs = create.zeros_like(kb, {dtype = "f32"}), create.zeros_like(vb, {dtype = "f32"})
    for a = 0, 1 do
      for b = 0, 1 do
        local how = pair(chunk_of(ctx.rank, a, n), chunk_of(j, b, n))
        if how then
          tidy(function()
            local dqa, dkp, dvp = Fattn.attention_backward {dys[a + 1], qs[a + 1], kb:narrow(1, b * c, c),
              vb:narrow(1, b * c, c), ys[a + 1], lse[a], causal = how == "causal", scale = scale}
            local dst = dq:narrow(1, a * c, c)
            ops.add(dst, f32(dqa), dst)
            dst = dks:narrow(1, b * c, c)
            ops.add(dst, f32(dkp), dst)
            dst = dvs:narrow(1, b * c, c)
            ops.add(dst, f32(dvp), dst)
          end)
        end
      end
    end
    return dks, dvs
  end)
  local dt = q.dtype
  if dt == "f32" then return dq, dk, dv end
  return dq:to(dt), dk:to(dt), dv:to(dt)
end

local function fused(q, ctx, window) return q.dtype ~= "f64" and ctx.segments == nil and window == 0 end

local record = op.declare {
  name = "RingAttentionBackward", save = {"q", "k", "v", "out"},
  record = function(cls, y, lse, q, k, v, ctx, scale, window)
    local node = {op.edge(q), op.edge(k), op.edge(v), cls = cls, ctx = ctx, scale = scale, window = window}
    op.save(node, "q", q)
    op.save(node, "k", k)
    op.save(node, "v", v)
    op.save_output(node, "out", y)
    node.lse = lse -- a tensor, or the fused path's two halves' (not views of anything: no version to keep)
    op.attach(y, node)
  end,
  backward = function(n, g)
    local dq, dk, dv = op.untracked(fused(n.q, n.ctx, n.window) and backward_fused or backward, g, n.q, n.k, n.v,
      n.out, n.lse, n.ctx, n.scale, n.window)
    return n[1] and dq or nil, n[2] and dk or nil, n[3] and dv or nil
  end,
  no_double = "one process (gradients of gradients through ring attention are not implemented)",
}

function M.attention(q, k, v, ctx, scale, window)
  if q.ndim ~= 4 or k.ndim ~= 4 or v.ndim ~= 4 or k:size(1) ~= q:size(1) or q:size(2) % k:size(2) ~= 0 then
    raise(string.format("cp attention: expected q (B, T, H, D), k, v (B, T, Hkv, D), got [%s], [%s]",
      table.concat(q.shape, ", "), table.concat(k.shape, ", ")))
  end
  window = window or 0
  if LOWEST[q.dtype] == nil and not fused(q, ctx, window) then
    raise("cp attention: packed segments and sliding windows need f32 or f64 for now, got " .. q.dtype)
  end
  if q:size(1) ~= 2 * ctx.chunk then
    raise(string.format("cp attention: %d local tokens, but the context holds 2 chunks of %d", q:size(1), ctx.chunk))
  end
  scale = scale or 1 / math.sqrt(q:size(3))
  ctx.used = true
  local y, lse = op.untracked(fused(q, ctx, window) and forward_fused or forward, q, k, v, ctx, scale, window)
  if U.tracked(q, k, v) then record(y, lse, q, k, v, ctx, scale, window) end
  return y
end

return M
