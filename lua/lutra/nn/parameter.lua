-- lutra.nn.parameter — the mark that makes a tensor a parameter when a module field is given it,
-- as torch.nn.Parameter does.
--
--   self.scale = lt.parameter(lt.ones(d))   -- in a module's init: a parameter named "scale"
--   lt.nn.is_parameter(t)                   -- whether t carries the mark
--
-- lt.parameter(t) marks t itself (no copy) and turns requires_grad on; it returns t. The
-- mark stays with the tensor: a module that registers a tensor as a parameter (self:param,
-- or a marked tensor assigned to a field) marks it too, so `blk.w2 = blk.w1` ties two fields.
-- Views, copies and detach() of a marked tensor are plain tensors.
local errors = require "lutra.errors"
local ops = require "lutra.ops"
local dtype = require "lutra.dtype"
local fields = require "lutra.tensor.fields"

local raise = errors.raise

local M = {}

-- Weak keys: the mark never keeps a tensor alive.
local marked = setmetatable({}, {__mode = "k"})

-- Raises unless t can be a parameter: a floating-point leaf tensor. `what` names it in the message.
function M.check(what, t)
  if not ops.is_tensor(t) then raise(what .. " must be a tensor, got " .. type(t)) end
  if not dtype.is_float(fields.dtype_id(t)) then
    raise(what .. " must be a floating-point tensor, got " .. t.dtype .. " (use self:buffer for others)")
  end
  if not t.is_leaf then
    raise(what .. " must be a leaf tensor (the result of an op that records for autograd is not); "
      .. "assign t:detach()")
  end
end

-- Marks t as a parameter without checks (modules call it on what they registered).
function M.mark(t) marked[t] = true end

-- Whether t was marked by lt.parameter(t) or registered as a module's parameter.
function M.is_parameter(t) return marked[t] == true end

-- lt.parameter(t) -> t, marked as a parameter and requiring grad: assigning it to a module's
-- field declares the parameter (self.w = lt.parameter(lt.randn(d, d))). t must be a
-- floating-point leaf tensor.
function M.parameter(t)
  M.check("parameter: the tensor", t)
  if not t.requires_grad then t:requires_grad_(true) end
  marked[t] = true
  return t
end

return M
