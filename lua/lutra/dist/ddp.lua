-- lutra.dist.ddp — data parallel: every rank holds the whole model, gradients are
-- averaged over the group in buckets while backward still runs (PyTorch DDP).
--
--   local d = ddp.new(model:named_parameters(), group, {bucket_mb = 25})
--   per step:  opt:zero_grad()
--              d:no_sync(function() fwd_bwd(micro_1) end)   -- accumulation: no communication
--              fwd_bwd(micro_k)                             -- buckets launch during this backward
--              d:finish()                                   -- wait, p.grad = the average
--              clip; opt:step()
--
-- At construction the parameters are broadcast from group rank 0 (replicas start equal).
-- Buckets hold the parameters in reverse registration order (backward produces the last
-- layers first), about bucket_mb each, one dtype and device a bucket. Each parameter has a
-- post-accumulate hook: once every gradient of a bucket is final, the bucket is copied
-- into one flat buffer and its all-reduce (avg) launched asynchronously, buckets strictly
-- in index order so that every rank issues the same collectives in the same order.
-- finish() launches what did not complete (parameters without a gradient on this rank
-- this step count as zeros, so ranks never diverge in collective order), waits, and
-- writes the averages back into p.grad (creating it where backward gave none).
-- opts.trace = true keeps d.trace, a list of "grad <name>" / "launch <k>" / "finish"
-- events in the order they happened (tests check the overlap with it).
local errors = require "lutra.errors"
local groups = require "lutra.optim.groups"
local comm = require "lutra.dist.comm"
local flat = require "lutra.dist.zero_flat"
local create = require "lutra.create"
local fields = require "lutra.tensor.fields"

local raise = errors.raise

local M = {}
local DDP = {}
DDP.__index = DDP

