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

local S = require "lutra.autograd.state"
local fields = require "lutra.tensor.fields"

-- Drops the storage of `t`, an intermediate of a forward that no caller sees, unless it is
-- `keep` or `keep2` (an input or a result passed through). Safe where autograd holds its own reference to what it
-- saved: results of recorded ops (saved through aliases), or anything with grad mode off.
-- Then backward frees each activation as soon as the node that saved it has run, rather
-- than when the step's tidy scope ends.
function M.release(t, keep, keep2)
  if t ~= nil and not rawequal(t, keep) and not rawequal(t, keep2) and (fields.is_recorded(t) or not S.enabled) then t:free() end
end
M.grad_enabled = ag.is_grad_enabled

return M
