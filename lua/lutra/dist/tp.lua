-- lutra.dist.tp — tensor parallelism (Megatron-LM's layout) for the model zoo's Transformer.
--
--   local tp = require "lutra.dist.tp"
--   tp.parallelize(model, group, {sequence_parallel = false})   -- in place; returns model
--   local logits, loss = model(idx, targets)   -- logits (B, T, V_local): this rank's vocab columns
--   loss:backward(); tp.sync_grads(model)      -- before clipping / the optimizer step
--
-- group is the tensor-parallel group (mesh.tp, or comm.split); n = group.size ranks each
-- hold 1/n of every big matrix. Every rank gives the same idx and targets. The model is
-- built in full first (lutra.models.build, same seed on every rank) and each rank keeps
-- narrowed copies of its pieces, so the init equals the single process (the full weights
-- are garbage once parallelize returns; building at 1/n size is not done yet).
--   attention   qkv column-parallel by heads: this rank's q heads, k heads and v heads
--               (n_head / n and n_kv_head / n; the module's n_head and n_kv_head become
--               those local counts, so its forward runs unchanged on local heads);
--               attn.proj row-parallel (all-reduce, then its bias)
--   MLP         fc (gelu) or gate and up (swiglu: one shared input copy or all-gather)
--               column-parallel, proj row-parallel
--   MoE         (nn.MoE, Megatron's expert tensor parallel) every expert's hidden dim split
--               like the MLP's: w_gate, w_up (E, H/n, C) column-, w_down (E, C, H/n) row-
--               parallel; the expert input copied in (f), the outputs all-reduced (g) before
--               the routing weights; the router and the shared expert's gate replicated (the
--               tokens, so the routing and aux losses, are the same on every rank), the shared
--               expert sharded as the MLP. Under expert parallel (lutra.dist.ep) the token
--               exchange runs within the ep group at this tp coordinate, around the sharded
--               experts. Under sequence_parallel the layer gathers the whole sequence (its
--               gradient taken back as this rank's piece) and returns this rank's piece.
--   embeddings  wte vocab-parallel; lm_head column-parallel over the vocab (a tied lm_head
--               shares wte's shard: the same rows); model.loss becomes the vocab-parallel
--               cross-entropy (lutra.dist.tp_loss); wpe and the norms are replicated
-- n must divide n_head and n_kv_head (an error names the numbers); vocab_size and
-- ffn_hidden may be uneven (rank i holds [floor(i V / n), floor((i+1) V / n))).
--
-- sequence_parallel = true: between the tp regions the activations are split on the
-- sequence dim (T / n positions a rank; T must divide): norms, dropout and the residual
-- adds run on 1/n of the tokens. The embedding output is split by model.drop; column-
-- parallel layers all-gather their input, row-parallel ones reduce-scatter their output.
-- The replicated norm weights and row-parallel biases then see only local tokens:
-- tp.sync_grads(model) sums their grads over the group (without it, a no-op). Dropout
-- draws the mask of the whole sequence on every rank and applies its piece: with the same
-- seed everywhere, the masks (and so the training) are those of one process, with or
-- without sequence parallelism.
--
-- Parameters keep their global names; each shard carries a lutra.dist.spec box (global
-- shape, offset; the qkv weight and bias of a rank are three row boxes, listed in the
-- spec's `pieces`), replicated parameters have dup = true on ranks > 0.
-- tp.gather(model, p[, t]) -> the full tensor of parameter p (or of t shaped like p, its
-- grad); tp.gather_logits(model, logits) -> (..., V). Both are collectives.
-- LoRA: a lora.LoRALinear (lora.apply before parallelize) becomes its parallel LoRA layer
-- (lutra.lora.tp: B cut as a column-parallel weight's rows, A as a row-parallel weight's
-- columns, the other whole); new tensors keep the full model's requires_grad (frozen stays frozen).
local Module = require "lutra.nn.module"
local Dropout = require "lutra.nn.dropout"
local Attention = require "lutra.nn.attention"
local SwiGLU = require "lutra.nn.swiglu"
local MoE = require "lutra.nn.moe"
local create = require "lutra.create"
local errors = require "lutra.errors"
local dtype = require "lutra.dtype"
local grad = require "lutra.nn.grad"
local spec = require "lutra.dist.spec"
local L = require "lutra.dist.tp_layers"
local tp_ops = require "lutra.dist.tp_ops"
local tp_loss = require "lutra.dist.tp_loss"
local lora_tp = require "lutra.lora.tp"
local fields = require "lutra.tensor.fields"

local raise = errors.raise
local release = grad.release

local M = {}
M.ops, M.layers, M.cross_entropy = tp_ops, L, tp_loss.cross_entropy

-- param -> {dim =, global =, ranks = {[i] = pieces of rank i - 1}}: how the full tensor is cut
local layouts = setmetatable({}, {__mode = "k"})

-- ---- sequence-parallel module variants -------------------------------------------------------

-- model.drop under sequence parallelism: the embeddings (the same on every rank) are
-- dropped out (the same mask on every rank), then split on the sequence dim.
local SeqSplitDropout = Dropout:extend("SeqSplitDropout")
function SeqSplitDropout:forward(x)
  local d = Dropout.forward(self, x)
  local y = tp_ops.split_seq(d, self._tp_group)
  release(d, x, y)
  return y
end

-- Dropout on this rank's sequence piece (B, T/n, ...): the mask of the whole (B, T, ...)
-- is drawn (the generator advances on every rank as in one process, and the ranks' pieces
-- get different masks) and this rank's piece of it applied: the masks of one process.
local SeqDropout = Dropout:extend("SeqParallelDropout")
function SeqDropout:forward(x)
  local p = self.p
  if not self.training or p == 0 then return x end
  local group = self._tp_group
  local n = group.size
  local shape = x.shape
  local Tl = shape[2]
  shape[2] = Tl * n
  local mask = grad.no_grad(function()
    local full = create.bernoulli_(create.empty(shape, {dtype = x.dtype, device = x.device}), 1 - p)
    local piece = full:narrow(1, group.rank * Tl, Tl):contiguous()
    full:free()
    return piece:mul_(1 / (1 - p))
  end)
  return x * mask
end

-- Attention under sequence parallelism: the input (B, T/n, C) is all-gathered first (the
-- forward takes B and T from its input); qkv then takes it as it is, proj reduce-scatters.
-- opts (packed rows' positions and segments, context parallel's cp) are the whole sequence's.
local SeqParallelAttention = Attention:extend("SeqParallelAttention")
function SeqParallelAttention:forward(x, cache, pos, opts)
  if cache ~= nil then raise("tp: the key/value cache is not supported with sequence_parallel") end
  local xg = tp_ops.gather_seq(x, self._tp_group)
  local y = Attention.forward(self, xg, nil, pos, opts)
  release(xg, x, y)
  return y
end

-- SwiGLU: gate and up share one input copy (all-reduced once in backward) or one all-gather.
local ParallelSwiGLU = SwiGLU:extend("ParallelSwiGLU")
function ParallelSwiGLU:forward(x)
  local group = self._tp_group
  local xi = rawget(self, "_tp_sequence") and tp_ops.gather_seq(x, group) or tp_ops.copy_to(x, group)
  local y = SwiGLU.forward(self, xi)
  release(xi, x, y)
  return y
end

-- ---- helpers ---------------------------------------------------------------------------------

local function check_group(group)
  if type(group) ~= "table" or type(group.size) ~= "number" or type(group.rank) ~= "number"
      or type(group.all_reduce) ~= "function" then
    raise("tp.parallelize: expected a process group (mesh.tp or comm.split), got " .. type(group))
  end
end

local function check_model(model)
  if not Module.is_module(model) or type(rawget(model, "cfg")) ~= "table" or model.blocks == nil
      or model.wte == nil or model.lm_head == nil then
    raise("tp.parallelize: expected a model of the zoo (lutra.models.build), got "
      .. (Module.is_module(model) and model.__name or type(model)))
  end
  if rawget(model, "_tp") then raise("tp.parallelize: the model is already tensor-parallel") end
end

local function divides(what, v, n)
  if v % n ~= 0 then
    raise(string.format("tp.parallelize: %s %d is not divisible by the tensor-parallel size %d", what, v, n))
  end
end

local function at_least(what, v, n)
  if v < n then
    raise(string.format("tp.parallelize: %s %d is smaller than the tensor-parallel size %d", what, v, n))
  end
end

local function shape_of(t)
  local s = {}
  for i = 1, t.ndim do s[i] = t:size(i - 1) end
  return s
end

-- Pieces of every rank: fn(rank) -> {{start, count}, ...}.
local function all_ranks(n, fn)
  local ranks = {}
  for i = 1, n do ranks[i] = fn(i - 1) end
  return ranks
end

local function even(len, n) return function(r) return {{tp_ops.range(len, n, r)}} end end

-- Notes how local tensor t was cut from a global tensor of shape `global` along dim, and
-- sets its spec (this rank's pieces).
local function shard(t, global, dim, ranks, rank)
  layouts[t] = {dim = dim, global = global, ranks = ranks}
  local mine = ranks[rank + 1]
  local offset = {}
  for i = 1, #global do offset[i] = 0 end
  offset[dim + 1] = mine[1][1]
  spec.set(t, {global = global, offset = offset})
  if #mine > 1 then
    local pieces, at = {}, 0
    for i, p in ipairs(mine) do
      local go, lo, shape = {}, {}, {}
      for d = 1, #global do go[d], lo[d], shape[d] = 0, 0, global[d] end
      go[dim + 1], lo[dim + 1], shape[dim + 1] = p[1], at, p[2]
      pieces[i] = {offset = go, local_offset = lo, shape = shape}
      at = at + p[2]
    end
    spec.get(t).pieces = pieces
  end
end

-- (the new tensors keep the full layer's requires_grad: a frozen base stays frozen under LoRA)
local function keep_flag(t, full_t)
  if t ~= nil and full_t ~= nil then grad.set_requires_grad(t, full_t.requires_grad) end
end

local function shard_linear(m, full, dim, ranks, rank)
  shard(m.weight, shape_of(full.weight), dim, ranks, rank)
  if m.bias ~= nil and dim == 0 then shard(m.bias, shape_of(full.bias), 0, ranks, rank) end
  keep_flag(m.weight, full.weight)
  keep_flag(m.bias, full.bias)
  lora_tp.shard(m, full, dim, ranks, rank, shard) -- a LoRA layer's adapters (lutra.lora.tp)
end

-- ---- parallelize -----------------------------------------------------------------------------

local function parallelize_attention(attn, group, sp)
  local n, r = group.size, group.rank
  local H, Hkv, D = attn.n_head, attn.n_kv_head, attn.head_dim
  local Hl, Hkvl = H / n, Hkv / n
  local qkv_ranks = all_ranks(n, function(i)
    return {{i * Hl * D, Hl * D}, {H * D + i * Hkvl * D, Hkvl * D}, {(H + Hkv) * D + i * Hkvl * D, Hkvl * D}}
  end)
  local proj_ranks = all_ranks(n, function(i) return {{i * Hl * D, Hl * D}} end)
  local qkv, proj = attn.qkv, attn.proj
  attn.qkv = lora_tp.column(qkv, group, qkv_ranks[r + 1], {input = sp and "none" or "copy"})
  attn.proj = lora_tp.row(proj, group, proj_ranks[r + 1], {output = sp and "reduce_scatter" or "reduce"})
  shard_linear(attn.qkv, qkv, 0, qkv_ranks, r)
  shard_linear(attn.proj, proj, 1, proj_ranks, r)
  attn.n_head, attn.n_kv_head = Hl, Hkvl
  if sp then
    setmetatable(attn, SeqParallelAttention)
    rawset(attn, "_tp_group", group)
  end
end

local function parallelize_mlp(mlp, group, sp)
  local n, r = group.size, group.rank
  local proj = mlp.proj
  local ranks = all_ranks(n, even(proj.in_features, n))
  local input = sp and "gather" or "copy"
  if getmetatable(mlp) == SwiGLU then
    input = "none"
    setmetatable(mlp, ParallelSwiGLU)
    rawset(mlp, "_tp_group", group)
    rawset(mlp, "_tp_sequence", sp)
  end
  for _, name in ipairs {"fc", "gate", "up"} do
    local full = rawget(mlp, name)
    if full ~= nil then
      mlp[name] = lora_tp.column(full, group, ranks[r + 1], {input = input})
      shard_linear(mlp[name], full, 0, ranks, r)
    end
  end
  mlp.proj = lora_tp.row(proj, group, ranks[r + 1], {output = sp and "reduce_scatter" or "reduce"})
  shard_linear(mlp.proj, proj, 1, ranks, r)
end

-- The experts of moe on this rank's hidden columns (the dense MLP's cut on every expert).
local function moe_experts(self, xs, counts)
  local group = rawget(self, "_tp_group")
  local xi = tp_ops.copy_to(xs, group)
  local partial = MoE.experts(self, xi, counts)
  local y = tp_ops.reduce_from(partial, group)
  release(partial, xs, y)
  return y
end

-- Under sequence parallelism: the layer runs on the whole sequence, gathered (the same on every
-- rank, as without it), and returns this rank's piece.
local function moe_forward_seq(self, x)
  local group = rawget(self, "_tp_group")
  local xg = tp_ops.gather_seq_whole(x, group)
  local y = MoE.forward(self, xg)
  release(xg, x, y)
  local out = tp_ops.split_seq(y, group)
  release(y, x, out)
  return out
end

local function parallelize_moe(moe, group, sp)
  local n, r = group.size, group.rank
  at_least("MoE d_ff", moe.d_ff, n)
  local ranks = all_ranks(n, even(moe.d_ff, n))
  for _, nd in ipairs {{"w_gate", 1}, {"w_up", 1}, {"w_down", 2}} do
    local name, dim = nd[1], nd[2]
    local full = rawget(moe, name)
    if full ~= nil then
      local t = L.take(full, dim, ranks[r + 1])
      keep_flag(t, full)
      moe:param(name, t)
      shard(t, shape_of(full), dim, ranks, r)
    end
  end
  if moe.shared then
    at_least("MoE shared expert hidden", moe.shared.proj.in_features, n)
    parallelize_mlp(moe.shared, group, false)
  end
  rawset(moe, "_tp_group", group)
  rawset(moe, "experts", moe_experts)
  if sp then rawset(moe, "forward", moe_forward_seq) end
end

function M.parallelize(model, group, opts)
  check_model(model)
  check_group(group)
  opts = opts or {}
  if type(opts) ~= "table" then raise("tp.parallelize: options must be a table, got " .. type(opts)) end
  for k in pairs(opts) do
    if k ~= "sequence_parallel" then
      raise("tp.parallelize: unknown option '" .. tostring(k) .. "' (sequence_parallel)")
    end
  end
  local sp = opts.sequence_parallel and true or false
  local cfg = model.cfg
  local n, r = group.size, group.rank
  if cfg.qk_norm then
    -- each rank's heads give q_norm / k_norm a part of their gradient: it would need a sum over the group
    raise("tp.parallelize: qk_norm (Qwen3's q/k RMSNorm) is not tensor-parallel: train it with dp, pp or zero")
  end
  divides("n_head", cfg.n_head, n)
  divides("n_kv_head", cfg.n_kv_head, n)
  at_least("vocab_size", cfg.vocab_size, n)
  at_least("ffn_hidden", cfg.ffn_hidden, n)
  local V = model.wte.num_embeddings
  local vocab_ranks = all_ranks(n, even(V, n))
  local lo, count = vocab_ranks[r + 1][1][1], vocab_ranks[r + 1][1][2]
  grad.no_grad(function()
    local wte, lm_head = model.wte, model.lm_head
    local tied = rawequal(lm_head.weight, wte.weight)
    model.wte = L.VocabParallelEmbedding(wte, group, lo, count)
    shard(model.wte.weight, shape_of(wte.weight), 0, vocab_ranks, r)
    keep_flag(model.wte.weight, wte.weight)
    model.lm_head = lora_tp.column(lm_head, group, vocab_ranks[r + 1],
      {input = sp and "gather" or "copy", weight = tied and model.wte.weight or nil})
    if not tied then
      shard_linear(model.lm_head, lm_head, 0, vocab_ranks, r)
    else
      keep_flag(model.wte.weight, wte.weight) -- (assigning it to lm_head turned requires_grad on)
      lora_tp.shard(model.lm_head, lm_head, 0, vocab_ranks, r, shard)
    end
    for _, block in ipairs(model.blocks) do
      parallelize_attention(block.attn, group, sp)
      if getmetatable(block.mlp) == MoE then
        parallelize_moe(block.mlp, group, sp)
      else
        parallelize_mlp(block.mlp, group, sp)
      end
    end
    if sp then
      setmetatable(model.drop, SeqSplitDropout)
      rawset(model.drop, "_tp_group", group)
      for _, block in ipairs(model.blocks) do
        -- (an MoE layer's dropout acts on its whole output: the masks of one process)
        local mlp_drop = getmetatable(block.mlp) ~= MoE and block.mlp.drop or nil
        for _, drop in ipairs {block.attn.drop, mlp_drop} do
          setmetatable(drop, SeqDropout)
          rawset(drop, "_tp_group", group)
        end
      end
    end
    -- replicated: owned by tp rank 0; under sequence parallelism the ones that see only
    -- local tokens (inside the blocks, ln_f) have their grads summed by sync_grads
    local summed = {}
    local inside = {}
    for _, m in ipairs(model.blocks:modules()) do inside[m] = true end
    -- (but an MoE layer's replicated router and shared gate see the whole sequence)
    for _, block in ipairs(model.blocks) do
      if getmetatable(block.mlp) == MoE then
        for _, m in ipairs(block.mlp:modules()) do inside[m] = nil end
      end
    end
    inside[model.ln_f] = true
    for _, mod in ipairs(model:modules()) do
      for _, e in ipairs(rawget(mod, "_entries")) do
        local p = rawget(mod, e.key)
        if e.kind == "param" and p ~= nil and layouts[p] == nil and not spec.get(p) then
          spec.set(p, {global = shape_of(p), dup = r > 0})
          if sp and inside[mod] then summed[#summed + 1] = p end
        end
      end
    end
    rawset(model, "_tp", {group = group, sequence_parallel = sp, summed = summed, vocab_start = lo,
                          vocab_size = V})
  end)
  -- (Transformer:forward calls self:loss: the vocab-parallel cross-entropy on this instance)
  rawset(model, "loss", function(_, logits, targets, reduction)
    return (tp_loss.cross_entropy(logits, targets, group, lo, V, {ignore_index = -100, reduction = reduction}))
  end)
  return model
end

-- Sums over the tp group the grads of the replicated parameters that saw only this rank's
-- tokens (sequence parallel: norms, row-parallel biases); a no-op otherwise. Call after the
-- last backward of a step, before clipping. One all-reduce of the concatenated grads.
function M.sync_grads(model)
  local rec = rawget(model, "_tp")
  if rec == nil or not rec.sequence_parallel or rec.group.size == 1 then return end
  local grads = {}
  for _, p in ipairs(rec.summed) do
    if p.grad ~= nil then grads[#grads + 1] = p.grad end
  end
  if #grads == 0 then return end
  grad.no_grad(function()
    local flat = {}
    for i, g in ipairs(grads) do flat[i] = g:reshape(-1) end
    local buf = create.cat(flat, 0)
    rec.group:all_reduce(buf, "sum")
    local at = 0
    for _, g in ipairs(grads) do
      local k = g:numel()
      g:copy_(buf:narrow(0, at, k):view(shape_of(g)))
      at = at + k
    end
    buf:free()
  end)
end

-- ---- gathering -------------------------------------------------------------------------------

-- The full tensor from each rank's local t, cut by layout {dim =, global =, ranks =}.
local function assemble(t, layout, group)
  local n, dim, global = group.size, layout.dim, layout.global
  local counts, shapes, same = {}, {}, true
  for i = 1, n do
    local s, len = {}, 0
    for d = 1, #global do s[d] = global[d] end
    for _, p in ipairs(layout.ranks[i]) do len = len + p[2] end
    s[dim + 1] = len
    local k = 1
    for d = 1, #s do k = k * s[d] end
    shapes[i], counts[i] = s, k
    if k ~= counts[1] then same = false end
  end
  local total = 0
  for i = 1, n do total = total + counts[i] end
  local like = {dtype = dtype.name(fields.dtype_id(t)), device = dtype.device_name(fields.device_id(t))}
  local buf = create.empty({total}, like)
  group:all_gather(buf, t:contiguous(), not same and {counts = counts} or nil)
  local full = create.empty(global, like)
  local off = 0
  for i = 1, n do
    local chunk = buf:narrow(0, off, counts[i]):view(shapes[i])
    local at = 0
    for _, p in ipairs(layout.ranks[i]) do
      full:narrow(dim, p[1], p[2]):copy_(chunk:narrow(dim, at, p[2]))
      at = at + p[2]
    end
    off = off + counts[i]
  end
  buf:free()
  return full
end

-- The full value of parameter p (or of t, a tensor shaped like p: its grad, a moment), on
-- every rank of the model's tp group. A collective: every rank calls it for the same p.
function M.gather(model, p, t)
  local rec = rawget(model, "_tp")
  t = t or p
  return grad.no_grad(function()
    local layout = layouts[p]
    if rec == nil or layout == nil then return t:detach():clone() end
    return assemble(t:detach(), layout, rec.group)
  end)
end

-- The full logits (..., V) from this rank's (..., V_local) (no autograd). A collective.
function M.gather_logits(model, logits)
  local rec = rawget(model, "_tp")
  if rec == nil then return logits end
  return grad.no_grad(function()
    local global = shape_of(logits)
    global[#global] = rec.vocab_size
    local layout = {dim = #global - 1, global = global, ranks = all_ranks(rec.group.size, even(rec.vocab_size,
      rec.group.size))}
    return assemble(logits:detach(), layout, rec.group)
  end)
end

-- Whether the model was parallelized, and its tp group.
function M.group(model)
  local rec = rawget(model, "_tp")
  return rec and rec.group
end

return M
