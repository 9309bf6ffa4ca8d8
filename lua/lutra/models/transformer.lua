-- lutra.models.Transformer — the decoder-only language model that the zoo's
-- architectures configure (gpt2.lua, llama.lua): token embeddings (wte), learned
-- positions (wpe) or RoPE, dropout, n_layer pre-norm blocks, a final norm (ln_f) and
-- the head (lm_head, whose weight is wte.weight itself when embeddings are tied).
--
-- cfg is a complete, checked config (lutra.models.build makes one). Parameter names:
--   wte.weight (V, C), wpe.weight (block_size, C),
--   blocks.i.ln_1.*, blocks.i.attn.qkv.*, blocks.i.attn.proj.*, blocks.i.ln_2.*,
--   blocks.i.mlp.fc.* and mlp.proj.* (GELU) or mlp.gate/up/proj.* (SwiGLU), or with n_experts
--   blocks.i.mlp.w_gate/w_up/w_down (the stacked experts), mlp.router.weight, mlp.shared.*,
--   mlp.shared_gate.weight,
--   ln_f.*, lm_head.weight (V, C)
-- Initialisation (GPT-2's, nanoGPT's): every Linear and Embedding weight N(0, init_std),
-- the projections back into the residual stream (attn.proj, mlp.proj) N(0,
-- init_std / sqrt(2 n_layer)), biases zero, norm weights one. MoE layers alike: the
-- experts' w_down and the shared experts' proj are residual projections.
local Module = require "lutra.nn.module"
local Linear = require "lutra.nn.linear"
local Embedding = require "lutra.nn.embedding"
local LayerNorm = require "lutra.nn.layer_norm"
local RMSNorm = require "lutra.nn.rms_norm"
local Dropout = require "lutra.nn.dropout"
local Block = require "lutra.nn.block"
local MoE = require "lutra.nn.moe"
local create = require "lutra.create"
local ops = require "lutra.ops"
local F = require "lutra.functional"
local fields = require "lutra.tensor.fields"
local errors = require "lutra.errors"
local grad = require "lutra.nn.grad"
local rope = require "lutra.models.rope"

local raise, is_tensor = errors.raise, ops.is_tensor

local Transformer = Module:extend("Transformer")

function Transformer:init(cfg)
  rawset(self, "cfg", cfg)
  local C, V = cfg.d_model, cfg.vocab_size
  local fo = {dtype = cfg.dtype, device = cfg.device}
  self.wte = Embedding(V, C, fo)
  if cfg.pos == "learned" then self.wpe = Embedding(cfg.block_size, C, fo) end
  self.drop = Dropout(cfg.dropout)
  local blocks = {}
  local moe = cfg.n_experts and {n_experts = cfg.n_experts, top_k = cfg.top_k, capacity_factor = cfg.capacity_factor,
                                 n_shared_experts = cfg.n_shared_experts, shared_hidden = cfg.shared_expert_hidden,
                                 shared_gate = cfg.shared_expert_gate, norm_topk_prob = cfg.norm_topk_prob,
                                 aux_loss_coef = cfg.aux_loss_coef, z_loss_coef = cfg.z_loss_coef} or nil
  local rope_freq = cfg.pos == "rope" and cfg.rope_scaling ~= nil
    and rope.frequencies(cfg.rope_scaling, cfg.rope_theta, cfg.head_dim or C / cfg.n_head) or nil
  for i = 1, cfg.n_layer do
    local sliding = cfg.sliding_window ~= nil and (cfg.layer_types == nil or cfg.layer_types[i] == "sliding_attention")
    blocks[i] = Block {d_model = C, n_head = cfg.n_head, n_kv_head = cfg.n_kv_head, norm = cfg.norm,
                       norm_eps = cfg.norm_eps, mlp = cfg.mlp, ffn_hidden = cfg.ffn_hidden, bias = cfg.bias,
                       dropout = cfg.dropout, rope = cfg.pos == "rope",
                       rope_theta = not rope_freq and cfg.rope_theta or nil,
                       head_dim = cfg.head_dim, qk_norm = cfg.qk_norm, qkv_bias = cfg.qkv_bias, out_bias = cfg.out_bias,
                       mlp_bias = cfg.mlp_bias, rope_freq = rope_freq, window = sliding and cfg.sliding_window or nil,
                       moe = moe, dtype = cfg.dtype, device = cfg.device}
  end
  self.blocks = Module.ModuleList(blocks)
  if cfg.norm == "rmsnorm" then
    self.ln_f = RMSNorm(C, {eps = cfg.norm_eps, dtype = cfg.dtype, device = cfg.device})
  else
    self.ln_f = LayerNorm(C, {eps = cfg.norm_eps, bias = cfg.bias, dtype = cfg.dtype, device = cfg.device})
  end
  self.lm_head = Linear(C, V, {bias = false, dtype = cfg.dtype, device = cfg.device})
  if cfg.tie_embeddings then self.lm_head.weight = self.wte.weight end
  self:init_weights()
