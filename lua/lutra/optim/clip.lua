-- lutra.optim.clip — gradient clipping by global norm.
--
--   local norm = lutra.optim.clip_grad_norm(model, 1.0)   -- or a list of tensors, an optimizer
--
-- The total norm is sqrt(sum over params of |g|^2), from one multi-tensor call per device
-- (lt_multi_tensor_sumsq: each chunk of each gradient summed in f64, the chunks added in a
-- fixed order; bf16/f16 gradients read as f32). Gradients are scaled in place by
-- max_norm / (norm + 1e-6), torch's coefficient, only when that is below 1, by one
-- lt_multi_tensor_scale per device. On a GPU the coefficient is formed on the device
-- (lt_clip_coef) and the scale queued before the norm is read back: the one wait is for the
-- returned number. Parameters without a gradient are skipped. A nan or inf norm is returned
-- and the gradients are left alone (torch would scale them by nan or 0), or raised with
-- opts.error_if_nonfinite. norm_type = math.huge takes the largest |g| per gradient.
-- opts: {norm_type = 2 or math.huge, error_if_nonfinite = false}
local ffi = require "ffi"
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local ops = require "lutra.ops"
local create = require "lutra.create"
local memory = require "lutra.memory"
local Optimizer = require "lutra.optim.optimizer"

local C_sumsq, C_scale, C_coef = lt.fn("lt_multi_tensor_sumsq"), lt.fn("lt_multi_tensor_scale"), lt.fn("lt_clip_coef")

local M = {}

local raise, is_tensor = errors.raise, ops.is_tensor
local sqrt, huge, max = math.sqrt, math.huge, math.max

