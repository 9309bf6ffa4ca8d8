-- bench/zero_memory.lua — bytes per rank of parameters, gradients and optimizer state
-- (AdamW) under ZeRO stages 0 (plain data parallel), 1, 2 and 3, for the issue's figure.
--
--   mpirun --oversubscribe -np 4 -x OMP_NUM_THREADS=1 build/lutra bench/zero_memory.lua [arch] [n_layer] [d_model]
--
-- Each stage trains two steps of the same gpt2 model (default 4 layers, d_model 128) on
-- this rank's rows of a global batch of 8; the figures are z:memory() after finish() of
-- the second step (the gradients and the optimizer's moments both exist then). Expected:
-- stage 1 cuts optimizer state to 1/dp, stage 2 the gradients too, stage 3 the
-- parameters too (up to the padding of the last shard of each parameter). The peak column
-- is the CPU allocator's high-water mark during step 2, everything live included.
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local zero = require "lutra.dist.zero"
local optim = require "lutra.optim"

comm.init()
local g = comm.world
local arch = arg and arg[1] or "gpt2"
local n_layer = tonumber(arg and arg[2]) or 4
local d_model = tonumber(arg and arg[3]) or 128
local B, T, V = 8, 64, 256
if B % g.size ~= 0 then error("zero_memory: the global batch of 8 does not split over " .. g.size .. " ranks") end

local function build()
  lt.manual_seed(1)
  local cfg = {arch = arch, n_layer = n_layer, d_model = d_model, n_head = 4, vocab_size = V, block_size = T,
               dropout = 0}
  if arch == "llama" then cfg.n_kv_head = 2 end
  return lt.models.build(cfg)
end

lt.manual_seed(2)
local x, y = lt.randint(0, V, {B, T}), lt.randint(0, V, {B, T})
local rows = B / g.size
x, y = x:narrow(0, g.rank * rows, rows):contiguous(), y:narrow(0, g.rank * rows, rows):contiguous()

local results, n_params = {}, 0
for stage = 0, 3 do
  collectgarbage() -- the previous stage's model and buffers go back first
  collectgarbage()
  local base_bytes = lt.memory_stats().allocated
  local model = build()
  n_params = model:num_parameters()
  local z = zero.new(model, g, {stage = stage, optimizer = function(named)
    return optim.AdamW(named, {lr = 1e-3, weight_decay = 0.1})
  end})
  local peak
  for step = 1, 2 do
    if step == 2 then lt.reset_peak_memory_stats() end
    lt.tidy(function()
      z.optimizer:zero_grad()
      model:zero_grad()
      local _, loss = model(x, y)
      loss:backward()
      z:finish()
      if step == 2 then results[stage] = z:memory() end
      z:clip_grad_norm(1.0)
      z.optimizer:step()
      z:after_step()
    end)
    if step == 2 then peak = lt.memory_stats().peak end
  end
  z:remove()
  results[stage].peak = peak - base_bytes
end

if g.rank == 0 then
  local MB = 1024 * 1024
  print(string.format("ZeRO memory per rank, dp=%d: %s, %d layers, d_model %d, vocab %d (%d parameters, fp32, AdamW)",
    g.size, arch, n_layer, d_model, V, n_params))
  print(string.format("%-6s %10s %10s %10s %10s %10s   %s", "stage", "params MB", "grads MB", "optim MB", "total MB",
    "peak MB", "vs stage 0 (params / grads / optim)"))
  local base = results[0]
  for stage = 0, 3 do
    local r = results[stage]
    print(string.format("%-6d %10.3f %10.3f %10.3f %10.3f %10.3f   %.3f / %.3f / %.3f", stage, r.params / MB,
      r.grads / MB, r.optimizer / MB, (r.params + r.grads + r.optimizer) / MB, r.peak / MB, r.params / base.params,
      r.grads / base.grads, r.optimizer / base.optimizer))
  end
  print("(params, grads, optim: z:memory() after finish() of step 2; peak: the allocator's high-water mark over")
  print(" step 2 on rank 0 above what was allocated before the model was built: activations and buffers included)")
  if false then
  end
end
