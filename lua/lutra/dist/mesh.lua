-- lutra.dist.mesh — the device mesh: the world's ranks as a (pp, dp, cp, tp) grid.
--
--   local mesh = mesh.build({dp = "auto", tp = 2, pp = 1, zero = 0}, comm)
--
-- World rank = pp_rank * (dp * cp * tp) + dp_rank * (cp * tp) + cp_rank * tp + tp_rank: tensor
-- parallel ranks are neighbours (the most traffic, on one node's fastest links, as Megatron
-- orders them), then context parallel (lutra.dist.cp), data parallel, pipeline stages. Groups:
-- tp, cp, dp, pp (the ranks that differ in that coordinate alone), dp_cp (the ranks that
-- average gradients under context parallel; mesh.dp when cp = 1), dp_tp (one pipeline stage),
-- embed (the first and last stage of one pipeline: tied embeddings), and world. A dim of size
-- 1 still has a group (of one).
-- Expert parallel (ep, Megatron's "ep inside dp"): ep consecutive dp ranks at one tp/cp/pp
-- coordinate form an ep group (ep_rank = dp_rank % ep), sharing one MoE layer's experts; the dp
-- ranks with the same ep_rank form the expert_dp group, over which expert gradients are reduced.
local errors = require "lutra.errors"

local raise = errors.raise

local M = {}

-- The keys of config.parallel, with their defaults and what they mean.
M.DEFAULTS = {
  dp = "auto",          -- data-parallel ranks, or "auto": the world / (tp * pp * cp)
  tp = 1,               -- tensor-parallel ranks
  cp = 1,               -- context-parallel ranks: each row's sequence split over them (lutra.dist.cp)
  pp = 1,               -- pipeline stages
  ep = 1,               -- expert-parallel ranks, inside dp (must divide it): experts sharded over them
  zero = 0,             -- ZeRO stage over the dp group (dp_cp under cp): 0 (plain data parallel), 1, 2, 3
  bucket_mb = 25,       -- gradient buckets (data parallel, ZeRO 2)
  micro_batches = 0,    -- pipeline micro-batches per step; 0: the most rows allow, up to 2 * pp
  schedule = "1f1b",    -- pipeline schedule: "1f1b", "gpipe", "interleaved"
  virtual_stages = 2,   -- pipeline chunks per rank (schedule = "interleaved")
  balance = "params",   -- stages balanced by parameter count, or a list of layers per stage
  sequence_parallel = false, -- tensor parallel: norms and dropout on sequence shards
  timeout = 600,        -- seconds before the watchdog aborts a collective
  debug = false,        -- compare op/shape fingerprints across ranks before each collective
}

local function posint(v) return type(v) == "number" and v >= 1 and v == math.floor(v) end

-- cfg (config.parallel, a table, possibly a lutra.config node) -> plain checked table.
function M.options(cfg)
  cfg = cfg or {}
  if type(cfg) ~= "table" then raise("dist.init: expected a table {dp =, tp =, pp =, zero =}, got " .. type(cfg)) end
  local plain = type(cfg.plain) == "function" and cfg:plain() or cfg
  local out = {}
  for k, v in pairs(plain) do
    -- command-line overrides of "auto"-typed keys arrive as strings: --parallel.dp=2
    if type(v) == "string" and tonumber(v) and type(M.DEFAULTS[k]) ~= "string" or (k == "dp" and tonumber(v)) then
      v = tonumber(v)
    end
    if M.DEFAULTS[k] == nil then
      local names = {}
      for name in pairs(M.DEFAULTS) do names[#names + 1] = name end
      table.sort(names)
      raise(string.format("dist.init: unknown parallel key '%s' (known: %s)", tostring(k), table.concat(names, ", ")))
    end
    out[k] = v
  end
  for k, v in pairs(M.DEFAULTS) do
    if out[k] == nil then out[k] = v end
  end
  for _, k in ipairs {"tp", "pp", "cp", "ep"} do
    if not posint(out[k]) then raise(string.format("dist.init: parallel.%s must be a positive integer, got %s", k,
      tostring(out[k]))) end
  end
  if out.dp ~= "auto" and not posint(out.dp) then
    raise("dist.init: parallel.dp must be a positive integer or \"auto\", got " .. tostring(out.dp))
  end
  if out.zero ~= 0 and out.zero ~= 1 and out.zero ~= 2 and out.zero ~= 3 then
    raise("dist.init: parallel.zero must be 0, 1, 2 or 3, got " .. tostring(out.zero))
  end
  if out.schedule ~= "1f1b" and out.schedule ~= "gpipe" and out.schedule ~= "interleaved" then
    raise("dist.init: parallel.schedule must be \"1f1b\", \"gpipe\" or \"interleaved\", got " .. tostring(out.schedule))
  end
  if type(out.timeout) ~= "number" or out.timeout <= 0 then
    raise("dist.init: parallel.timeout must be a positive number of seconds, got " .. tostring(out.timeout))
  end
  return out
end

-- The mesh of this rank. comm: lutra.dist.comm, initialized.
function M.build(opts, comm)
  local size, rank = comm.size(), comm.rank()
  local tp, pp, cp = opts.tp, opts.pp, opts.cp or 1
  local fixed = tp * pp * cp -- (cp named only when used: the messages of the other layouts stay)
  local what = string.format("tp %d x pp %d%s", tp, pp, cp > 1 and string.format(" x cp %d", cp) or "")
  if size % fixed ~= 0 then
    raise(string.format("dist.init: %s = %d does not divide the world of %d ranks", what, fixed, size))
  end
  local dp = opts.dp
  if dp == "auto" then dp = size / fixed end
  if dp * fixed ~= size then
    raise(string.format("dist.init: dp %d x %s = %d ranks, but the world has %d (use dp = \"auto\")", dp, what,
      dp * fixed, size))
  end
  local ep = opts.ep or 1
  if dp % ep ~= 0 then
    raise(string.format("dist.init: parallel.ep %d does not divide dp %d (the ep group is carved from dp)", ep, dp))
  end
  local tp_rank = rank % tp
  local cp_rank = math.floor(rank / tp) % cp
  local dp_rank = math.floor(rank / (tp * cp)) % dp
  local pp_rank = math.floor(rank / (tp * cp * dp))
  local mesh = {rank = rank, size = size, dp_size = dp, tp_size = tp, pp_size = pp, cp_size = cp, dp_rank = dp_rank,
                tp_rank = tp_rank, pp_rank = pp_rank, cp_rank = cp_rank, zero = opts.zero, options = opts,
                world = comm.world}
  -- Every rank makes every split in the same order (MPI_Comm_split is collective). dc: the
  -- (dp, cp) coordinate, one number.
  local dc = dp_rank * cp + cp_rank
  mesh.tp = comm.split(pp_rank * dp * cp + dc, tp_rank, "tp")
  mesh.dp = comm.split((pp_rank * cp + cp_rank) * tp + tp_rank, dp_rank, "dp")
  mesh.pp = comm.split(dc * tp + tp_rank, pp_rank, "pp")
  mesh.dp_tp = comm.split(pp_rank, dc * tp + tp_rank, "dp_tp")
  mesh.cp = comm.split((pp_rank * dp + dp_rank) * tp + tp_rank, cp_rank, "cp")
  mesh.dp_cp = cp > 1 and comm.split(pp_rank * tp + tp_rank, dc, "dp_cp") or mesh.dp
  if pp > 1 then
    local ends = pp_rank == 0 or pp_rank == pp - 1
    mesh.embed = comm.split(ends and dc * tp + tp_rank or -1, pp_rank, "embed")
  end
  M.expert_groups(mesh, comm, ep)
  return setmetatable(mesh, M.Mesh)
end

-- mesh.ep and mesh.expert_dp (see the header), with ep_size, ep_rank, expert_dp_size.
function M.expert_groups(mesh, comm, ep)
  local dp, tp = mesh.dp_size, mesh.tp_size
  local slot = (mesh.pp_rank * mesh.cp_size + mesh.cp_rank) * tp + mesh.tp_rank -- the tp/cp/pp coordinate
  local ep_rank, block = mesh.dp_rank % ep, math.floor(mesh.dp_rank / ep)
  mesh.ep_size, mesh.ep_rank, mesh.expert_dp_size = ep, ep_rank, dp / ep
  mesh.ep = comm.split(slot * (dp / ep) + block, ep_rank, "ep")
  mesh.expert_dp = comm.split(slot * ep + ep_rank, block, "expert_dp")
end

M.Mesh = {}
M.Mesh.__index = M.Mesh

function M.Mesh:is_main() return self.rank == 0 end

-- "dp=2 tp=2 pp=1 zero=0" (and " cp=2" under context parallel, " ep=2" under expert parallel)
function M.Mesh:layout()
  local s = string.format("dp=%d tp=%d pp=%d zero=%d%s", self.dp_size, self.tp_size, self.pp_size, self.zero,
    self.cp_size > 1 and " cp=" .. self.cp_size or "")
  return (self.ep_size or 1) > 1 and s .. " ep=" .. self.ep_size or s
end

function M.Mesh:__tostring()
  return string.format("Mesh(%s; rank %d of %d: dp %d, tp %d, pp %d)", self:layout(), self.rank, self.size,
    self.dp_rank, self.tp_rank, self.pp_rank)
end

-- Whether any dim is parallel (a world of one has nothing to do).
function M.Mesh:parallel() return self.size > 1 end

return M