-- Buckets over params taken in reverse order: {params, names, offsets, numel, flat}.
local function make_buckets(names, params, bucket_bytes)
  local buckets, cur = {}, nil
  for i = #params, 1, -1 do
    local p = params[i]
    local bytes = p:numel() * p:element_size()
    if cur == nil or cur.bytes >= bucket_bytes or cur.dtype ~= p.dtype or cur.device ~= p.device then
      cur = {params = {}, names = {}, offsets = {}, numel = 0, bytes = 0, dtype = p.dtype, device = p.device}
      buckets[#buckets + 1] = cur
    end
    local j = #cur.params + 1
    cur.params[j], cur.names[j], cur.offsets[j] = p, names[i], cur.numel
    cur.numel = cur.numel + p:numel()
    cur.bytes = cur.bytes + bytes
  end
  for k, b in ipairs(buckets) do
    b.index = k
    b.flat = flat.buffer(math.max(b.numel, 1), b.params[1])
    b.ready = {}
    b.nready = 0
  end
  return buckets
end

function M.new(named_params, group, opts)
  opts = opts or {}
  if type(opts) ~= "table" then raise("ddp.new: options must be a table, got " .. type(opts)) end
  if type(group) ~= "table" or type(group.size) ~= "number" then
    raise("ddp.new: expected a group (comm.split, mesh.dp)")
  end
  local bucket_mb = opts.bucket_mb or 25
  if type(bucket_mb) ~= "number" or not (bucket_mb > 0) then
    raise("ddp.new: bucket_mb must be a number > 0, got " .. tostring(bucket_mb))
  end
  local names, params = groups.named_list(named_params, "ddp.new")
  local keep_names, keep = {}, {}
  for i, p in ipairs(params) do
    if p.requires_grad then keep_names[#keep_names + 1], keep[#keep + 1] = names[i], p end
  end
  if #keep == 0 then raise("ddp.new: no parameter requires grad") end
  local self = setmetatable({group = group, names = keep_names, params = keep, sync = true, next_launch = 1,
                             hooks = {}, trace = opts.trace and {} or nil}, DDP)
  self.buckets = make_buckets(keep_names, keep, bucket_mb * 1024 * 1024)
  if group.size > 1 then
    self:broadcast_params()
    for _, b in ipairs(self.buckets) do
      for j, p in ipairs(b.params) do
        self.hooks[#self.hooks + 1] = p:register_post_accumulate_grad_hook(function() self:grad_ready(b, j) end)
      end
    end
  end
  return self
end

-- Rank 0's parameter values on every rank, one broadcast a bucket.
function DDP:broadcast_params()
  flat.no_grad(function()
    for _, b in ipairs(self.buckets) do
      for j, p in ipairs(b.params) do flat.move(b.flat, b.offsets[j], p, 0, p:numel()) end
      self.group:broadcast(b.flat, 0)
      for j, p in ipairs(b.params) do flat.move(p, 0, b.flat, b.offsets[j], p:numel()) end
    end
  end)
end

-- The hook: parameter j of bucket b has its final gradient for this backward.
function DDP:grad_ready(b, j)
  if not self.sync then return end
  if self.trace then self.trace[#self.trace + 1] = "grad " .. b.names[j] end
  if b.ready[j] then return end
  b.ready[j] = true
  b.nready = b.nready + 1
  self:launch_ready()
  -- MPI moves a non-blocking all-reduce along only inside MPI calls: poke it as backward goes
  comm.progress()
end

-- Copies bucket b's gradients into its flat buffer (zeros where none) and launches
-- the all-reduce.
function DDP:launch(b)
  flat.no_grad(function()
    for j, p in ipairs(b.params) do
      local g = p.grad
      if g ~= nil and not fields.is_freed(g) and g:is_contiguous() then
        flat.move(b.flat, b.offsets[j], g, 0, p:numel())
      elseif g ~= nil and not fields.is_freed(g) then
        local c = g:contiguous()
        flat.move(b.flat, b.offsets[j], c, 0, p:numel())
        c:free()
      else
        flat.fill_range(b.flat, b.offsets[j], p:numel(), 0)
      end
    end
  end)
  b.handle = flat.async(self.group, "all_reduce", b.flat, "avg")
  if self.trace then self.trace[#self.trace + 1] = "launch " .. b.index end
end

-- Launches the complete buckets that are next in order.
function DDP:launch_ready(all)
  local bs = self.buckets
  while self.next_launch <= #bs do
    local b = bs[self.next_launch]
    if not all and b.nready < #b.params then return end
    self:launch(b)
    self.next_launch = self.next_launch + 1
  end
end

-- Runs fn(...) (forward and backward of a micro-batch) without communication: the
-- gradients accumulate locally; the next synced backward reduces them all.
function DDP:no_sync(fn, ...)
  return errors.with_field(self, "sync", false, fn, ...)
end

-- Waits for every bucket and writes the averaged gradients into p.grad.
function DDP:finish()
  if self.group.size == 1 then return end
  self:launch_ready(true)
  if self.trace then self.trace[#self.trace + 1] = "finish" end
  for _, b in ipairs(self.buckets) do
    b.handle:wait()
    b.handle = nil
    flat.no_grad(function()
      for j, p in ipairs(b.params) do
        local g = p.grad
        if g == nil or fields.is_freed(g) or not g:is_contiguous() then
          g = create.empty(p.shape, {dtype = p.dtype, device = p.device})
          p.grad = g
        end
        flat.move(g, 0, b.flat, b.offsets[j], p:numel())
      end
    end)
    b.ready, b.nready = {}, 0
  end
  self.next_launch = 1
end

-- Bytes this rank holds: params, grads (full, one per parameter) and the bucket buffers.
function DDP:memory()
  local params, buckets = 0, 0
  for _, p in ipairs(self.params) do params = params + flat.bytes(p) end
  for _, b in ipairs(self.buckets) do buckets = buckets + flat.bytes(b.flat) end
  return {params = params, grads = params, buckets = buckets}
end

-- Unregisters the hooks and frees the bucket buffers (d is done).
function DDP:remove()
  for _, h in ipairs(self.hooks) do h.remove() end
  self.hooks = {}
  for _, b in ipairs(self.buckets) do
    if b.handle then b.handle:wait() end
    b.handle = nil
    if not fields.is_freed(b.flat) then b.flat:free() end
  end
end

return M
