-- lutra.optim.sgd — SGD with momentum, dampening, Nesterov and L2 weight decay, as
-- torch.optim.SGD (the same operations in the same order):
--   d = g + wd * p                                  (wd ~= 0)
--   buf = d at the first step, then buf = momentum * buf + (1 - dampening) * d
--   d = d + momentum * buf (nesterov), or d = buf   (momentum ~= 0)
--   p = p - lr * d
-- State per parameter: {momentum_buffer = tensor} (empty without momentum), in the
-- parameter's dtype. lr has no default, as torch's.
local ops = require "lutra.ops"
local common = require "lutra.optim.common"
local Optimizer = require "lutra.optim.optimizer"

local raise = require("lutra.errors").raise
local add, mul = ops.add, ops.mul

local kind = {
  name = "sgd",
  title = "SGD",
  defaults = {momentum = 0, dampening = 0, weight_decay = 0, nesterov = false},
  optional = {lr = true},
  fields = {momentum_buffer = "tensor"},
  required = {},
}
kind.known = common.known(kind)

function kind.check(g, who)
  if g.lr == nil then raise(who .. ": lr is required (SGD has no default lr)") end
  common.number(g, who, "lr", 0)
  common.number(g, who, "momentum", 0)
  common.number(g, who, "dampening")
  common.number(g, who, "weight_decay", 0)
  if type(g.nesterov) ~= "boolean" then raise(who .. ": nesterov must be a boolean, got " .. type(g.nesterov)) end
  if g.nesterov and (g.momentum <= 0 or g.dampening ~= 0) then
    raise(who .. ": Nesterov momentum needs momentum > 0 and dampening 0")
  end
end

function kind.state_dtype(p) return p.dtype end

function kind.init() return {} end

-- Temporaries are freed by the step's lutra.tidy scope.
function kind.update(p, g, st, group, lr)
  local wd, momentum, dampening = group.weight_decay, group.momentum, group.dampening
  local d = g
  if wd ~= 0 then d = add(g, mul(p, wd)) end
  if momentum ~= 0 then
    local buf = st.momentum_buffer
    if buf == nil then
      buf = Optimizer.keep(d:clone())
      st.momentum_buffer = buf
    else
      mul(buf, momentum, buf)
      if dampening == 0 then add(buf, d, buf) else add(buf, mul(d, 1 - dampening), buf) end
    end
    if group.nesterov then d = add(d, mul(buf, momentum)) else d = buf end
  end
  add(p, mul(d, -lr), p)
end

return kind
