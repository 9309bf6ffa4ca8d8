-- lutra.train.precision — config.precision for lutra.train: "fp32" (default), "bf16", "fp16".
--
-- Design: autocast, as torch.autocast + GradScaler. The parameters stay f32 and are the
-- master weights; the optimizer steps them and keeps f32 state, exactly as in fp32 (no
-- second copy, checkpoints and parallel layouts unchanged). Only the forward changes: the
-- loss function runs under lutra.autocast, where F.linear and attention cast their f32
-- inputs and weights to bf16/f16 per call (the casts are recorded, so the weights get f32
-- gradients of the low-precision compute), embeddings hand out low-precision rows, and the
-- activations stay low precision. Norms, softmax and cross-entropy compute in f32 inside their
-- kernels (f32 statistics, f32 per-row losses and loss; norm weights are f32 parameters).
-- Why not Megatron's bf16 parameters with f32 masters in the optimizer: every layer of lutra
-- (DDP buckets, ZeRO shards, TP, checkpoints, LoRA) would have to learn about two copies;
-- autocast leaves them all as they are, and costs a per-call cast of each weight (which the
-- GPU does in one pass over the weights, small next to the matmul).
--
-- "fp16" adds dynamic loss scaling (torch.amp.GradScaler's rules): the loss is multiplied by
-- the scale before backward; the gradients are unscaled (and clipped) in one pass before the
-- step; a step whose gradients hold an inf or nan (their global norm is not finite) is
-- skipped: the optimizer is not called (weights, moments and its step count untouched; the
-- trainer's step and the lr schedule still advance, as with torch's scheduler.step()), and
-- the scale is multiplied by backoff (0.5). After growth_interval good steps in a row the
-- scale is multiplied by growth (2). The scale is reported in the metrics (loss_scale, and
-- skipped = 1 on a skipped step) and saved in checkpoints.
--
-- Config keys: precision ("fp32" | "bf16" | "fp16"), loss_scale (fp16: the initial scale,
-- 2^16), growth_interval (fp16: 2000).
--
--   local prec = precision.new(get)        -- get: key -> config value (or a plain table)
--   loss_fn = prec:wrap(loss_fn)           -- the forward under autocast
--   loss = prec:scale(loss)                -- before backward
--   prec:backward(loss)                    -- under autocast too (checkpointed recomputes)
--   local norm, take = prec:clip_grads(params, max_norm, clip_grad_norm)
--   if take then opt:step() end
--   norm = prec:measured(clip_grad_norm(params, 0)) -- a step not taken (its loss is nan or inf)
--   extras = prec:report(extras)           -- loss_scale, skipped
--   prec:state() / prec:set_state(st)      -- nil for fp32 and bf16
local errors = require "lutra.errors"
local ops = require "lutra.ops"
local autocast = require "lutra.autocast"
local grad = require "lutra.nn.grad"

local raise = errors.raise

local M = {}

M.CHOICES = {"fp32", "bf16", "fp16"}
M.DTYPE = {fp32 = nil, bf16 = "bf16", fp16 = "f16"}
M.DEFAULTS = {loss_scale = 65536, growth_interval = 2000, growth = 2.0, backoff = 0.5}

local Precision = {}
Precision.__index = Precision

local function getter(cfg)
  if type(cfg) == "function" then return cfg end
  cfg = cfg or {}
  return function(key) return cfg[key] end
end

local function positive(who, key, v)
  if type(v) ~= "number" or not (v > 0) or v == math.huge then
    raise(string.format("%s: config.%s must be a positive number, got %s", who, key, tostring(v)))
  end
  return v
end

-- A precision policy from a config (a getter function key -> value, or a table).
function M.new(cfg)
  local get = getter(cfg)
  local mode = get "precision"
  if mode == nil then mode = "fp32" end
  local known = false
  for _, c in ipairs(M.CHOICES) do known = known or mode == c end
  if not known then
    raise(string.format("train: config.precision must be one of \"fp32\", \"bf16\", \"fp16\", got %s",
      type(mode) == "string" and "\"" .. mode .. "\"" or tostring(mode)))
  end
  local self = setmetatable({mode = mode, dtype = M.DTYPE[mode]}, Precision)
  if mode == "fp16" then
    local who = "train"
    self.loss_scale = positive(who, "loss_scale", get "loss_scale" or M.DEFAULTS.loss_scale)
    local gi = get "growth_interval" or M.DEFAULTS.growth_interval
    if type(gi) ~= "number" or gi < 1 or gi % 1 ~= 0 then
      raise("train: config.growth_interval must be an integer >= 1, got " .. tostring(gi))
    end
    self.growth_interval, self.growth, self.backoff = gi, M.DEFAULTS.growth, M.DEFAULTS.backoff
    self.good_steps, self.skipped = 0, 0 -- good steps in a row since the last change; skipped in all
  end
  return self
end

-- loss_fn(model, batch) run under autocast (fp32: loss_fn itself).
function Precision:wrap(loss_fn)
  local dt = self.dtype
  if dt == nil then return loss_fn end
  return function(model, batch) return autocast.run(dt, loss_fn, model, batch) end
end

-- loss * s in f32: a loss a custom loss_fn left in f16 would overflow there (f16 ends at 65504).
local function times(loss, s)
  if loss.dtype ~= "f32" and loss.dtype ~= "f64" then loss = loss:to("f32") end
  return loss * s
end

-- loss:backward() under the same autocast as the forward: activation checkpointing
-- (lutra.checkpoint) recomputes its forward inside backward and must compute it alike.
function Precision:backward(loss)
  if self.dtype == nil then return loss:backward() end
  return autocast.run(self.dtype, loss.backward, loss)
end

-- fn(...) under autocast (fp32: plainly), for a layout's forward_backward.
function Precision:run(fn, ...)
  if self.dtype == nil then return fn(...) end
  return autocast.run(self.dtype, fn, ...)
end

-- The loss to call backward on: loss * scale for fp16, else loss itself.
function Precision:scale(loss)
  if not self.loss_scale then return loss end
  return times(loss, self.loss_scale)
end

-- loss_fn whose loss is scaled (fp16), for callers that run backward themselves (a parallel
-- layout's forward_backward); their loss sums are divided by factor() after.
function Precision:scaled(loss_fn)
  if not self.loss_scale then return loss_fn end
  local s = self.loss_scale
  return function(model, batch)
    local loss, extra = loss_fn(model, batch)
    return times(loss, s), extra
  end
end

function Precision:factor() return self.loss_scale or 1 end

-- The gradient norm after clipping to max_norm (> 0; 0: measured only), and whether to take
-- the step. fp32/bf16: clip_grad_norm(params, max_norm), always taken. fp16: the norm of the
-- scaled gradients decides (not finite: skip, backoff); else one pass multiplies every gradient
-- by min(1, max_norm / (norm + 1e-6)) / scale (torch's unscale_ then clip_grad_norm_).
function Precision:clip_grads(params, max_norm, clip_grad_norm)
  if not self.loss_scale then return clip_grad_norm(params, max_norm), true end
  return self:unscale_and_clip(params, clip_grad_norm(params, 0), max_norm)
end

-- The gradient norm of a step that is not taken for another reason than overflow (its loss is
-- nan or inf: lutra/train/nonfinite.lua), from the norm of the (scaled) gradients: the loss
-- scale and its counters are left alone, and the step is not reported as the scaler's skip.
function Precision:measured(norm)
  if not self.loss_scale then return norm end
  self.last_skipped = false
  return norm / self.loss_scale
end

-- fp16: given the norm of the scaled gradients of params (a list of tensors with .grad),
-- unscales and clips them; returns the true norm and whether to step; updates the scale.
function Precision:unscale_and_clip(params, scaled_norm, max_norm)
  local s = self.loss_scale
  local norm = scaled_norm / s
  if norm ~= norm or norm == math.huge then
    self.loss_scale = s * self.backoff
    self.good_steps, self.skipped = 0, self.skipped + 1
    self.last_skipped = true
    return norm, false
  end
  local coef = 1 / s
  if max_norm and max_norm > 0 then coef = coef * math.min(1, max_norm / (norm + 1e-6)) end
  grad.no_grad(function()
    for _, p in ipairs(params) do
      local g = p.grad
      if g ~= nil then ops.mul(g, coef, g) end
    end
  end)
  self.last_skipped = false
  self.good_steps = self.good_steps + 1
  if self.good_steps >= self.growth_interval then
    self.loss_scale, self.good_steps = s * self.growth, 0
  end
  return norm, true
end

-- extras (a table or nil) with this step's precision metrics: loss_scale (fp16, after the
-- step's update) and skipped = 1 on a skipped step.
function Precision:report(extras)
  if not self.loss_scale then return extras end
  extras = extras or {}
  extras.loss_scale = self.loss_scale
  if self.last_skipped then extras.skipped = 1 end
  return extras
end

-- What a checkpoint keeps (nil: nothing, fp32 and bf16).
function Precision:state()
  if not self.loss_scale then return nil end
  return {mode = self.mode, loss_scale = self.loss_scale, good_steps = self.good_steps, skipped = self.skipped}
end

-- Restores state(); a state of another mode (or none) leaves this one as configured.
function Precision:set_state(st)
  if st == nil or not self.loss_scale or st.mode ~= self.mode then return end
  self.loss_scale = positive("train: checkpoint", "loss_scale", st.loss_scale)
  self.good_steps, self.skipped = st.good_steps or 0, st.skipped or 0
end

M.Precision = Precision
return M