-- The parameters of what clip_grad_norm was given.
local function params_of(src, who)
  if is_tensor(src) then return {src} end
  if type(src) ~= "table" then raise(string.format("%s: expected parameters (tensors, a module or an optimizer), got %s", who, type(src))) end
  if getmetatable(src) == Optimizer then return src.params end
  if type(src.parameters) == "function" then
    local list = src:parameters()
    if type(list) == "function" then
      local out = {}
      for p in list do out[#out + 1] = p end
      return out
    end
    return list
  end
  return src
end

local function max_abs_of(g)
  local dt = g.dtype
  if dt == "bf16" or dt == "f16" then g = g:to("f32") end
  return g:abs():max():item()
end

-- The gradients of a list (nil entries, up to n, skipped) by device, in order:
-- {{device = name, tensors = C array, n =, list = {...}}, ...}.
local function by_device(grads, n, who)
  local groups, index = {}, {}
  for i = 1, n or table.maxn(grads) do
    local g = grads[i]
    if g ~= nil then
      if not is_tensor(g) then raise(string.format("%s: gradient %d is %s, not a tensor", who, i, type(g))) end
      local dev = g.device
      local d = index[dev]
      if not d then
        d = {device = dev, list = {}}
        index[dev], groups[#groups + 1] = d, d
      end
      d.list[#d.list + 1] = g
    end
  end
  for _, d in ipairs(groups) do
    d.n = #d.list
    d.tensors = ffi.new("lt_tensor*[?]", d.n)
    for i, g in ipairs(d.list) do d.tensors[i - 1] = g end
  end
  return groups
end

-- The sum of squares of a device's gradients, as a one-element f64 tensor on that device.
local function sumsq_of(d)
  local out = create.zeros({1}, {dtype = "f64", device = d.device})
  if C_sumsq(out, d.n, d.tensors) ~= 0 then errors.fail() end
  return out
end

local function check_opts(who, max_norm, opts)
  if type(max_norm) ~= "number" or not (max_norm >= 0) then
    raise(string.format("%s: max_norm must be a number >= 0, got %s", who, tostring(max_norm)))
  end
  opts = opts or {}
  if type(opts) ~= "table" then raise(who .. ": opts must be a table, got " .. type(opts)) end
  for k in pairs(opts) do
    if k ~= "norm_type" and k ~= "error_if_nonfinite" then
      raise(string.format("%s: unknown option '%s' (norm_type, error_if_nonfinite)", who, tostring(k)))
    end
  end
  local norm_type = opts.norm_type or 2
  if norm_type ~= 2 and norm_type ~= huge then
    raise(string.format("%s: norm_type must be 2 or math.huge, got %s", who, tostring(norm_type)))
  end
  return opts, norm_type
end

-- The global norm of a list of gradients (nil entries, up to n, are skipped).
function M.total_norm(grads, norm_type, n)
  norm_type = norm_type or 2
  local groups = by_device(grads, n, "grad_norm")
  if norm_type == huge then
    local total, nan = 0, false
    for _, d in ipairs(groups) do
      for _, g in ipairs(d.list) do
        local norm = memory.tidy(max_abs_of, g)
        if norm ~= norm then nan = true end
        total = max(total, norm)
      end
    end
    return nan and 0 / 0 or total
  end
  local total = 0
  for _, d in ipairs(groups) do
    local sq = sumsq_of(d)
    total = total + sq:item()
    sq:free()
  end
  return sqrt(total)
end

-- Scales every gradient of d by the one-element f64 tensor coef (on d's device).
local function scale(d, coef)
  if C_scale(d.n, d.tensors, coef) ~= 0 then errors.fail() end
end

-- Clips a list of gradients (entries may be nil up to n) in place; returns the total norm.
function M.clip_grads(grads, max_norm, opts, n)
  local who = "clip_grads"
  local norm_type
  opts, norm_type = check_opts(who, max_norm, opts)
  if type(grads) ~= "table" then raise(who .. ": expected a list of gradients, got " .. type(grads)) end
  local total
  Optimizer.without_grad(function()
    local groups = by_device(grads, n, who)
    if norm_type == 2 and #groups == 1 and groups[1].device ~= "cpu" then
      -- one GPU: the coefficient on the device, the scale queued (by 1 when not clipping, or
      -- for a nan or inf norm: the gradients unchanged), then the one read back
      local d = groups[1]
      local sq = sumsq_of(d)
      local coef = create.zeros({1}, {dtype = "f64", device = d.device})
      if C_coef(coef, sq, max_norm) ~= 0 then errors.fail() end
      scale(d, coef)
      total = sqrt(sq:item())
      sq:free()
      coef:free()
      return
    end
    total = M.total_norm(grads, norm_type, n)
    local coef = max_norm / (total + 1e-6)
    if total == total and total ~= huge and coef < 1 then
      for _, d in ipairs(groups) do
        local c = create.full({1}, coef, {dtype = "f64", device = d.device})
        scale(d, c)
        c:free()
      end
    end
  end)
  if total ~= total or total == huge then
    if opts.error_if_nonfinite then
      raise(string.format("clip_grad_norm: the total norm of the gradients is %s (error_if_nonfinite)", tostring(total)))
    end
  end
  return total
end

-- Clips the .grad of parameters (a tensor, a list, a module, an optimizer); returns the norm.
function M.clip_grad_norm(params, max_norm, opts)
  local list = params_of(params, "clip_grad_norm")
  local grads, n = {}, 0
  for i, p in ipairs(list) do
    if not is_tensor(p) then raise(string.format("clip_grad_norm: parameter %d is %s, not a tensor", i, type(p))) end
    grads[i] = p.grad
    n = i
  end
  return M.clip_grads(grads, max_norm, opts, n)
end

-- The global gradient norm without clipping (for logging).
function M.grad_norm(params, norm_type)
  local list = params_of(params, "grad_norm")
  local grads = {}
  for i, p in ipairs(list) do grads[i] = p.grad end
  local total
  Optimizer.without_grad(function() total = M.total_norm(grads, norm_type, #list) end)
  return total
end

return M
