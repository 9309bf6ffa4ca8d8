-- pm_train.lua PLACE — a tiny model trained by lutra.train that raises at PLACE (forward,
-- loss_fn, data, hook, backward, checkpoint) from a function with a local `marker` and an
-- upvalue `scale`: tests/cli/test_post_mortem.sh opens the post-mortem REPL there.
local lt = require "lutra"
local op = require "lutra.autograd.op"
local place = arg[1] or "forward"
local scale = 7

-- y = x * 2 with a backward that raises when asked to
local record_double = op.declare {
  name = "PmDoubleBackward",
  record = function(cls, out, x) op.attach(out, {op.edge(x), cls = cls}) end,
  backward = function(n, g)
    local marker = "in custom backward"
    if place == "backward" then error("custom backward fails: " .. marker .. " " .. scale) end
    return g * 2
  end,
}
local function double(x)
  local out = lt.no_grad(function() return x * 2 end)
  record_double(out, x)
  return out
end

local Model = lt.nn.Module:extend("PmModel")
function Model:init() self.lin = lt.nn.Linear(4, 4) end
function Model:forward(x)
  local marker = "in forward"
  local h = self.lin(x)
  if place == "forward" then error("forward fails: " .. marker .. " " .. scale) end
  if place == "hook" then
    h:register_hook(function(g)
      local marker = "in hook" -- luacheck: ignore
      error("hook fails: " .. marker .. " " .. scale)
    end)
  end
  if place == "checkpoint" then
    h = lt.checkpoint(function(a)
      local marker = "in recomputation" -- luacheck: ignore
      if lt.is_grad_enabled() then error("recomputation fails: " .. marker .. " " .. scale) end
      return a:relu()
    end, h)
  end
  return double(h)
end

local data = {}
function data:next()
  local marker = "in data"
  if place == "data" then error("data fails: " .. marker .. " " .. scale) end
  return lt.ones(2, 4), lt.zeros(2, 4)
end

local function loss_fn(model, batch)
  local marker = "in loss_fn"
  local y = model:forward(batch.x)
  if place == "loss_fn" then error("loss_fn fails: " .. marker .. " " .. scale) end
  return ((y - batch.y) ^ 2):mean()
end

local model = Model()
lt.train{model = model, data = data, loss_fn = loss_fn, quiet = true,
         config = {steps = 2, warmup = 0, eval_every = 0, lr = 0.1}}
print("trained")
