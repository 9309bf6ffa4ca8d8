-- lutra.dist — parallel training over MPI (CPU tensors) and NCCL (GPU tensors).
--
--   local dist = require "lutra.dist"          -- also lutra.dist
--   local mesh = dist.init{dp = "auto", tp = 2, pp = 1, zero = 0}   -- config.parallel
--   mesh.dp:all_reduce(t, "avg")                -- groups: mesh.world, .dp, .tp, .pp, .cp, .dp_cp, .dp_tp, .embed
--   dist.rank(), dist.size(), dist.is_main()
--   local tok, data = dist.once(prepare)          -- rank 0 first, then the others
--
-- Under mpirun / srun / `lutra launch` every process is a rank of the MPI world; without
-- a launcher the program is a world of one and every collective is local. The trainer
-- (lutra.train) takes the mesh from config.parallel and parallelizes the model itself
-- (lutra.dist.parallelize): tensor parallel, pipeline stages, data parallel or ZeRO.
-- The pieces: comm (groups and collectives, the watchdog), mesh, spec (shard boxes),
-- ddp, zero, tp, pp. See docs in each file.
local errors = require "lutra.errors"
local mesh_mod = require "lutra.dist.mesh"

local raise = errors.raise

local M = {}

M.spec = require "lutra.dist.spec"
M.DEFAULTS = mesh_mod.DEFAULTS

-- A fresh copy of the parallel keys and their defaults, for a recipe's config:
--   local cfg = lt.config{..., parallel = lt.dist.defaults()}   -- --parallel.tp=2 etc.
function M.defaults()
  local out = {}
  for k, v in pairs(mesh_mod.DEFAULTS) do out[k] = v end
  return out
end

local current = nil -- the mesh of the last init

local function comm() return require "lutra.dist.comm" end
M.comm = setmetatable({}, {__index = function(_, k) return comm()[k] end})

local function same_options(a, b)
  for k, v in pairs(a) do
    if type(v) ~= "table" and b[k] ~= v then return false end
  end
  return true
end

-- Initializes the world (idempotent) and returns the mesh of `parallel` (config.parallel:
-- dp, tp, pp, zero, ...; see lutra/dist/mesh.lua for every key). A second call with the
-- same layout returns the same mesh; with another layout, new groups.
function M.init(parallel)
  local opts = mesh_mod.options(parallel)
  if current and same_options(opts, current.options) and same_options(current.options, opts) then return current end
  local c = comm()
  c.init()
  if opts.timeout ~= mesh_mod.DEFAULTS.timeout or not os.getenv("LUTRA_COMM_TIMEOUT") then c.set_timeout(opts.timeout) end
  if opts.debug then c.set_debug(true) end
  current = mesh_mod.build(opts, c)
  return current
end

-- The mesh of the last init, or nil.
function M.mesh() return current end

function M.rank() return current and current.rank or (package.loaded["lutra.dist.comm"] and comm().rank() or 0) end
function M.size() return current and current.size or (package.loaded["lutra.dist.comm"] and comm().size() or 1) end
function M.is_main() return M.rank() == 0 end

local function pack(...) return {n = select("#", ...), ...} end

-- Runs fn(...) on rank 0 first and then, once rank 0 is done, on the other ranks: rank 0
-- writes what the others then find ready (a corpus, a tokenizer, a token file). Returns fn's
-- results on every rank; a world of one runs fn once. When fn fails on rank 0 every rank
-- raises (the others say rank 0's error) instead of waiting for it in a barrier.
function M.once(fn, ...)
  if type(fn) ~= "function" then raise("dist.once: expected a function, got " .. type(fn)) end
  local world = current and current.world or (M.launched() and comm().world) or nil
  if world == nil or world.size <= 1 then return fn(...) end
  if world.rank == 0 then
    local results = pack(pcall(fn, ...))
    world:all_gather_text(results[1] and "" or tostring(results[2]))
    if not results[1] then error(results[2], 0) end
    return unpack(results, 2, results.n)
  end
  local failure = world:all_gather_text("")[1]
  if failure ~= "" then raise("dist.once: rank 0 failed: " .. failure) end
  return fn(...)
end

-- Whether this process was started by a launcher (mpirun, srun): a world of many.
function M.launched()
  return os.getenv("OMPI_COMM_WORLD_SIZE") ~= nil or os.getenv("PMIX_RANK") ~= nil or os.getenv("SLURM_PROCID") ~= nil
end

-- dist.parallelize(model, mesh, {optimizer = function(named) -> optimizer}) -> the parallel step driver
-- (tensor parallel, pipeline stages, then ZeRO or data parallel over the mesh): lutra/dist/parallelize.lua.
function M.parallelize(model, mesh, opts)
  if type(mesh) ~= "table" or getmetatable(mesh) ~= mesh_mod.Mesh then
    raise("dist.parallelize: expected the mesh of lutra.dist.init as the second argument")
  end
  return require("lutra.dist.parallelize").new(model, mesh, opts)
end

-- The device of this rank: LUTRA_DEVICE, else cuda:(local rank % GPUs) where GPUs exist, else "cpu".
function M.default_device() return require("lutra.dist.device").default_device() end

-- Local shape, global shape and offset of a (possibly sharded) tensor (REPL help).
function M.shard_info(t) return require("lutra.dist.inspect").shard_info(t) end

return M
