-- nn.Block{d_model =, n_head =, n_kv_head =, norm = "layernorm" | "rmsnorm", norm_eps =,
--   mlp = "gelu" | "swiglu", ffn_hidden =, bias = true, dropout = 0, rope = false,
--   rope_theta =, head_dim =, qk_norm =, qkv_bias =, out_bias =, mlp_bias =, dtype =, device =}
-- (head_dim, qk_norm, qkv_bias, out_bias, rope_freq, window: nn.CausalSelfAttention's; mlp_bias:
-- the MLP's Linear layers, default bias; moe: a table of nn.MoE options (n_experts =, top_k =, ...)
-- that makes the MLP a mixture of experts of the mlp kind, each ffn_hidden wide)
-- The pre-norm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x)).
-- The first residual add and ln_2 run as one fused kernel (F.add_layer_norm / F.add_rms_norm)
-- when ln_2 is a plain LayerNorm/RMSNorm and the two addends share a dtype; the result is the
-- same. The second add is fused the same way into the next block's ln_1 (or the model's ln_f)
-- by a model that chains forward_split. Block.fuse_residual_norm = false (or the field on one
-- block) turns both off.
-- forward(x, cache, pos) passes the key/value cache to the attention; forward(x, nil, 0,
-- {positions =, segments =}) passes packed-row positions and document ids to it.
-- block:on_mlp_input(fn) shows fn each forward's MLP input (recipes/custom_arch.lua reads
-- its MoE layers' routing with it).
local Module = require "lutra.nn.module"
local errors = require "lutra.errors"
local fields = require "lutra.tensor.fields"
local O = require "lutra.nn.options"
local LayerNorm = require "lutra.nn.layer_norm"
local RMSNorm = require "lutra.nn.rms_norm"
local Attention = require "lutra.nn.attention"
local MLP = require "lutra.nn.mlp"
local SwiGLU = require "lutra.nn.swiglu"
local MoE = require "lutra.nn.moe"

local raise = errors.raise

local Block = Module:extend("Block")
Block.fuse_residual_norm = true

local KEYS = {"d_model", "n_head", "n_kv_head", "norm", "norm_eps", "mlp", "ffn_hidden", "bias", "dropout", "rope",
              "rope_theta", "head_dim", "qk_norm", "qkv_bias", "out_bias", "mlp_bias", "rope_freq", "window", "moe",
              "dtype", "device"}

function Block:init(cfg)
  cfg = O.check("Block", cfg, KEYS)
  local bias = O.boolean("Block", "bias", cfg.bias, true)
  local function norm()
    local opts = {eps = cfg.norm_eps, dtype = cfg.dtype, device = cfg.device}
    if cfg.norm == nil or cfg.norm == "layernorm" then
      opts.bias = bias
      return LayerNorm(cfg.d_model, opts)
    elseif cfg.norm == "rmsnorm" then
      return RMSNorm(cfg.d_model, opts)
    end
    raise("Block: norm must be \"layernorm\" or \"rmsnorm\", got " .. tostring(cfg.norm))
  end
  self.ln_1 = norm()
  self.attn = Attention {d_model = cfg.d_model, n_head = cfg.n_head, n_kv_head = cfg.n_kv_head, bias = bias,
                         dropout = cfg.dropout, rope = cfg.rope, rope_theta = cfg.rope_theta, head_dim = cfg.head_dim,
                         qk_norm = cfg.qk_norm, norm_eps = cfg.qk_norm and cfg.norm_eps or nil, qkv_bias = cfg.qkv_bias,
                         out_bias = cfg.out_bias, rope_freq = cfg.rope_freq, window = cfg.window, dtype = cfg.dtype,
                         device = cfg.device}
  self.ln_2 = norm()
  local ffn = {d_model = cfg.d_model, hidden = cfg.ffn_hidden, bias = O.boolean("Block", "mlp_bias", cfg.mlp_bias, bias), dropout = cfg.dropout, dtype = cfg.dtype,
               device = cfg.device}
  if cfg.moe ~= nil and cfg.mlp ~= nil and cfg.mlp ~= "gelu" and cfg.mlp ~= "swiglu" then
    raise("Block: mlp must be \"gelu\" or \"swiglu\", got " .. tostring(cfg.mlp))
  elseif cfg.moe ~= nil then
    local opts = {d_model = cfg.d_model, d_ff = cfg.ffn_hidden or (cfg.mlp == "swiglu" and SwiGLU.default_hidden(cfg.d_model)
                  or 4 * cfg.d_model), activation = cfg.mlp or "gelu", dropout = cfg.dropout, dtype = cfg.dtype,
                  device = cfg.device}
    if type(cfg.moe) ~= "table" then raise("Block: moe must be a table of nn.MoE options, got " .. type(cfg.moe)) end
    for k, v in pairs(cfg.moe) do opts[k] = v end
    self.mlp = MoE(opts)
  elseif cfg.mlp == nil or cfg.mlp == "gelu" then
    self.mlp = MLP(ffn)
  elseif cfg.mlp == "swiglu" then
    self.mlp = SwiGLU(ffn)
  else
    raise("Block: mlp must be \"gelu\" or \"swiglu\", got " .. tostring(cfg.mlp))
  end
