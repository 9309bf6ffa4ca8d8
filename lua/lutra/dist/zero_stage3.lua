-- lutra.dist.zero_stage3 — ZeRO stage 3 (FSDP): parameters live as shards; each unit's
-- full parameters exist only while it runs.
--
-- Units: every direct child of the model (each item of a ModuleList child: every Block),
-- holding the parameters found only under it; parameters used by two units (a tied
-- embedding and head) or held by the model itself form the root unit, gathered when the
-- model's forward starts and kept until their gradients are final. A unit is one bucket:
-- one all-gather of its padded shards (rank-major) before it runs, one reduce-scatter
-- of its gradients once they are final.
--
-- At rest the modules' parameter fields hold the shards (requires_grad, a spec each), so
-- that named_parameters() gives the pieces under their global names; while a unit is
-- gathered they hold its full parameters.
-- Each full parameter keeps its tensor and storage object (autograd's saved references
-- stay valid); only the storage's bytes are released and restored in place
-- (lt_storage_release_bytes / lt_storage_restore_bytes).
--   forward:  the unit's wrapped forward gathers it (waiting for a prefetch), launches
--             the next unit's all-gather (the order seen in the first forward), runs,
--             registers a hook on every output that requires grad, releases the bytes
--             (not those of the last unit: its backward comes next).
--   backward: the hook fires when the output's gradient arrives, before the unit's own
--             backward nodes run: gather again, prefetch the previous unit. Once all the
--             unit's gradients are final (post-accumulate hooks) its bytes are released
--             and its reduce-scatter launched (units in reverse forward order, then the
--             root: every rank issues the same collectives in the same order), the full
--             grads freed.
-- Every rank must run the same units in the same order (as FSDP).
-- opts.keep(p) true: p stays whole and out of ZeRO (no gathering, sharding or reduction here;
-- its owner reduces it, as parallelize does for expert parallel's experts over expert_dp).
local errors = require "lutra.errors"
local groups = require "lutra.optim.groups"
local memory = require "lutra.memory"
local ops = require "lutra.ops"
local lt = require "lutra.ffi"
local S = require "lutra.autograd.state"
local Module = require "lutra.nn.module"
local Z = require "lutra.dist.zero_buckets"
local flat = require "lutra.dist.zero_flat"
local fields = require "lutra.tensor.fields"
local is_tracked = fields.is_tracked

local raise, is_tensor = errors.raise, ops.is_tensor
local C = lt.C

local M = {}
local show -- (defined with the gathering below)
local Stage3 = setmetatable({}, {__index = Z.Zero})
Stage3.__index = Stage3

-- The modules that become units: direct children, ModuleList items one by one.
local function unit_modules(model)
  local list = {}
  for name, child in model:children() do
    if getmetatable(child) == Module.ModuleList then
      for cname, item in child:children() do list[#list + 1] = {name = name .. "." .. cname, mod = item} end
    else
      list[#list + 1] = {name = name, mod = child}
    end
  end
  return list
end

function M.new(model, group, opts)
  if not Module.is_module(model) then raise("zero.new: stage 3 needs a module (its children become units)") end
  local self = setmetatable({group = group, stage = 3, sync = true, hooks = {}, next_launch = 1, fwd_order = {},
                             trace = opts.trace and {} or nil, wrapped = {}}, Stage3)
  local n, rank = group.size, group.rank
  -- entries with global names (zero.lua's), then which unit owns each parameter
  local names, params = groups.named_list(model, "zero.new")
  local entries, by_param = {}, {}
  for i, p in ipairs(params) do
    if p.requires_grad and not (opts.keep and opts.keep(p)) then
      if p.ndim == 0 then raise("zero.new: parameter '" .. names[i] .. "' is 0-d; shard it as a 1-element vector") end
      if not p:is_contiguous() then raise("zero.new: parameter '" .. names[i] .. "' is not contiguous") end
      local e = {name = names[i], p = p, geo = flat.geometry(p.shape, n)}
      entries[#entries + 1] = e
      by_param[p] = e
    end
  end
  if #entries == 0 then raise("zero.new: no parameter requires grad") end
  self.entries = entries
  local users = {} -- p -> number of units using it
  local candidates = unit_modules(model)
  for _, c in ipairs(candidates) do
    c.params = {}
    for _, p in ipairs(c.mod:parameters()) do
      if by_param[p] then
        c.params[#c.params + 1] = p
        users[p] = (users[p] or 0) + 1
      end
    end
  end
  local units, owned = {}, {}
  for _, c in ipairs(candidates) do
    local list = {}
    for _, e in ipairs(entries) do -- the global order within a unit
      for _, p in ipairs(c.params) do
        if e.p == p and users[p] == 1 then list[#list + 1] = e end
      end
    end
    if #list > 0 then
      local u = Z.bucket(list)
      u.name, u.mod = c.name, c.mod
      units[#units + 1] = u
      for _, e in ipairs(list) do owned[e] = true end
    end
  end
  local root_list = {}
  for _, e in ipairs(entries) do
    if not owned[e] then root_list[#root_list + 1] = e end
  end
  self.units = units
  self.root = Z.bucket(root_list)
  self.root.name, self.root.is_root = "(root)", true
  self.all = {}
  for _, u in ipairs(units) do self.all[#self.all + 1] = u end
  if #root_list > 0 then self.all[#self.all + 1] = self.root end
  self.buckets = self.all
  for k, u in ipairs(self.all) do u.index = k end

  -- replicas start equal, then every parameter becomes its shard
  if n > 1 then
    local named = {}
    for _, e in ipairs(entries) do named[#named + 1] = {e.name, e.p} end
    require("lutra.dist.ddp").new(named, group, {bucket_mb = opts.bucket_mb}):remove()
  end
  -- every module field that holds a parameter (a tied one has two)
  for _, mod in ipairs(model:modules()) do
    for _, ent in ipairs(rawget(mod, "_entries")) do
      local e = ent.kind == "param" and by_param[rawget(mod, ent.key)]
      if e then
        e.holders = e.holders or {}
        e.holders[#e.holders + 1] = {mod, ent.key}
      end
    end
  end
  local named = {}
  flat.no_grad(function()
    for _, e in ipairs(entries) do
      e.shard = memory.keep(e.p:narrow(0, e.geo.start(rank), e.geo.count(rank)):clone())
      e.shard:requires_grad_(true)
      Z.set_spec(e.shard, e, rank)
      named[#named + 1] = {e.name, e.shard}
      if C.lt_storage_release_bytes(e.p) ~= 0 then errors.fail() end
      show(e, e.shard)
    end
  end)
  self.optimizer = opts.optimizer(flat.named_pairs(named))
  self.after_launch = Z.free_full_grads

  for _, e in ipairs(entries) do
    self.hooks[#self.hooks + 1] = e.p:register_post_accumulate_grad_hook(function() self:grad_ready(e) end)
  end
  for _, u in ipairs(units) do self:wrap(u.mod, u) end
  self:wrap(model, self.root)
  return self
end

-- Replaces mod.forward by one that gathers around it.
function Stage3:wrap(mod, u)
  local orig = mod.forward
  self.wrapped[#self.wrapped + 1] = mod
  rawset(mod, "forward", function(m, ...)
    self:pre_forward(u)
    local res = {orig(m, ...)}
    self:post_forward(u, res)
    return unpack(res, 1, table.maxn(res))
  end)
end

-- ---- gathering -------------------------------------------------------------------------------

-- The module fields of parameter e hold t: the full tensor while gathered, the shard at
-- rest (so named_parameters() of the model gives the shards, with their specs).
show = function(e, t)
  for _, h in ipairs(e.holders or {}) do rawset(h[1], h[2], t) end
end

local function show_unit(u, full)
  for _, e in ipairs(u.entries) do show(e, full and e.p or e.shard) end
end

function Stage3:gather(u)
  if u.resident then return end
  if #u.entries > 0 then
    Z.launch_gather(self, u)
    Z.land_gather(self, u)
  end
  show_unit(u, true)
  u.resident = true
end

function Stage3:prefetch(u)
  if u ~= nil and not u.resident and not u.gather and #u.entries > 0 then
    if self.trace then self.trace[#self.trace + 1] = "prefetch " .. u.name end
    Z.launch_gather(self, u)
  end
end

function Stage3:release(u)
  if u.gather then Z.land_gather(self, u) end -- a prefetch nobody used
  for _, e in ipairs(u.entries) do
    if C.lt_storage_release_bytes(e.p) ~= 0 then errors.fail() end
  end
  show_unit(u, false)
  u.resident = false
end

function Stage3:pre_forward(u)
  if u.is_root then
    self:gather(u)
    if self.order_done then self:prefetch(self.fwd_order[1]) end
    return
  end
  if not u.pos then
    self.fwd_order[#self.fwd_order + 1] = u
    u.pos = #self.fwd_order
  end
  if self.trace then self.trace[#self.trace + 1] = "forward " .. u.name end
  if not self.root.resident then self:gather(self.root) end
  self:gather(u)
  if self.order_done then self:prefetch(self.fwd_order[u.pos + 1]) end
end

function Stage3:post_forward(u, res)
  if u.is_root then
    if not self.order_done then
      self.order_done = true
      -- reduce-scatters: reverse forward order, then units never seen, then the root
      local order = {}
      for i = #self.fwd_order, 1, -1 do order[#order + 1] = self.fwd_order[i] end
      for _, v in ipairs(self.units) do
        if not v.pos then order[#order + 1] = v end
      end
      if #self.root.entries > 0 then order[#order + 1] = self.root end
      self.reduce_order = order
    end
    if not S.enabled then self:release(u) end
    return
  end
  if S.enabled then
    for i = 1, table.maxn(res) do
      local t = res[i]
      if is_tensor(t) and is_tracked(t) and not fields.is_freed(t) then
        t:register_hook(function() self:pre_backward(u) end)
      end
    end
    -- the last unit's backward comes first: it stays gathered (as FSDP's root)
    if self.order_done and u.pos == #self.fwd_order then return end
  end
  self:release(u)
end

-- The unit's output gradient arrived: its backward is about to run.
function Stage3:pre_backward(u)
  if self.trace then self.trace[#self.trace + 1] = "regather " .. u.name end
  if not self.root.resident then self:gather(self.root) end
  self:gather(u)
  if u.pos then self:prefetch(self.fwd_order[u.pos - 1]) end
end

-- Post-accumulate hook: once all of a unit's grads are final, its bytes go and (synced)
-- its reduce-scatter is queued.
function Stage3:grad_ready(e)
  if self.trace then self.trace[#self.trace + 1] = "grad " .. e.name end
  local u = e.bucket
  if u.ready[e.j] then return end
  u.ready[e.j] = true
  u.nready = u.nready + 1
  if u.nready < #u.entries then return end
  self:release(u)
  if self.sync then
    Z.launch_ready(self)
  else
    u.ready, u.nready = {}, 0
  end
end

function Stage3:after_finish()
  for _, u in ipairs(self.all) do
    if u.resident or u.gather then self:release(u) end
  end
end

-- Copies of the full parameters, {name = tensor} (collective: every rank calls it).
function Stage3:full_parameters()
  local out = {}
  for _, u in ipairs(self.all) do
    local was = u.resident
    self:gather(u)
    flat.no_grad(function()
      for _, e in ipairs(u.entries) do out[e.name] = e.p:clone() end
    end)
    if not was then self:release(u) end
  end
  return out
end

function Stage3:remove()
  for _, h in ipairs(self.hooks) do h.remove() end
  self.hooks = {}
  for _, mod in ipairs(self.wrapped) do rawset(mod, "forward", nil) end
  self.wrapped = {}
  for _, u in ipairs(self.all) do self:gather(u) end -- the model holds its full parameters again
end

return M