end

-- Draws the initial weights again (from lutra's generator, in parameter order).
function Transformer:init_weights()
  local std = self.cfg.init_std
  local resid_std = std / math.sqrt(2 * self.cfg.n_layer)
  local done = {}
  local function fill(t, fn, a, b)
    if done[t] then return end
    done[t] = true
    grad.no_grad(fn, t, a, b)
  end
  local residual = {}
  for _, block in ipairs(self.blocks) do
    local mlp = block.mlp
    residual[block.attn.proj.weight] = true
    if getmetatable(mlp) == MoE then
      residual[mlp.w_down] = true
      if mlp.shared then residual[mlp.shared.proj.weight] = true end
    else
      residual[mlp.proj.weight] = true
    end
  end
  for _, m in ipairs(self:modules()) do
    local cls = getmetatable(m)
    if cls == Linear or cls == Embedding then
      fill(m.weight, create.normal_, 0, residual[m.weight] and resid_std or std)
      if m.bias ~= nil then fill(m.bias, create.fill_, 0) end
    elseif cls == MoE then -- the stacked experts (its router and shared experts are Linear layers)
      if m.w_gate then fill(m.w_gate, create.normal_, 0, std) end
      fill(m.w_up, create.normal_, 0, std)
      fill(m.w_down, create.normal_, 0, resid_std)
    elseif cls == LayerNorm or cls == RMSNorm then
      if m.weight ~= nil then fill(m.weight, create.fill_, 1) end
      if m.bias ~= nil then fill(m.bias, create.fill_, 0) end
    end
  end
  return self
end

local function check_ids(what, t, B, T)
  if not is_tensor(t) then raise("Transformer: " .. what .. " must be a tensor, got " .. type(t)) end
  local dt = t.dtype
  if dt ~= "i64" and dt ~= "i32" then raise("Transformer: " .. what .. " must be i64 or i32, got " .. dt) end
  if t.ndim ~= 2 or (B and (t:size(0) ~= B or t:size(1) ~= T)) then
    raise(string.format("Transformer: %s must be (B, T)%s, got [%s]", what,
      B and string.format(" = (%d, %d)", B, T) or "", table.concat(t.shape, ", ")))
  end
end

-- (the intermediates are released as soon as used: see nn.grad.release)
local release = grad.release

-- Token embeddings plus learned positions (at `positions`, else pos .. pos + T - 1), then dropout.
-- Anything holding wte, wpe (or nil) and drop may call it: a pipeline stage does (lutra.dist.pp).
local function embed(self, idx, positions, pos, T)
  local x = self.wte(idx)
  if self.wpe ~= nil then
    local p = self.wpe(positions or create.arange(pos, pos + T, {device = idx.device}))
    local e = x
    x = e + p
    release(e)
    release(p)
  end
  local d = self.drop(x)
  release(x, d)
  return d
end

-- ln_f of the residual stream x + pending (the last block's add, fused with ln_f when it can be).
local function final_norm(self, x, pending)
  local h
  if pending ~= nil and fields.dtype_id(pending) == fields.dtype_id(x) and Block.fusable_norm(self.ln_f) then
    local sum
    sum, h = self.ln_f:forward_add(pending, x)
    release(pending, sum)
    release(x, sum)
    x = sum
  elseif pending ~= nil then
    local sum = x + pending
    release(pending, sum)
    release(x, sum)
    x = sum
    h = self.ln_f(x)
  else
    h = self.ln_f(x)
  end
  release(x, h)
  return h
end

-- idx (B, T) token ids -> logits (B, T, V); with targets (B, T) (-100: ignored), also
-- the mean cross-entropy loss (in training mode, plus the MoE layers' aux losses: add_aux_loss).
-- opts.cache (from kv_cache) decodes incrementally.
-- Packed rows (several documents per row, lutra.sft.data): opts.positions (B, T) the
-- position of each token in its document (learned positions are gathered there, RoPE
-- rotates by it) and opts.segments (B, T) its document id: attention stays inside each
-- document, so a packed document's logits are the ones it has alone. opts.cp (or the field
-- cp_context): context parallel, lutra.dist.cp.split made idx, targets and the context (positions,
-- segments), the loss is this rank's scaled part.
function Transformer:forward(idx, targets, opts)
  check_ids("idx", idx)
  local B, T = idx:size(0), idx:size(1)
  if targets ~= nil then check_ids("targets", targets, B, T) end
  local cache = opts and opts.cache
  local pos = cache and cache.pos or 0
  local limit = cache and cache.len or self.cfg.block_size
  if pos + T > limit then
    raise(string.format("Transformer: %d positions%s do not fit the %s of %d", T,
      pos > 0 and string.format(" after %d", pos) or "", cache and "cache" or "block_size", limit))
  end
  local positions, segments = opts and opts.positions, opts and opts.segments
  -- context parallel (lutra.dist.cp): this rank's part of the rows, at their global positions
  local cp = opts and opts.cp or rawget(self, "cp_context")
  if cp then positions, segments = positions or cp.positions, segments or cp.local_segments end
  if positions ~= nil then check_ids("positions", positions, B, T) end
  if segments ~= nil then check_ids("segments", segments, B, T) end
  local packed = (positions ~= nil or segments ~= nil or cp) and {positions = positions, segments = segments, cp = cp}
    or nil
  if packed and cache then raise("Transformer: positions/segments (packed rows) do not go with a cache") end
  if rope.dynamic(self.cfg.rope_scaling) then self:set_rope_length(pos + T) end
  local x = embed(self, idx, positions, pos, T)
  -- Each block's last residual add is left pending and done by the next norm's fused kernel
  -- (Block:forward_split); blocks that cannot take part get the sum first.
  local pending
  for i, block in ipairs(self.blocks) do
    local layer_cache = cache and cache.layers[i]
    if type(block.splittable) == "function" and block:splittable() then
      local x1, m = block:forward_split(x, pending, layer_cache, pos, packed)
      if pending == nil then release(x, x1) end -- (with a pending add the block released x)
      x, pending = x1, m
    else
      if pending ~= nil then
        local sum = x + pending
        release(pending, sum)
        release(x, sum)
        x, pending = sum, nil
      end
      local y = block(x, layer_cache, pos, packed)
      release(x, y)
      x = y
    end
  end
  local h = final_norm(self, x, pending)
  local logits = self.lm_head(h)
  release(h, logits)
  if cache then cache.pos = pos + T end
  if targets == nil then return logits end
  local loss = cp and cp:loss(logits, targets, self) or self:loss(logits, targets)
  if self.cfg.n_experts ~= nil then
    if self.training then
      loss = self:add_aux_loss(loss)
    else -- (evaluation: the LM loss alone, and no stale parts of a training step's)
      rawset(self, "lm_loss", nil)
      rawset(self, "aux_loss", nil)
    end
  end
  return logits, loss
end

-- loss + the sum of the MoE layers' aux losses of the forward just run (lutra/nn/moe.lua);
-- keeps the parts in self.lm_loss and self.aux_loss (plain fields) for logging.
function Transformer:add_aux_loss(loss)
  local aux
  for _, block in ipairs(self.blocks) do
    local a = rawget(block.mlp, "aux_loss")
    if a then aux = aux and aux + a or a end
  end
  rawset(self, "lm_loss", loss)
  rawset(self, "aux_loss", aux)
  return aux and loss + aux or loss
end

-- RoPE frequencies that depend on the sequence length (rope_type dynamic, longrope) for a
-- forward whose positions reach n - 1: transformers recomputes them on each forward from
-- its largest position (dynamic_rope_update); for positions that only grow (a prompt, then
-- decoding with a cache) that is the frequencies of n.
function Transformer:set_rope_length(n)
  local c = self.cfg
  local orig = c.rope_scaling.original_max_position_embeddings
  local key = n > orig and n or 0
  if c.rope_scaling.rope_type == "longrope" then key = n > orig and 1 or 0 end
  if rawget(self, "_rope_length") == key then return end
  rawset(self, "_rope_length", key)
  local D = c.head_dim or c.d_model / c.n_head
  local freq = F.rope_table("Transformer: rope", rope.frequencies(c.rope_scaling, c.rope_theta, D, n), D / 2)
  for _, block in ipairs(self.blocks) do block.attn.rope_freq = freq end
end

-- The mean next-token loss of logits (B, T, V) against targets (B, T), -100 ignored.
-- Tensor parallel replaces it on a sharded model with the vocab-parallel cross-entropy.
-- (reduction: "mean" by default, "sum" for context parallel's share: lutra.dist.cp)
function Transformer:loss(logits, targets, reduction)
  return F.cross_entropy(logits, targets, {ignore_index = -100, reduction = reduction})
end

-- A key/value cache for incremental decoding of `batch` sequences of up to `len`
-- (default block_size) positions: {pos = 0, len =, layers = {...}}. Pass it as
-- forward(idx, nil, {cache = c}) under lutra.no_grad; each call appends its T positions.
function Transformer:kv_cache(batch, len)
  len = len or self.cfg.block_size
  if len > self.cfg.block_size and self.wpe ~= nil then
    raise(string.format("Transformer: kv_cache of %d positions exceeds the learned positions (%d)", len,
      self.cfg.block_size))
  end
  local layers = {}
  for i, block in ipairs(self.blocks) do layers[i] = block.attn:new_cache(batch, len) end
  return {pos = 0, len = len, layers = layers}
end

-- Whether this process holds every parameter whole, as a model directory
-- (lutra.sft.modeldir.save, lt.hf.save_pretrained) needs: true on one process and under
-- data parallel or ZeRO 1-2; false where a layout keeps pieces (tensor parallel and ZeRO 3
-- shards, whose lutra.dist.spec says so) or freed the other ranks' layers (pipeline stages),
-- which sharded checkpoints (lt.ckpt) save instead.
function Transformer:can_save_whole()
  local spec = package.loaded["lutra.dist.spec"] -- no layout without it
  for _, p in ipairs(self:parameters()) do
    if p:is_freed() then return false end
    local s = spec and spec.get(p)
    if s then
      for i, n in ipairs(s.global) do
        if n ~= p.shape[i] then return false end
      end
    end
  end
  return true
end

function Transformer:extra_repr()
  local c = self.cfg
  local s = string.format("%s: %d layers, d_model %d, %d heads", c.arch, c.n_layer, c.d_model, c.n_head)
  if c.n_kv_head ~= c.n_head then s = s .. string.format(" (%d kv)", c.n_kv_head) end
  return s .. string.format(", vocab %d, block %d", c.vocab_size, c.block_size)
end

Transformer.embed = embed

return Transformer
