-- lutra.dist.zero_buckets — the ZeRO object every stage builds on (lutra.dist.zero makes it,
-- lutra.dist.zero_stage3 extends it): parameters in buckets, one reduce-scatter of a bucket's
-- gradients and one all-gather of its shards, each shard's lutra.dist.spec box, and the step's
-- other parts (finish, zero_grad, no_sync, clip_grad_norm, after_step, memory, remove).
local errors = require "lutra.errors"
local create = require "lutra.create"
local spec = require "lutra.dist.spec"
local lt = require "lutra.ffi"
local flat = require "lutra.dist.zero_flat"
local fields = require "lutra.tensor.fields"

local raise = errors.raise
local C = lt.C

local M = {}
local Zero = {}
Zero.__index = Zero
M.Zero = Zero

-- Buckets: {entries, S (elements of one rank's chunk)}; entry.off its place in a chunk.
function M.bucket(entries)
  local b = {entries = entries, S = 0, ready = {}, nready = 0}
  for j, e in ipairs(entries) do
    e.bucket, e.j, e.off = b, j, b.S
    b.S = b.S + e.geo.per * e.geo.row
  end
  return b
end

-- The shard's box: rows [r0, r0 + rows) of e.p, composed with e.p's own spec when e.p is
-- itself a piece (a tensor-parallel shard): the global shape, offsets and dup are then
-- those of the global tensor, and several pieces (a fused qkv) are cut to the rows kept.
function M.set_spec(shard, e, rank)
  local r0 = e.geo.start(rank)
  local rows = shard.ndim > 0 and shard:size(0) or 0
  local base = spec.get(e.p)
  local offset = {r0}
  for d = 2, #e.p.shape do offset[d] = 0 end
  if base == nil then
    spec.set(shard, {global = e.p.shape, offset = offset})
    return
  end
  local pieces = {}
  for _, box in ipairs(spec.boxes(e.p)) do
    local lo, len = box.local_offset[1], box.shape[1]
    local a, b = math.max(lo, r0), math.min(lo + len, r0 + rows)
    if a < b then
      local go, lo2, shape = {}, {}, {}
      for d = 1, #box.shape do go[d], lo2[d], shape[d] = box.offset[d], box.local_offset[d], box.shape[d] end
      go[1], lo2[1], shape[1] = box.offset[1] + (a - lo), a - r0, b - a
      pieces[#pieces + 1] = {offset = go, local_offset = lo2, shape = shape}
    end
  end
  local first = pieces[1]
  local goff = {}
  for d = 1, #e.p.shape do goff[d] = first and first.offset[d] or base.offset[d] end
  spec.set(shard, {global = base.global, offset = first and goff or base.offset, dup = base.dup})
  if #pieces > 1 or (first and first.local_offset[1] ~= 0) then spec.get(shard).pieces = pieces end
end

-- ---- reduce-scatter of gradients ------------------------------------------------------------

-- Fills a bucket's rank-major input (n chunks of S) from the full grads (zeros where
-- none) and launches the reduce-scatter (avg) into a fresh chunk b.grad_chunk.
function M.launch_reduce(self, b)
  local n, S = self.group.size, b.S
  local like = b.entries[1].p
  flat.no_grad(function()
    local inp = create.zeros(n * S, {dtype = like.dtype, device = like.device})
    for _, e in ipairs(b.entries) do
      local g, geo = e.p.grad, e.geo
      if g ~= nil and not fields.is_freed(g) then
        local c = g:is_contiguous() and g or g:contiguous()
        for r = 0, n - 1 do flat.move(inp, r * S + e.off, c, geo.start(r) * geo.row, geo.count(r) * geo.row) end
        if c ~= g then c:free() end
      end
    end
    b.grad_in = inp
    b.grad_chunk = create.empty(math.max(S, 1), {dtype = like.dtype, device = like.device})
    if S == 0 then b.grad_chunk = flat.piece(b.grad_chunk, 0, 0) end
  end)
  b.handle = flat.async(self.group, "reduce_scatter", b.grad_chunk, b.grad_in, "avg")
  b.launched = true
  if self.trace then self.trace[#self.trace + 1] = "launch " .. tostring(b.index) end
end

-- After a bucket's reduce-scatter is launched (stages 2, 3): its full grads are copied
-- into the input buffer, and go.
function M.free_full_grads(self, b)
  for _, e in ipairs(b.entries) do
    local g = e.p.grad
    if g ~= nil then
      e.p.grad = nil
      if not fields.is_freed(g) then g:free() end
    end
  end
end

-- Launches the complete buckets next in self.reduce_order (all: every remaining one).
function M.launch_ready(self, all)
  local order = self.reduce_order or self.buckets
  while self.next_launch <= #order do
    local k = self.next_launch
    local b = order[k]
    if not all and b.nready < #b.entries then break end
    if self.before_launch then self:before_launch(b) end
    M.launch_reduce(self, b)
    if self.after_launch then self:after_launch(b) end
    self.next_launch = k + 1
    -- bound the input buffers in flight: in finish(), wait for the one two launches back
    if all and k > 2 then M.retire(self, order[k - 2]) end
  end
  -- inputs of reductions that completed meanwhile go back now
  for k = 1, self.next_launch - 1 do
    local b = order[k]
    if b.handle and b.handle:done() then M.retire(self, b) end
  end
end

-- Waits for bucket b's reduce-scatter and frees its input buffer (its output stays).
function M.retire(self, b)
  if b.handle == nil then return end
  b.handle:wait()
  b.handle = nil
  if b.grad_in ~= nil then
    b.grad_in:free()
    b.grad_in = nil
  end
end

-- The hook (stage 2, 3): e.p has its final gradient for this backward.
function Zero:grad_ready(e)
  if self.trace then self.trace[#self.trace + 1] = "grad " .. e.name end
  if not self.sync then return end
  local b = e.bucket
  if b.ready[e.j] then return end
  b.ready[e.j] = true
  b.nready = b.nready + 1
  M.launch_ready(self)
end

-- Waits for bucket b's reduce-scatter and hands each shard its averaged gradient.
function M.land(self, b, into_full)
  M.retire(self, b)
  local rank = self.group.rank
  flat.no_grad(function()
    for _, e in ipairs(b.entries) do
      local cnt = e.geo.count(rank)
      local piece = flat.piece(b.grad_chunk, e.off, cnt * e.geo.row)
      local avg = piece:view(e.shard.shape)
      piece:free()
      local sg = e.shard.grad
      local full = into_full and e.p.grad or nil
      if sg ~= nil and not fields.is_freed(sg) then
        sg:add_(avg)
        avg:free()
      elseif full ~= nil and not fields.is_freed(full) and full:is_contiguous() then
        -- stage 1: the averaged rows go back into p.grad; shard.grad is their view
        local rows = full:narrow(0, e.geo.start(rank), cnt)
        flat.copy(rows, avg)
        avg:free()
        e.shard.grad = rows
      else
        e.shard.grad = avg
      end
    end
  end)
  if into_full then
    b.grad_chunk:free()
    b.grad_chunk = nil
  end
  b.ready, b.nready, b.launched = {}, 0, false
end

-- Gradient sync after the last backward of a step (before clipping).
function Zero:finish()
  if self.ddp then return self.ddp:finish() end
  if self.group.size == 1 and self.stage < 3 then
    flat.no_grad(function()
      for _, e in ipairs(self.entries) do
        local g = e.p.grad
        if g ~= nil and e.shard.grad == nil then e.shard.grad = g end
      end
    end)
    return
  end
  M.launch_ready(self, true)
  if self.trace then self.trace[#self.trace + 1] = "finish" end
  for _, b in ipairs(self.reduce_order or self.buckets) do
    M.land(self, b, self.stage == 1)
    if self.stage >= 2 then b.held = b.grad_chunk end
  end
  self.next_launch = 1
  if self.after_finish then self:after_finish() end
end

-- ---- the step's other parts ---------------------------------------------------------------

-- Drops and frees every gradient this strategy knows: the full parameters' and the
-- shards' (call at the start of a step, instead of or after optimizer:zero_grad()).
function Zero:zero_grad()
  local function drop(t)
    local g = t and t.grad
    if g ~= nil then
      t.grad = nil
      if not fields.is_freed(g) then g:free() end
    end
  end
  for _, e in ipairs(self.entries) do
    drop(e.p)
    drop(e.shard)
  end
  for _, b in ipairs(self.buckets or {}) do
    if b.held ~= nil and not fields.is_freed(b.held) then b.held:free() end
    b.held = nil
  end
end

-- Runs fn(...) without communication: gradients accumulate in full; the next synced
-- backward reduces them.
function Zero:no_sync(fn, ...)
  if self.ddp then return self.ddp:no_sync(fn, ...) end
  return errors.with_field(self, "sync", false, fn, ...)
end

-- The gradients the optimizer steps with: each rank's own (shards, or all of them at stage 0).
function Zero:grads()
  local list = {}
  for _, e in ipairs(self.entries) do
    local g
    if self.ddp then g = e.p.grad else g = e.shard.grad end
    if g ~= nil and not fields.is_freed(g) then list[#list + 1] = g end
  end
  return list
end

-- The global gradient norm (sum of the shards' squares over the group), then every
-- shard gradient scaled by max_norm / (norm + 1e-6) when that is below 1 (torch's rule).
-- Returns the norm before clipping.
function Zero:clip_grad_norm(max_norm)
  if type(max_norm) ~= "number" or not (max_norm >= 0) then
    raise("zero:clip_grad_norm: max_norm must be a number >= 0, got " .. tostring(max_norm))
  end
  local grads = self:grads()
  local sq = 0
  flat.no_grad(function()
    for _, g in ipairs(grads) do
      if g:numel() > 0 then
        local x = g.dtype == "f64" and g or g:to("f32")
        local v = x:norm():item()
        sq = sq + v * v
      end
    end
  end)
  if not self.ddp and self.group.size > 1 then
    local t = create.tensor({sq}, {dtype = "f64"})
    self.group:all_reduce(t, "sum")
    sq = t:item()
    t:free()
  end
  local norm = math.sqrt(sq)
  local coef = max_norm / (norm + 1e-6)
  if norm == norm and coef < 1 then
    flat.no_grad(function()
      for _, g in ipairs(grads) do g:mul_(coef) end
    end)
  end
  return norm
end

-- Stages 1-2: all-gathers the updated shards into the full parameters, in buckets.
function Zero:after_step()
  if self.ddp or self.stage == 3 or self.group.size == 1 then return end
  for _, b in ipairs(self.buckets) do M.launch_gather(self, b) end
  for _, b in ipairs(self.buckets) do M.land_gather(self, b) end
end

-- Launches the all-gather of bucket b's shards into a fresh rank-major buffer.
function M.launch_gather(self, b)
  if b.gather then return end
  local n, S, rank = self.group.size, b.S, self.group.rank
  local like = b.entries[1].p
  flat.no_grad(function()
    local inp = create.zeros(math.max(S, 1), {dtype = like.dtype, device = like.device})
    if S == 0 then inp = flat.piece(inp, 0, 0) end
    for _, e in ipairs(b.entries) do
      local cnt = e.geo.count(rank) * e.geo.row
      flat.move(inp, e.off, e.shard, 0, cnt)
    end
    local out = create.empty(math.max(n * S, 1), {dtype = like.dtype, device = like.device})
    if S == 0 then out = flat.piece(out, 0, 0) end
    b.gather = {inp = inp, out = out, handle = flat.async(self.group, "all_gather", out, inp)}
  end)
  if self.trace then self.trace[#self.trace + 1] = "gather " .. tostring(b.name or b.index) end
end

-- Waits for bucket b's all-gather and writes every rank's rows into the full parameters
-- (restoring their bytes first where they were released).
function M.land_gather(self, b)
  local gth = b.gather
  if gth == nil then return end
  gth.handle:wait()
  b.gather = nil
  local n, S = self.group.size, b.S
  flat.no_grad(function()
    for _, e in ipairs(b.entries) do
      local p, geo = e.p, e.geo
      if C.lt_storage_is_resident(p) == 0 and C.lt_storage_restore_bytes(p, 0) ~= 0 then errors.fail() end
      for r = 0, n - 1 do flat.move(p, geo.start(r) * geo.row, gth.out, r * S + e.off, geo.count(r) * geo.row) end
    end
    gth.inp:free()
    gth.out:free()
  end)
end

-- ---- accounting ---------------------------------------------------------------------------

local function state_bytes(opt)
  local total, seen = 0, {}
  for _, st in pairs(opt.state or {}) do
    for _, v in pairs(st) do
      if type(v) == "cdata" and not seen[v] then
        seen[v] = true
        total = total + flat.bytes(v)
      end
    end
  end
  return total
end
M.state_bytes = state_bytes

-- Bytes on this rank: params (resident values: full parameters, or shards at stage 3),
-- grads (full .grad of the parameters plus the averaged shard chunks held), optimizer
-- (its state tensors). Measure after finish() of a step that follows a first step.
function Zero:memory()
  local params, grads = 0, 0
  for _, e in ipairs(self.entries) do
    if C.lt_storage_is_resident(e.p) ~= 0 then params = params + flat.bytes(e.p) end
    if self.stage == 3 then params = params + flat.bytes(e.shard) end
    grads = grads + flat.bytes(e.p.grad)
  end
  for _, b in ipairs(self.buckets or {}) do
    if b.held and not fields.is_freed(b.held) then grads = grads + flat.bytes(b.held) end
  end
  return {params = params, grads = grads, optimizer = state_bytes(self.optimizer)}
end

-- Unregisters hooks (stage 2), or undoes the wrapping (stage 3).
function Zero:remove()
  if self.ddp then self.ddp:remove() end
  for _, h in ipairs(self.hooks) do h.remove() end
  self.hooks = {}
end

return M
