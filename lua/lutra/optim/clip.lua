-- lutra.optim.clip — gradient clipping by global norm.
--
--   local norm = lutra.optim.clip_grad_norm(model, 1.0)   -- or a list of tensors, an optimizer
--
-- The total norm is sqrt(sum over params of |g|^2): each gradient's norm comes from the
-- C reduction (accumulated in double; bf16/f16 gradients go through f32), their squares
-- are summed in Lua doubles. Gradients are scaled in place by max_norm / (norm + 1e-6),
-- torch's coefficient, only when that is below 1. Parameters without a gradient are
-- skipped. A nan or inf norm is returned and the gradients are left alone (torch would
-- scale them by nan or 0), or raised with opts.error_if_nonfinite.
-- opts: {norm_type = 2 or math.huge, error_if_nonfinite = false}
local errors = require "lutra.errors"
local ops = require "lutra.ops"
local memory = require "lutra.memory"
local Optimizer = require "lutra.optim.optimizer"

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

local function grad_norm_of(g, norm_type)
  local dt = g.dtype
  if dt == "bf16" or dt == "f16" then g = g:to("f32") end
  if norm_type == huge then return g:abs():max():item() end
  return g:norm():item()
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
  local total, nan = 0, false
  for i = 1, n or table.maxn(grads) do
    local g = grads[i]
    if g ~= nil then
      if not is_tensor(g) then raise(string.format("grad_norm: gradient %d is %s, not a tensor", i, type(g))) end
      local norm = memory.tidy(grad_norm_of, g, norm_type)
      if norm ~= norm then nan = true end
      if norm_type == huge then total = max(total, norm) else total = total + norm * norm end
    end
  end
  if nan then return 0 / 0 end
  if norm_type == huge then return total end
  return sqrt(total)
end

-- Clips a list of gradients (entries may be nil up to n) in place; returns the total norm.
function M.clip_grads(grads, max_norm, opts, n)
  local who = "clip_grads"
  local norm_type
  opts, norm_type = check_opts(who, max_norm, opts)
  if type(grads) ~= "table" then raise(who .. ": expected a list of gradients, got " .. type(grads)) end
  local total
  Optimizer.without_grad(function() total = M.total_norm(grads, norm_type, n) end)
  if total ~= total or total == huge then
    if opts.error_if_nonfinite then
      raise(string.format("clip_grad_norm: the total norm of the gradients is %s (error_if_nonfinite)", tostring(total)))
    end
    return total
  end
  local coef = max_norm / (total + 1e-6)
  if coef < 1 then
    Optimizer.without_grad(function()
      for i = 1, n or table.maxn(grads) do
        local g = grads[i]
        if g ~= nil then ops.mul(g, coef, g) end
      end
    end)
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
