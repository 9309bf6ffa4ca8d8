-- lutra.dist.parallelize — one training step's worth of parallelism for the trainer.
--
--   local par = parallelize.new(model, mesh, {optimizer = function(named) return optim.AdamW(named, o) end})
--   per step:  par:zero_grad()
--              local loss_sum, acc = par:forward_backward(batches, loss_fn)   -- k local batches
--              local norm = par:finish(max_norm)                           -- sync, clip
--              local acc = par:reduce_extras(acc)   -- loss_fn's extra metrics (lutra.train.extras)
--              par.optimizer:step{lr = lr};  par:after_step()
--
-- The model is converted in place, in this order: tensor parallel (tp.parallelize) on
-- the full model, then pipeline stages (pp.parallelize keeps this rank's layers), then
-- data parallel over the dp group: ZeRO (zero.new, stage 1-3: the optimizer is built
-- over the shards) or bucketed all-reduce (ddp.new). Losses are the mean over the global
-- batch, the same number on every rank; the gradient norm is global (every shard once).
-- Context parallel (mesh.cp_size > 1; with dp, tp, sequence parallel, pp and ZeRO): each
-- batch (pipeline: each micro-batch) is cut into this rank's part of every row
-- (lutra.dist.cp.split, its context in batch.cp for the model), and gradients and losses are
-- averaged over dp_cp (cp's scaled losses make that the mean over the global batch); ZeRO
-- shards over dp_cp (Megatron's distributed optimizer does).
local errors = require "lutra.errors"
local create = require "lutra.create"
local grad = require "lutra.nn.grad"
local memory = require "lutra.memory"
local spec = require "lutra.dist.spec"
local clip = require "lutra.optim.clip"
local ops = require "lutra.ops"
local fields = require "lutra.tensor.fields"
local extras = require "lutra.train.extras"

local raise = errors.raise

local M = {}
local Par = {}
Par.__index = Par

local function named_trainable(model)
  local out = {}
  for name, p in model:named_parameters() do
    if p.requires_grad then out[#out + 1] = {name, p} end
  end
  return out
end

-- The rows [i*n/m, (i+1)*n/m) of every tensor of a batch {x =, y =, ...} whose first dim is the
-- batch's (positions, segments, a loss mask: what loss_fn reads too): m micro-batches; other
-- fields as they are.
local function split_rows(batch, m)
  local x = batch.x or batch[1]
  local B = x:size(0)
  if B % m ~= 0 then
    raise(string.format("parallel: the local batch of %d rows does not split into %d pipeline micro-batches "
      .. "(set parallel.micro_batches to a divisor)", B, m))
  end
  local rows, out = B / m, {}
  for i = 0, m - 1 do
    local micro, cut = {}, {}
    for k, v in pairs(batch) do
      if ops.is_tensor(v) and v.ndim >= 1 and v:size(0) == B then
        cut[v] = cut[v] or v:narrow(0, i * rows, rows):contiguous() -- x and [1] stay one tensor
        v = cut[v]
      end
      micro[k] = v
    end
    micro.x, micro.y = micro.x or micro[1], micro.y or micro[2]
    out[i + 1] = micro
  end
  return out
end

-- Pipeline micro-batches when the config leaves it to us: the largest count up to 2 * pp
-- that divides the local batch (a multiple of pp for the interleaved schedule).
local function default_micro_batches(mesh, o, local_batch)
  local pp = mesh.pp_size
  if not local_batch then return 2 * pp end
  for m = 2 * pp, 1, -1 do
    if local_batch % m == 0 and (o.schedule ~= "interleaved" or m % pp == 0) then return m end
  end
  raise(string.format("parallel: the local batch of %d rows has no pipeline micro-batch count for pp %d; "
    .. "set parallel.micro_batches", local_batch, pp))
end

function M.new(model, mesh, opts)
  opts = opts or {}
  local o = mesh.options
  if mesh.zero == 3 and mesh.pp_size > 1 then
    raise(string.format("parallel: ZeRO stage 3 inside pipeline stages is not supported (%s); use zero 1 or 2 "
      .. "with pp, or zero 3 with dp and tp", mesh:layout()))
  end
  local self = setmetatable({mesh = mesh, full_model = model, model = model}, Par)
  if (mesh.cp_size or 1) > 1 then self.cp = require "lutra.dist.cp" end
  if mesh.tp_size > 1 then
    self.tp = require "lutra.dist.tp"
    -- (lutra.models.build(cfg, mesh) may have done it already)
    if rawget(model, "_tp") == nil then self.tp.parallelize(model, mesh.tp, {sequence_parallel = o.sequence_parallel}) end
  end
  if mesh.pp_size > 1 then
    local m = o.micro_batches > 0 and o.micro_batches or default_micro_batches(mesh, o, opts.local_batch)
    self.micro_batches = m
    self.stage = require("lutra.dist.pp").parallelize(model, mesh,
      {schedule = o.schedule, micro_batches = m, balance = o.balance,
       virtual_stages = o.schedule == "interleaved" and o.virtual_stages or nil})
    self.model = self.stage.model
  end
  -- MoE layers: experts over the ep group, routing statistics over dp (lutra.dist.ep)
  if mesh.dp_size > 1 then
    self.ep = require "lutra.dist.ep"
    self.ep.parallelize(self.model, mesh)
  end
  self.defer_sync = self.stage ~= nil or (self.tp ~= nil and o.sequence_parallel == true)
  local factory = opts.optimizer
  -- expert parameters (ep > 1) are reduced over their own replicas, expert_dp (plain buckets,
  -- also under ZeRO 1-3, whose optimizer steps them whole beside its shards)
  local dense, experts = named_trainable(self.model), {}
  if self.ep and mesh.ep_size > 1 then
    dense = {}
    for _, np in ipairs(named_trainable(self.model)) do
      local list = self.ep.is_expert(np[2]) and experts or dense
      list[#list + 1] = np
    end
    if mesh.expert_dp_size > 1 then
      self.expert_ddp = require("lutra.dist.ddp").new(experts, mesh.expert_dp, {bucket_mb = o.bucket_mb})
    end
  end
  if mesh.zero > 0 then
    local build = factory
    if #experts > 0 and factory then
      -- the optimizer takes the experts as aliases without requires_grad, as ZeRO 1-2's shards
      -- (an optimizer given both keeps only the trainable ones); finish() hands them the grads.
      -- ZeRO 3's shards are leaves that require grad, as the experts themselves.
      local named_aliases = experts
      if mesh.zero < 3 then
        self.expert_alias, named_aliases = {}, {}
        for i, np in ipairs(experts) do
          local a = self.ep.alias(np[2])
          self.expert_alias[i] = {np[2], a}
          named_aliases[i] = {np[1], a}
        end
      end
      build = function(named)
        for _, np in ipairs(named_aliases) do named[#named + 1] = np end
        return factory(named)
      end
    end
    -- (ZeRO 3 takes the model, whose modules it wraps: the experts stay whole, out of its units)
    local keep = #experts > 0 and self.ep.is_expert or nil
    local target = (#experts > 0 and mesh.zero < 3) and dense or self.model
    self.zero = require("lutra.dist.zero").new(target, mesh.dp_cp,
                                               {stage = mesh.zero, bucket_mb = o.bucket_mb, optimizer = build, keep = keep})
    self.optimizer = self.zero.optimizer
  else
    if mesh.dp_cp.size > 1 then self.ddp = require("lutra.dist.ddp").new(dense, mesh.dp_cp, {bucket_mb = o.bucket_mb}) end
    self.optimizer = factory and factory(named_trainable(self.model)) or nil
  end
  return self
end

-- The parameters whose .grad this rank computes (the local model's).
function Par:parameters() return self.model:parameters() end

function Par:zero_grad()
  for _, p in ipairs(self.model:parameters()) do
    local g = p.grad
    if g ~= nil then
      p.grad = nil
      if not fields.is_freed(g) then g:free() end
    end
  end
  if self.optimizer then self.optimizer:zero_grad() end
  -- stage 3 keeps a no_sync backward's full-size grads on its hidden full tensors
  if self.zero and self.zero.zero_grad then self.zero:zero_grad() end
end

-- Forward and backward of k local batches (gradient accumulation: each loss scaled by
-- 1/k); communication only after the last. Returns the sum of the k batches' mean losses
-- over the global batch (the same on every rank) and this rank's accumulator of loss_fn's
-- extra metrics (lutra.train.extras: means over the k batches, sums; pipeline: on the last
-- stage, over its micro-batches): reduce_extras reduces them after finish(), when no gradient
-- reduction is in flight any more.
function Par:forward_backward(batches, loss_fn)
  local k = #batches
  local sum = 0
  local sync = self.ddp or self.zero
  if self.expert_ddp then -- both reductions wait
    local a, b = self.ddp or self.zero, self.expert_ddp
    sync = {no_sync = function(_, fn) return a:no_sync(b.no_sync, b, fn) end}
  end
  local acc = extras.new()
  local cp = self.cp
  for i, batch in ipairs(batches) do
    if cp and not self.stage then batch = cp.split(batch, self.mesh.cp) end
    local function run()
      if self.stage then
        local m = self.micro_batches
        local micro = split_rows(batch, m)
        if cp then -- each micro-batch split over cp (its own context)
          for j = 1, m do micro[j] = cp.split(micro[j], self.mesh.cp) end
        end
        local s, part = self.stage:train_step(micro, 1 / (m * k), loss_fn)
        extras.merge(acc, part, 1 / k)
        return s / m
      end
      if cp then return self:cp_forward_backward(batch, loss_fn, k, acc) end
      local loss, extra = loss_fn(self.model, batch)
      local value = loss:item()
      extras.add(acc, extra, 1 / k)
      if k > 1 then loss = loss * (1 / k) end
      loss:backward()
      return value
    end
    if self.ep then run = self.ep.engage(run) end -- MoE layers: token exchange, global routing statistics
    -- Pipelines run many backwards a batch, and tied embeddings or sequence-parallel norms
    -- sum their grads across stages / tp ranks first: then the dp reduction waits for finish().
    if sync and (i < k or self.defer_sync) then
      sum = sum + sync:no_sync(run)
    else
      sum = sum + run()
    end
  end
  return self:mean_over_dp(sum), acc
end

-- One batch's part under context parallel: loss_fn with the context on the model (cp_context:
-- the zoo's models read it), which must have run ring attention.
function Par:cp_forward_backward(batch, loss_fn, k, acc)
  local model = self.model
  rawset(model, "cp_context", batch.cp)
  local loss, extra = loss_fn(model, batch)
  rawset(model, "cp_context", nil)
  if not batch.cp.used then
    raise("parallel: context parallel needs a model whose attention runs over the cp group (lutra.dist.cp): "
      .. "this loss_fn's forward did not (pass opts.cp = batch.cp to a zoo model's forward)")
  end
  local value = loss:item()
  extras.add(acc, extra, 1 / k)
  if k > 1 then loss = loss * (1 / k) end
  loss:backward()
  return value
end

-- loss_fn's extra metrics (an accumulator of forward_backward) over the layout: reduced over
-- the data-parallel ranks (which must give the same names: else an error naming this rank's),
-- then, under pipeline parallel, the last stage's on every stage (rank 0, which logs, is on the
-- first). Tensor-parallel ranks see the same rows: each keeps its own (rank 0's is logged).
function Par:reduce_extras(acc)
  acc = extras.over(self.mesh.dp, acc, self.mesh.rank)
  if self.stage then acc = extras.share(self.mesh.pp, acc, self.mesh.pp_size - 1) end
  return acc
end

-- The mean of a number over the data-parallel ranks (and context-parallel: see the header).
function Par:mean_over_dp(v)
  local dp = self.mesh.dp_cp
  if dp.size == 1 then return v end
  local t = create.tensor({v}, {dtype = "f64"})
  dp:all_reduce(t, "avg")
  local r = t:item()
  t:free()
  return r
end

-- Gradient sync (data parallel, tensor-parallel replicas, tied embeddings), then the
-- global norm and clipping to max_norm (> 0). Returns the norm before clipping.
function Par:finish(max_norm)
  -- sums across tp ranks and pipeline ends first, on full grads; then the dp reduction
  if self.tp and self.tp.sync_grads then self.tp.sync_grads(self.model) end
  if self.stage then self.stage:sync_grads() end
  if self.ddp then self.ddp:finish() end
  if self.zero then self.zero:finish() end
  if self.expert_ddp then self.expert_ddp:finish() end
  if self.ep then self.ep.finish_grads(self.model:parameters(), self.mesh) end
  for _, pa in ipairs(self.expert_alias or {}) do pa[2].grad = pa[1].grad end
  local params = self.optimizer and self.optimizer.params or self.model:parameters()
  local grads, n = {}, 0
  local local_sq = 0
  for i, p in ipairs(params) do
    n = i
    if p.grad ~= nil then
      grads[i] = p.grad
      if spec.owned(p) then
        local norm = clip.total_norm({p.grad}, 2, 1)
        -- an expert shard is on dp / ep of the dp ranks: weighted to count once in the sum
        -- (divided by dp below, except under ZeRO, whose shards are on one rank each)
        local w = 1
        if self.ep and self.ep.is_expert(p) then w = self.mesh.ep_size / (self.zero and self.mesh.dp_size or 1) end
        local_sq = local_sq + w * norm * norm
      end
    end
  end
  local mesh = self.mesh
  local total_sq = local_sq
  if mesh.size > 1 then
    local t = create.tensor({local_sq}, {dtype = "f64"})
    mesh.world:all_reduce(t, "sum")
    total_sq = t:item()
    t:free()
    -- plain data parallel: every dp replica holds the same full gradients
    if not self.zero then total_sq = total_sq / (mesh.dp_size * (mesh.cp_size or 1)) end
  end
  local norm = math.sqrt(total_sq)
  if max_norm and max_norm > 0 and norm == norm then
    local coef = max_norm / (norm + 1e-6)
    if coef < 1 then
      grad.no_grad(function()
        for i = 1, n do
          if grads[i] ~= nil then ops.mul(grads[i], coef, grads[i]) end
        end
      end)
    end
  end
  return norm
end

function Par:after_step()
  if self.zero then self.zero:after_step() end
end

-- The mean loss of one (local) batch, no grad: the same number on every rank.
function Par:eval_loss(batch, loss_fn)
  if self.cp then batch = self.cp.split(batch, self.mesh.cp) end
  if self.cp then rawset(self.model, "cp_context", batch.cp) end
  local v
  if self.stage then
    v = self.stage:eval(batch, loss_fn)
  else
    local function run()
      local loss = loss_fn(self.model, batch)
      return type(loss) == "number" and loss or loss:item()
    end
    v = grad.no_grad(memory.tidy, self.ep and self.ep.engage(run) or run)
  end
  if self.cp then rawset(self.model, "cp_context", nil) end
  return self:mean_over_dp(v)
end

function Par:memory() return self.zero and self.zero:memory() or nil end

return M
