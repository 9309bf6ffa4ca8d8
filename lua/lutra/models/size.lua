-- lutra.models.size — what a model config would take before anything is allocated: the
-- parameter count of each part, the bytes, and the memory of the device it would live on.
--
--   local size = require "lutra.models.size"
--   local parts, total = size.parameters(cfg)   -- cfg complete (models.config); counts as doubles
--   size.device_bytes("cpu")                    -- physical memory, or nil where unknown
--
-- Counts are doubles: a product of sizes near 2^31 each (d_model * vocab_size) stays an
-- ordinary number instead of wrapping, so an absurd config is measured and refused, never
-- allocated. The device's memory is its whole size, with no allowance for anything else: a
-- model whose parameters alone do not fit cannot run, and one that fits may still run out of
-- memory later (gradients, optimizer state and activations are not counted).
--   cpu      the machine's physical memory (sysconf: _SC_PHYS_PAGES * _SC_PAGESIZE on Linux
--            and macOS; unknown elsewhere, and then nothing is refused)
--   cuda:k   the total lt_cuda_status() reports for device k (whole GiB)
local ffi = require "ffi"
local lt = require "lutra.ffi"
local dtype = require "lutra.dtype"

local M = {}

-- Parameters per part of the Transformer (lutra/models/transformer.lua, nn/block.lua): {keys =
-- the config keys the part grows with, count =}, and their sum.
function M.parameters(cfg)
  local C, V, L, F = cfg.d_model, cfg.vocab_size, cfg.n_layer, cfg.ffn_hidden
  local D = cfg.head_dim or C / cfg.n_head
  local b = cfg.bias and 1 or 0
  local function bit(v) if v == nil then return b end return v and 1 or 0 end
  local bq, bo, bm = bit(cfg.qkv_bias), bit(cfg.out_bias), bit(cfg.mlp_bias)
  local norm = C + ((cfg.norm ~= "rmsnorm" and b == 1) and C or 0) -- RMSNorm has no bias
  local qkv = (cfg.n_head + 2 * cfg.n_kv_head) * D
  local attn = C * qkv + bq * qkv + C * cfg.n_head * D + bo * C + (cfg.qk_norm and 2 * D or 0)
  local mlp
  local mats = cfg.mlp == "swiglu" and 3 or 2 -- the matrices of one MLP
  if cfg.n_experts then -- nn.MoE: the experts, the router, the shared experts; no biases
    local shared = cfg.shared_expert_hidden or (cfg.n_shared_experts or 0) * F
    mlp = cfg.n_experts * mats * C * F + C * cfg.n_experts + mats * C * shared + (cfg.shared_expert_gate and C or 0)
  elseif cfg.mlp == "swiglu" then
    mlp = 3 * C * F + bm * (2 * F + C)
  else
    mlp = 2 * C * F + bm * (F + C)
  end
  local parts = {
    {keys = {"vocab_size", "d_model"}, what = "the token embeddings", count = V * C},
    {keys = {"n_layer", "d_model", "ffn_hidden"}, what = "the blocks", count = L * (2 * norm + attn + mlp)},
    {keys = {"d_model"}, what = "the final norm", count = norm},
  }
  if cfg.pos == "learned" then
    parts[#parts + 1] = {keys = {"block_size", "d_model"}, what = "the position embeddings", count = cfg.block_size * C}
  end
  if not cfg.tie_embeddings then
    parts[#parts + 1] = {keys = {"vocab_size", "d_model"}, what = "the output head", count = V * C}
  end
  local total = 0
  for _, p in ipairs(parts) do total = total + p.count end
  return parts, total
end

pcall(ffi.cdef, "long sysconf(int name);")
local SYSCONF = {Linux = {pages = 85, page_size = 30}, OSX = {pages = 200, page_size = 29}}

local cpu_bytes
local function physical_memory()
  if cpu_bytes == nil then
    cpu_bytes = false
    local sc = SYSCONF[ffi.os]
    local ok, pages, page = pcall(function() return ffi.C.sysconf(sc.pages), ffi.C.sysconf(sc.page_size) end)
    if ok and pages > 0 and page > 0 then cpu_bytes = tonumber(pages) * tonumber(page) end
  end
  return cpu_bytes or nil
end

-- Bytes of CUDA device id's memory as lt_cuda_status() tells it ("2 CUDA devices: cuda:0 NVIDIA
-- H200 (sm_90, 140 GiB), cuda:1 ..."), or nil.
function M.cuda_bytes(status, id)
  local gib = status:match("cuda:" .. id .. " [^,]-%(sm_%d+, (%d+) GiB%)")
  return gib and tonumber(gib) * 2 ^ 30 or nil
end

-- Bytes of memory the device (a name or id, lutra.dtype's) holds, or nil where unknown.
function M.device_bytes(device)
  local ok, id = pcall(dtype.device_id, device, dtype.CPU)
  if not ok then return nil end
  if id == dtype.CPU then return physical_memory() end
  return M.cuda_bytes(ffi.string(lt.C.lt_cuda_status()), id)
end

-- "1.5 GB" (decimal units, as a disk is sold and `free -h` rounds).
function M.human(bytes)
  local units = {"bytes", "kB", "MB", "GB", "TB", "PB", "EB"}
  local k = 1
  while bytes >= 1000 and k < #units do
    bytes, k = bytes / 1000, k + 1
  end
  return k == 1 and string.format("%d bytes", bytes) or string.format("%.1f %s", bytes, units[k])
end

return M
