-- lutra.dist.zero — ZeRO data parallel: optimizer state (stage 1), gradients (stage 2)
-- and parameters (stage 3) sharded over the data-parallel group.
--
--   local z = zero.new(model, group, {stage = 2, bucket_mb = 25,
--                                     optimizer = function(named_shards) return optim.AdamW(named_shards, o) end})
--   per step:  z:zero_grad()                    -- every grad it knows: full and shards
--              z:no_sync(function() fwd_bwd(micro_1) end)  -- accumulation, no communication
--              fwd_bwd(micro_k)
--              z:finish()                     -- shard grads = the average over the group
--              local norm = z:clip_grad_norm(1.0)
--              z.optimizer:step()
--              z:after_step()                 -- stages 1-2: all-gather the updated parameters
--
-- Sharding is per parameter on dim 0 (FSDP2): see zero_flat.lua for the geometry and the
-- rank-major flat buffers that one reduce-scatter / all-gather serves per bucket, and
-- zero_buckets.lua for the object this returns (its buckets and their collectives). The
-- optimizer is built by opts.optimizer over {name, shard} pairs with the global names;
-- shards keep their parameter's ndim (weight-decay grouping still works) and carry a
-- lutra.dist.spec box. Stage 0 is plain data parallel (lutra.dist.ddp) behind the same
-- interface (for comparisons: z:memory()).
--   stage 1: shards are views of the full parameters' rows; backward makes full grads;
--            finish() reduce-scatters them (avg) in buckets and writes this rank's
--            averaged rows back into p.grad (shard.grad is that view).
--   stage 2: the same shards; a bucket's reduce-scatter is launched from post-accumulate
--            hooks as soon as its grads are final, and the full grads are freed then.
--   stage 3: zero_stage3.lua: parameters live as shards, gathered around each module;
--            at rest the model's fields hold the shards (named_parameters gives them);
--            opts.keep(p) true leaves p whole and out of ZeRO (expert parallel's experts).
-- z:memory() -> {params =, grads =, optimizer =} bytes on this rank; z:remove() undoes
-- the hooks (stage 3: the model holds its full, current parameters again).
local errors = require "lutra.errors"
local groups = require "lutra.optim.groups"
local memory = require "lutra.memory"
local flat = require "lutra.dist.zero_flat"
local buckets = require "lutra.dist.zero_buckets"
local stage3 = require "lutra.dist.zero_stage3"

local raise = errors.raise
local Zero = buckets.Zero

local M = {}

local function check_opts(group, opts)
  if type(group) ~= "table" or type(group.size) ~= "number" then
    raise("zero.new: expected a group (comm.split, mesh.dp)")
  end
  opts = opts or {}
  if type(opts) ~= "table" then raise("zero.new: options must be a table, got " .. type(opts)) end
  local stage = opts.stage or 1
  if stage ~= 0 and stage ~= 1 and stage ~= 2 and stage ~= 3 then
    raise("zero.new: stage must be 0, 1, 2 or 3, got " .. tostring(stage))
  end
  local bucket_mb = opts.bucket_mb or 25
  if type(bucket_mb) ~= "number" or not (bucket_mb > 0) then
    raise("zero.new: bucket_mb must be a number > 0, got " .. tostring(bucket_mb))
  end
  if type(opts.optimizer) ~= "function" then
    raise("zero.new: optimizer must be a function(named_shards) -> optimizer")
  end
  return opts, stage, bucket_mb * 1024 * 1024
end

-- Entries {name, p, geo, start, count} for the trainable parameters of model.
local function entries_of(model, n)
  local names, params = groups.named_list(model, "zero.new")
  local list = {}
  for i, p in ipairs(params) do
    if p.requires_grad then
      if p.ndim == 0 then raise("zero.new: parameter '" .. names[i] .. "' is 0-d; shard it as a 1-element vector") end
      if not p:is_contiguous() then raise("zero.new: parameter '" .. names[i] .. "' is not contiguous") end
      local geo = flat.geometry(p.shape, n)
      list[#list + 1] = {name = names[i], p = p, geo = geo}
    end
  end
  if #list == 0 then raise("zero.new: no parameter requires grad") end
  return list
end

local function make_buckets(entries, bucket_bytes)
  local out, cur, bytes = {}, nil, 0
  for i = #entries, 1, -1 do
    local e = entries[i]
    if cur == nil or bytes >= bucket_bytes or cur[1].p.dtype ~= e.p.dtype then
      cur, bytes = {}, 0
      out[#out + 1] = cur
    end
    cur[#cur + 1] = e
    bytes = bytes + e.p:numel() * e.p:element_size()
  end
  for k, list in ipairs(out) do
    out[k] = buckets.bucket(list)
    out[k].index = k
  end
  return out
end

function M.new(model, group, opts)
  local stage, bucket_bytes
  opts, stage, bucket_bytes = check_opts(group, opts)
  if stage == 3 then return stage3.new(model, group, opts, bucket_bytes) end
  local self = setmetatable({group = group, stage = stage, sync = true, hooks = {}, next_launch = 1,
                             trace = opts.trace and {} or nil}, Zero)
  local n, rank = group.size, group.rank
  self.entries = entries_of(model, n)
  if stage == 0 then
    local named = {}
    for _, e in ipairs(self.entries) do named[#named + 1] = {e.name, e.p} end
    self.ddp = require("lutra.dist.ddp").new(named, group, {bucket_mb = opts.bucket_mb, trace = opts.trace})
    self.trace = self.ddp.trace
    self.optimizer = opts.optimizer(flat.named_pairs(named))
    return self
  end
  self.buckets = make_buckets(self.entries, bucket_bytes)
  -- replicas start equal (rank 0's values), as DDP
  if n > 1 then
    local named = {}
    for _, e in ipairs(self.entries) do named[#named + 1] = {e.name, e.p} end
    require("lutra.dist.ddp").new(named, group, {bucket_mb = opts.bucket_mb}):remove()
  end
  local named = {}
  flat.no_grad(function()
    for _, e in ipairs(self.entries) do
      e.shard = memory.keep(e.p:narrow(0, e.geo.start(rank), e.geo.count(rank)))
      buckets.set_spec(e.shard, e, rank)
      named[#named + 1] = {e.name, e.shard}
    end
  end)
  self.optimizer = opts.optimizer(flat.named_pairs(named))
  if stage == 2 and n > 1 then
    self.after_launch = buckets.free_full_grads
    for _, e in ipairs(self.entries) do
      self.hooks[#self.hooks + 1] = e.p:register_post_accumulate_grad_hook(function() self:grad_ready(e) end)
    end
  end
  return self
end

return M
