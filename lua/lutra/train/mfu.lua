-- lutra.train.mfu — model FLOPs utilisation: the model's training FLOPs per token times the
-- tokens per second, over the devices' peak.
--
--   local mfu = require "lutra.train.mfu"
--   mfu.flops_per_token(model)          -- nil for a model it cannot count
--   mfu.peak_flops("cpu", "f32")        -- flops/s and where the figure comes from
--
-- FLOPs per token of a training step (forward and backward), as PaLM and nanoGPT count them:
-- 6 N + 12 n_layer block_size d_model, N the parameters a token passes through (without the
-- position table; of a mixture of experts' expert weights only top_k / n_experts), the second
-- term the attention scores. The peak: LUTRA_PEAK_TFLOPS when set; on a GPU the datasheet's dense
-- rate of the compute dtype for the H100/H200 and A100 (else unknown: no MFU); on the CPU the
-- GEMM rate measured once per process and dtype (the best of a few n = 512 matmuls on all threads).
local memory = require "lutra.memory"
local create = require "lutra.create"
local now = require("lutra.train.interrupt").now

local M = {}

local EXPERT_WEIGHT = {w_gate = true, w_up = true, w_down = true}

function M.flops_per_token(model)
  local cfg = type(model) == "table" and rawget(model, "cfg")
  if type(cfg) ~= "table" or not (cfg.n_layer and cfg.block_size and cfg.d_model) then return nil end
  local dense, experts = 0, 0
  for name, p in model:named_parameters() do
    if name ~= "wpe.weight" then
      if EXPERT_WEIGHT[name:match("%.mlp%.([%w_]+)$") or ""] then
        experts = experts + p:numel()
      else
        dense = dense + p:numel()
      end
    end
  end
  local n = dense + (cfg.n_experts and experts * cfg.top_k / cfg.n_experts or experts)
  return 6 * n + 12 * cfg.n_layer * cfg.block_size * cfg.d_model
end

-- dense TFLOP/s by the vendors' datasheets (SXM parts): low precision, tf32, plain f32
local GPU_PEAKS = {
  {pattern = "H[12]00", low = 989, f32 = 67},
  {pattern = "A100", low = 312, f32 = 19.5},
}

local measured = {}

-- The best rate of a few n x n matmuls in dtype on the CPU.
local function cpu_gemm_rate(dtype)
  local n = 512
  -- (constants, not random numbers: the run's generator is left where it is)
  local a, b = create.full({n, n}, 0.5, {dtype = dtype}), create.full({n, n}, -0.25, {dtype = dtype})
  local out = create.empty({n, n}, {dtype = dtype})
  local best = math.huge
  for _ = 1, 4 do
    local t0 = now()
    a:matmul(b, out)
    best = math.min(best, now() - t0)
  end
  return 2 * n ^ 3 / math.max(best, 1e-9)
end

-- peak_flops(device, dtype) -> flops/s and its source, or nil (a GPU not in the table)
function M.peak_flops(device, dtype)
  local forced = tonumber(os.getenv("LUTRA_PEAK_TFLOPS") or "")
  if forced and forced > 0 then return forced * 1e12, "LUTRA_PEAK_TFLOPS" end
  device = tostring(device or "cpu")
  if device:match("^cuda") then
    local status = require("lutra.cuda").status()
    for _, g in ipairs(GPU_PEAKS) do
      if status:match(g.pattern) then
        return (dtype == "f32" or dtype == "f64") and g.f32 * 1e12 or g.low * 1e12, "datasheet (" .. g.pattern .. ")"
      end
    end
    return nil
  end
  local dt = (dtype == "f64") and "f64" or "f32" -- bf16/f16 on the CPU compute in f32
  if not measured[dt] then measured[dt] = memory.tidy(cpu_gemm_rate, dt) end
  return measured[dt], "measured " .. dt .. " GEMM"
end

-- The run's MFU source for trainer run (nil when it cannot count: a model without a config, a
-- tensor- or pipeline-parallel layout (this rank holds a shard), a GPU not in the table):
-- {flops_per_token =, peak = flops/s of all the run's devices, source =}.
function M.of_run(run)
  local mesh = run.mesh
  if mesh and (mesh.tp_size > 1 or mesh.pp_size > 1) then return nil end
  local fpt = M.flops_per_token(run.model)
  if not fpt then return nil end
  local dtype = run.prec and run.prec.dtype or (run.params[1] and run.params[1].dtype) or "f32"
  local peak, source = M.peak_flops(run.device, dtype)
  if not peak then return nil end
  return {flops_per_token = fpt, peak = peak * (mesh and mesh.size or 1), source = source}
end

return M
