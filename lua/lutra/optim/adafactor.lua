-- lutra.optim.adafactor — Adafactor (Shazeer & Stern 2018), with the settings and arithmetic of
-- transformers' transformers.optimization.Adafactor (the reference; torch.optim.Adafactor of
-- PyTorch 2.5+ is a different variant with other defaults), through the C step lt_adafactor_step.
--
--   local opt = lutra.optim.Adafactor(model)                      -- relative step, as transformers
--   local opt = lutra.optim.Adafactor(model, {lr = 1e-3, relative_step = false, scale_parameter = false})
--
-- Per step t of a parameter p (f32/f64; bf16/f16 through an f32 copy, as transformers):
--   rel = relative_step and min(warmup_init and 1e-6 * t or 1e-2, 1 / sqrt(t)) or lr
--   lr_t = (scale_parameter and max(eps[2], rms(p)) or 1) * rel;  beta2t = 1 - t^decay_rate
--   second moment of grad^2 + eps[1]: factored (row and column means) for 2+ dims, full for 1-d;
--   update clipped to rms <= clip_threshold, times lr_t; averaged by beta1 (when given);
--   p = p - lr_t * weight_decay * p - update
-- State per parameter: {step, exp_avg (with beta1), exp_avg_sq_row and exp_avg_sq_col (2+ dims,
-- shapes [..., R] and [..., C]) or exp_avg_sq (1-d)}, transformers' names.
--
-- update_group steps a whole param group with lt_adafactor_step_multi: one C call per device and
-- step count (on CUDA one set of launches for all tensors), each tensor with its own parameter
-- scale and clipping, bitwise what update gives it; a refused call falls back to update, tensor
-- by tensor, so that errors name the tensor.
local ffi = require "ffi"
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local create = require "lutra.create"
local common = require "lutra.optim.common"
local Optimizer = require "lutra.optim.optimizer"
local group_step = require "lutra.optim.group_step"

local C_adafactor = lt.fn("lt_adafactor_step")
local C_adafactor_multi = lt.fn("lt_adafactor_step_multi")
local raise = errors.raise

local kind = {
  name = "adafactor",
  title = "Adafactor",
  defaults = {eps = {1e-30, 1e-3}, clip_threshold = 1.0, decay_rate = -0.8, weight_decay = 0,
              scale_parameter = true, relative_step = true, warmup_init = false},
  optional = {lr = true, beta1 = true},
  fields = {step = "number", exp_avg = "tensor", exp_avg_sq = "tensor", exp_avg_sq_row = "tensor",
            exp_avg_sq_col = "tensor"},
  required = {step = true},
}
kind.known = common.known(kind)

local function boolean(g, who, key)
  if type(g[key]) ~= "boolean" then raise(string.format("%s: %s must be a boolean, got %s", who, key, tostring(g[key]))) end
end

function kind.check(g, who)
  for _, k in ipairs{"scale_parameter", "relative_step", "warmup_init"} do boolean(g, who, k) end
  if g.relative_step then
    if g.lr ~= nil then
      raise(who .. ": lr cannot be combined with relative_step = true (the step size is relative); "
        .. "give relative_step = false to use lr")
    end
  else
    if g.lr == nil then raise(who .. ": lr is required with relative_step = false") end
    common.number(g, who, "lr", 0)
    if g.warmup_init then raise(who .. ": warmup_init = true requires relative_step = true") end
  end
  local e = g.eps
  if type(e) ~= "table" or #e ~= 2 or type(e[1]) ~= "number" or type(e[2]) ~= "number" or not (e[1] >= 0)
      or not (e[2] >= 0) then
    raise(string.format("%s: eps must be a list of two numbers >= 0 {eps1, eps2}, got %s", who, tostring(e)))
  end
  common.number(g, who, "clip_threshold", 0)
  if g.clip_threshold == 0 then raise(who .. ": clip_threshold must be > 0, got 0") end
  common.number(g, who, "decay_rate", -math.huge, 0)
  common.number(g, who, "weight_decay", 0)
  if g.beta1 ~= nil then common.number(g, who, "beta1", 0, 1, true) end
