-- lutra.nn.grad — the few autograd calls nn makes, in one place: requires_grad flags,
-- leaves, detach, dropping gradients and no_grad. Loaded lazily so that nn loads
-- before autograd.
local tensor = require "lutra.tensor"
local S = require "lutra.autograd.state"

local M = {}

local methods, properties = tensor.methods, tensor.properties

function M.requires_grad(t) return t.ag_ ~= 0 end
function M.is_leaf(t) return t.ag_ ~= 2 end

function M.set_requires_grad(t, flag)
  if methods.requires_grad_ then
    t:requires_grad_(flag and true or false)
  elseif S.set_requires_grad then
    S.set_requires_grad(t, flag and true or false)
  end
end

function M.detach(t)
  if methods.detach then return t:detach() end
  return t
end

function M.clear_grad(t)
  if properties.grad then t.grad = nil end
end

-- fn(...) with recording off.
function M.no_grad(fn, ...)
  local ok, ag = pcall(require, "lutra.autograd")
  if ok and type(ag) == "table" and ag.no_grad then return ag.no_grad(fn, ...) end
  local was = S.enabled
  S.enabled = false
  local r = {pcall(fn, ...)}
  S.enabled = was
  if not r[1] then error(r[2], 0) end
  return unpack(r, 2)
end

function M.grad_enabled() return S.enabled end

return M
