-- Rank 1's forward raises inside lutra.train (a local `rank_var` in forward, which the
-- post-mortem REPL must read there, not at the recipe's call of lutra.train); rank 0 trains,
-- then waits in a world barrier that rank 1 never joins (held by the hold file).
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local world = comm.init()

local Model = lt.nn.Module:extend("LaunchTrainFail")
function Model:init() self.lin = lt.nn.Linear(4, 4) end
function Model:forward(x)
  local rank_var = "rank_var in forward of rank " .. comm.rank()
  if comm.rank() == 1 then error("launch_train_fail: forward fails on rank 1") end
  return self.lin(x), rank_var
end

local data = {}
function data:next() return lt.ones(2, 4), lt.zeros(2, 4) end

lt.train{model = Model(), data = data, quiet = true, config = {steps = 2, warmup = 0, eval_every = 0},
         loss_fn = function(model, batch) return ((model:forward(batch.x) - batch.y) ^ 2):mean() end}
world:barrier()
print("rank " .. comm.rank() .. " passed the barrier")
