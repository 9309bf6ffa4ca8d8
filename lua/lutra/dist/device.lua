-- lutra.dist.device — where this process runs, from what the launcher told it.
--
--   device.default_device()  -- LUTRA_DEVICE if set; else "cuda:<local rank % GPUs>" when
--                            -- CUDA devices exist (local rank 0 without a launcher); else "cpu"
--   device.local_rank(), device.world_rank(), device.world_size()
--
-- One process per GPU: mpirun (or srun) starts the ranks of a node together, and the
-- local rank (this rank's index among the ranks of its node) picks the GPU, so the ranks of
-- a node never share one. The ranks come from lutra.dist.comm once it is initialized, else
-- from the launcher's environment (the device must be chosen before the communicators).
-- Every function takes an optional opts = {env = table or function(name), device_count = n}
-- so that tests can stand in for the launcher and the GPUs.
local M = {}

-- Environment variables that launchers set (OpenMPI, MPICH's hydra), most specific first. SLURM_* only counts inside
-- a step that srun started with PMIx (an sbatch script alone sets SLURM_LOCALID=0 too).
local LOCAL_RANK_VARS = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"}
local WORLD_RANK_VARS = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}
local WORLD_SIZE_VARS = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}

local function getter(opts)
  local env = opts and opts.env
  if env == nil then return os.getenv end
  if type(env) == "function" then return env end
  return function(name) return env[name] end
end

local function first_int(get, names)
  for _, name in ipairs(names) do
    local v = get(name)
    if v and v:match("^%s*%d+%s*$") then return tonumber(v) end
  end
  return nil
end

-- lutra.dist.comm when it is loaded and initialized (never loads it: choosing a device must
-- not start MPI).
local function live_comm(opts)
  if opts and opts.env then return nil end
  local comm = package.loaded["lutra.dist.comm"]
  if type(comm) == "table" and comm.initialized and comm.initialized() then return comm end
  return nil
end

-- This rank's index among the ranks of its node, or nil without a launcher.
function M.local_rank(opts)
  local comm = live_comm(opts)
  if comm and comm.local_rank then return comm.local_rank() end
  local get = getter(opts)
  local r = first_int(get, LOCAL_RANK_VARS)
  if r == nil and get("PMIX_RANK") and get("SLURM_LOCALID") then r = first_int(get, {"SLURM_LOCALID"}) end
  return r
end

function M.world_rank(opts)
  local comm = live_comm(opts)
  if comm then return comm.rank() end
  return first_int(getter(opts), WORLD_RANK_VARS) or 0
end

function M.world_size(opts)
  local comm = live_comm(opts)
  if comm then return comm.size() end
  local get = getter(opts)
  local n = first_int(get, WORLD_SIZE_VARS)
  if n == nil and get("PMIX_RANK") then n = first_int(get, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}) end
  return n or 1
end

-- Number of usable CUDA devices (0 in a CPU build or without a GPU).
function M.device_count(opts)
  if opts and opts.device_count then return opts.device_count end
  local ok, lt = pcall(require, "lutra.ffi") -- fails under a plain luajit without liblutra
  if not ok then return 0 end
  return tonumber(lt.C.lt_cuda_device_count())
end

function M.default_device(opts)
  local get = getter(opts)
  local chosen = get("LUTRA_DEVICE")
  if chosen and chosen ~= "" and chosen ~= "cuda" then return chosen end
  local n = M.device_count(opts)
  if n <= 0 then
    if chosen == "cuda" then error("LUTRA_DEVICE=cuda: no CUDA device is available", 2) end
    return "cpu"
  end
  return "cuda:" .. ((M.local_rank(opts) or 0) % n)
end

return M