end

local release = require("lutra.nn.grad").release

-- (the intermediates are released as soon as used: see nn.grad.release)
-- ln_2 computes exactly LayerNorm's or RMSNorm's forward (not a subclass that changed it).
local function fusable(norm)
  local f = norm.forward
  return (f == LayerNorm.forward or f == RMSNorm.forward) and norm.forward_add ~= nil
end

-- The block with its last residual add left to the caller: returns x1 and m, whose sum x1 + m
-- is forward's result, so that the next norm can do that add in its own kernel (Transformer
-- fuses it into the next block's ln_1, or into ln_f). pending: the previous block's m, not yet
-- added to x (nil: x is the whole residual stream). The values are forward's, bit for bit.
function Block:forward_split(x, pending, cache, pos, opts)
  local h
  local fuse = self.fuse_residual_norm
  if pending ~= nil then
    local sum
    if fuse and fields.dtype_id(pending) == fields.dtype_id(x) and fusable(self.ln_1) then
      sum, h = self.ln_1:forward_add(pending, x) -- sum = pending + x (= x + pending exactly)
    else
      sum = x + pending
      h = self.ln_1(sum)
    end
    release(pending, sum)
    release(x, sum)
    x = sum
  else
    h = self.ln_1(x)
  end
  local a = self.attn(h, cache, pos, opts)
  release(h, x, a)
  local x1
  if fuse and fields.dtype_id(a) == fields.dtype_id(x) and fusable(self.ln_2) then
    x1, h = self.ln_2:forward_add(a, x) -- x1 = a + x (= x + a exactly), h = ln_2(x1)
    release(a, x)
  else
    x1 = x + a
    release(a, x)
    h = self.ln_2(x1)
  end
  if pending ~= nil then release(x, x1) end -- the sum made here (the caller's x is its own)
  local hook = rawget(self, "_mlp_input_hook")
  if hook then hook(self, h) end
  local m = self.mlp(h)
  release(h, x1, m)
  return x1, m
end

-- block:on_mlp_input(fn): fn(block, h) sees the MLP's input h = ln_2(x + attn(ln_1(x))) on each
-- forward, so that a layer can be inspected inside the model's own forward (nil: no hook).
function Block:on_mlp_input(fn) rawset(self, "_mlp_input_hook", fn) end

-- Whether a model may chain forward_split: the block's forward is this one, and its ln_1 can fuse.
function Block:splittable()
  return self.fuse_residual_norm and self.forward == Block.forward and self.forward_split == Block.forward_split
    and fusable(self.ln_1)
end
Block.fusable_norm = fusable

function Block:forward(x, cache, pos, opts)
  local x1, m = self:forward_split(x, nil, cache, pos, opts)
  local y = x1 + m
  release(m, x1)
  release(x1, x)
  return y
end

return Block
