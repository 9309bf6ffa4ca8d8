-- bench/cp_memory.lua — peak activation memory per rank under context parallel (lutra.dist.cp):
-- one long sequence split over cp ranks, for the issue's scaling table.
--
--   for np in 1 2 4; do mpirun --oversubscribe -np $np -x OMP_NUM_THREADS=1 build/lutra bench/cp_memory.lua; done
--   (args: [T=4096] [arch=llama] [n_layer=2] [d_model=128])
--
-- cp = the world's size. One forward and backward of a small model (f32) on one row of T tokens,
-- this rank's 2 chunks of T / (2 cp) (ring attention: the fused kernel per chunk pair). The
-- figure is the CPU allocator's high-water mark during the step minus what was allocated before
-- it (parameters): activations, the gradients and the ring's buffers. Expected: ~1/cp of cp 1's
-- (measured, 2-core CPU, defaults: 95.1, 52.7, 26.5 MB at cp 1, 2, 4: 0.55x and 0.28x; the ring
-- path keeps q, k, v of its own, where cp 1's fused projection keeps qkv alone).
local lt = require "lutra"
local comm = require "lutra.dist.comm"
local cp = require "lutra.dist.cp"

comm.init()
local world = comm.world
local T = tonumber(arg and arg[1]) or 4096
local arch = arg and arg[2] or "llama"
local n_layer = tonumber(arg and arg[3]) or 2
local d_model = tonumber(arg and arg[4]) or 128
local V = 256

local mesh = lt.dist.init{cp = world.size}
lt.manual_seed(1)
local cfg = {arch = arch, n_layer = n_layer, d_model = d_model, n_head = 4, vocab_size = V, block_size = T, dropout = 0}
if arch == "llama" then cfg.n_kv_head = 2 end
local model = lt.models.build(cfg)
lt.manual_seed(2)
local x, y = lt.randint(0, V, {1, T}), lt.randint(0, V, {1, T})
local batch = {x = x, y = y}
if mesh.cp_size > 1 then batch = cp.split(batch, mesh.cp) end

collectgarbage()
collectgarbage()
local base = lt.memory_stats().allocated
lt.reset_peak_memory_stats()
local t0 = os.clock()
lt.tidy(function()
  local _, loss = model(batch.x, batch.y, batch.cp and {cp = batch.cp} or nil)
  loss:backward()
end)
local cpu_s = os.clock() - t0
local peak = lt.memory_stats().peak - base

local t = lt.tensor({peak}, {dtype = "f64"})
world:all_reduce(t, "max")
local MB = 1024 * 1024
if world.rank == 0 then
  print(string.format("cp %d: %s, %d layers, d_model %d, T %d: peak activation memory per rank %.1f MB "
    .. "(max over ranks; rank 0 step %.2f s CPU)", mesh.cp_size, arch, n_layer, d_model, T, t:item() / MB, cpu_s))
end
