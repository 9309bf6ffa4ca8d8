-- lutra.nn.grad — the autograd calls nn makes, in one place: requires_grad flags,
-- leaves, detach, dropping gradients, no_grad.
local ag = require "lutra.autograd"

local M = {}

function M.requires_grad(t) return t.requires_grad end
function M.is_leaf(t) return t.is_leaf end
function M.set_requires_grad(t, flag) t:requires_grad_(flag and true or false) end
function M.detach(t) return t:detach() end
function M.clear_grad(t) t.grad = nil end
M.no_grad = ag.no_grad
M.grad_enabled = ag.is_grad_enabled

return M