end

function kind.state_dtype(p) return p.dtype == "f64" and "f64" or "f32" end

local function zeros(shape, p)
  return Optimizer.keep(create.zeros(shape, {dtype = kind.state_dtype(p), device = p.device}))
end

-- The shape of state field f for a parameter of `shape` (for checkpoints): the row moment drops
-- the last dim, the column moment the one before it.
function kind.state_shape(shape, f)
  local out = {}
  for d = 1, #shape do
    if not ((f == "exp_avg_sq_row" and d == #shape) or (f == "exp_avg_sq_col" and d == #shape - 1)) then
      out[#out + 1] = shape[d]
    end
  end
  return out
end

function kind.init(p, group)
  local st, shape = {step = 0}, p.shape
  if group and group.beta1 ~= nil then st.exp_avg = zeros(shape, p) end
  if #shape >= 2 then
    st.exp_avg_sq_row = zeros(kind.state_shape(shape, "exp_avg_sq_row"), p)
    st.exp_avg_sq_col = zeros(kind.state_shape(shape, "exp_avg_sq_col"), p)
  else
    st.exp_avg_sq = zeros(shape, p)
  end
  return st
end

-- The relative step size of step t (transformers' _get_lr before the parameter scale).
local function rel_step(group, t, lr)
  if not group.relative_step then return lr end
  if lr ~= nil and lr ~= group.lr then
    raise("Adafactor: an lr (a schedule or step{lr =}) cannot be combined with relative_step = true")
  end
  return math.min(group.warmup_init and 1e-6 * t or 1e-2, 1 / math.sqrt(t))
end

function kind.update(p, g, st, group, lr)
  local t = st.step + 1
  local rel = rel_step(group, t, lr)
  if group.beta1 ~= nil and st.exp_avg == nil then st.exp_avg = zeros(p.shape, p) end
  local work = p
  if p.dtype ~= "f32" and p.dtype ~= "f64" then work = p:to("f32") end -- bf16/f16: through f32
  if g.dtype ~= work.dtype then g = g:to(work.dtype) end
  local rc = C_adafactor(work, g, group.beta1 ~= nil and st.exp_avg or nil, st.exp_avg_sq_row, st.exp_avg_sq_col,
    st.exp_avg_sq, rel, group.scale_parameter and 1 or 0, group.eps[1], group.eps[2], group.clip_threshold,
    1 - t ^ group.decay_rate, group.beta1 or 0, group.weight_decay)
  if rc ~= 0 then errors.fail() end
  if work ~= p then p:copy_(work) end
  st.step = t
  Optimizer.bump(p)
end

-- One step of a param group (lutra.optim.group_step): one lt_adafactor_step_multi per batch.
function kind.update_group(items, group, lr)
  group_step.run(kind, items, group, lr, function(b, t)
    local n = #b
    local arrays = {}
    for _, name in ipairs{"p", "g", "m", "row", "col", "v"} do arrays[name] = ffi.new("lt_tensor*[?]", n) end
    for i, it in ipairs(b) do
      local st = it.st
      if group.beta1 ~= nil and st.exp_avg == nil then st.exp_avg = zeros(it.p.shape, it.p) end
      arrays.p[i - 1], arrays.g[i - 1] = it.work, it.work_grad
      if group.beta1 ~= nil then arrays.m[i - 1] = st.exp_avg end
      if st.exp_avg_sq_row ~= nil then arrays.row[i - 1], arrays.col[i - 1] = st.exp_avg_sq_row, st.exp_avg_sq_col end
      if st.exp_avg_sq ~= nil then arrays.v[i - 1] = st.exp_avg_sq end
    end
    return C_adafactor_multi(n, arrays.p, arrays.g, group.beta1 ~= nil and arrays.m or nil, arrays.row, arrays.col,
      arrays.v, rel_step(group, t, lr), group.scale_parameter and 1 or 0, group.eps[1], group.eps[2],
      group.clip_threshold, 1 - t ^ group.decay_rate, group.beta1 or 0, group.weight_decay)
  end)
end

return kind
