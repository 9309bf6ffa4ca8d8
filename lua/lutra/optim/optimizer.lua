-- lutra.optim.optimizer — what every optimizer shares: parameter groups, plain-table
-- state, the step driver (grads, lr schedule, no grad mode), zero_grad, state_dict.
--
-- An optimizer kind (adamw.lua, sgd.lua, lion.lua, adafactor.lua, lamb.lua) is a table:
--   name        "adamw"
--   defaults    {lr =, ...}: every group setting and its default (nil: required)
--   check(group, who)                      validates one group's settings
--   fields      {step = "number", exp_avg = "tensor", ...}: its per-parameter state
--   init(p, group)                         -> a fresh state table for p
--   update(p, g, st, group, lr)            one step of p with gradient g, in place
--   state_shape(shape, field)              optional: the shape of a state tensor for a
--                                          parameter of `shape` (default: the same; checkpoints)
--   update_group(items, group, lr)         optional: one step of a whole group, items =
--                                          {{p =, grad =, st =}, ...} (st.master: master
--                                          weights, which it steps and rounds into p)
--
-- Fields of an optimizer `opt`:
--   opt.param_groups   list of {params = {tensors}, names = {..} or nil, lr =, ...}
--   opt.keys           list of every parameter's state key, in group order: its dotted
--                      name when the optimizer was built from named parameters, else
--                      its position 1..N
--   opt.state[key]     the parameter's state (absent until its first update)
--   opt.steps          optimizer steps done; the schedule's step for the next one
--   opt.schedule       nil, or a function step -> lr (lutra.optim.schedule)
--
-- Master weights (opts.master_weights = true, for mixed precision with bf16/f16 parameters):
-- each bf16/f16 parameter gets an f32 copy in its state (state.master, made from the
-- parameter at its first step); the kind steps the copy with the gradient in f32 and the
-- parameter receives the copy rounded to its dtype. Small updates then accumulate in f32
-- instead of vanishing below bf16's resolution. f32/f64 parameters are stepped as always.
--
-- Learning rate at a step: the schedule's lr (or opt:step{lr =}) is the lr of a group
-- whose lr is the optimizer's `lr`; other groups are scaled by group.lr / opt.defaults.lr
-- (the ratio is exactly 1 for the common case, so their lr is exactly the schedule's).
-- Without either, each group uses its own lr. The lr used is kept in group.last_lr.
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local ops = require "lutra.ops"
local create = require "lutra.create"
local groups_mod = require "lutra.optim.groups"

local raise, is_tensor = errors.raise, ops.is_tensor
local ok_state, S = pcall(require, "lutra.autograd.state")
if not ok_state then S = nil end

local Optimizer = {}
Optimizer.__index = Optimizer

-- Settings an optimizer constructor takes besides the group defaults.
local CTOR_OPTS = {schedule = true, no_decay = true, master_weights = true}

-- Runs fn(...) with autograd's grad mode off (as torch.no_grad), restoring it after.
local without_grad = require("lutra.autograd.op").untracked
Optimizer.without_grad = without_grad

-- Notes an in-place write that bypassed the Lua ops (a direct C call), for autograd's
-- saved-tensor version checks.
function Optimizer.bump(t)
  if S and S.bump then S.bump(t) end
end

-- A tensor that outlives any enclosing lutra.tidy scope.
function Optimizer.keep(t) return memory.keep(t) end

local function copy_value(v)
  if type(v) ~= "table" then return v end
  local c = {}
  for k, x in pairs(v) do c[k] = copy_value(x) end
  return c
end

-- The group defaults: the kind's, overridden by the options that are group settings.
local function group_defaults(kind, opts, who)
  local defaults = {}
  for k, v in pairs(kind.defaults) do defaults[k] = copy_value(v) end
  for k, v in pairs(opts) do
    if kind.defaults[k] == nil and not kind.optional[k] and not CTOR_OPTS[k] then
      raise(string.format("%s: unknown option '%s' (%s)", who, tostring(k), kind.known))
    end
    if not CTOR_OPTS[k] then defaults[k] = copy_value(v) end
  end
  return defaults
end

-- A schedule is callable; one with a peak lr gives the default lr (or must agree with opts.lr).
local function check_schedule(schedule, opts, defaults, who)
  local mt = getmetatable(schedule)
  if type(schedule) ~= "function" and not (mt and mt.__call) then
    raise(who .. ": schedule must be a function step -> lr, got " .. type(schedule))
  end
  if type(schedule) == "table" and type(schedule.lr) == "number" then
    if opts.lr == nil then
      defaults.lr = schedule.lr
    elseif opts.lr ~= schedule.lr then
      raise(string.format("%s: lr %g differs from the schedule's peak lr %g (give one of them)", who, opts.lr,
        schedule.lr))
    end
  end
end

-- Fills self.param_groups from the normalized groups, each completed by the defaults and
-- checked by the kind; either every group names its parameters or none does.
local function add_groups(self, kind, groups, defaults, who)
  local named, unnamed = 0, 0
  for gi, src in ipairs(groups) do
    local g = {}
    for k, v in pairs(src) do g[k] = v end
    for k, v in pairs(defaults) do
      if g[k] == nil then g[k] = copy_value(v) end
    end
    for k in pairs(g) do
      if k ~= "params" and k ~= "names" and k ~= "name" and k ~= "last_lr" and kind.defaults[k] == nil
          and not kind.optional[k] then
        raise(string.format("%s: group %d: unknown setting '%s' (%s)", who, gi, tostring(k), kind.known))
      end
    end
    kind.check(g, string.format("%s: group %d", who, gi))
    if g.names then named = named + #g.params else unnamed = unnamed + #g.params end
    self.param_groups[gi] = g
  end
  if named > 0 and unnamed > 0 then raise(who .. ": either every group has parameter names or none has") end
end

-- Lists every parameter and its state key (its name, else its position), in group order;
-- a parameter or a name appears once.
local function add_keys(self, who)
  local seen, seen_names = {}, {}
  for _, g in ipairs(self.param_groups) do
    for j, p in ipairs(g.params) do
      local key = g.names and g.names[j] or #self.keys + 1
      local where = seen[p]
      if where then raise(string.format("%s: a parameter appears twice (%s and %s)", who, where, tostring(key))) end
      if seen_names[key] then raise(string.format("%s: two parameters are named '%s'", who, tostring(key))) end
      seen[p], seen_names[key] = tostring(key), true
      self.keys[#self.keys + 1] = key
      self.params[#self.params + 1] = p
    end
  end
end

-- Builds an optimizer of `kind` over `params` (see groups.normalize) with opts: the
-- group defaults (lr, weight_decay, ...), `schedule`, and `no_decay` (for a module).
function Optimizer.new(kind, params, opts)
  local who = kind.title
  opts = opts or {}
  if type(opts) ~= "table" then raise(who .. ": options must be a table, got " .. type(opts)) end
  local defaults = group_defaults(kind, opts, who)
  local schedule = opts.schedule
  if schedule ~= nil then check_schedule(schedule, opts, defaults, who) end
  if opts.master_weights ~= nil and type(opts.master_weights) ~= "boolean" then
    raise(who .. ": master_weights must be a boolean, got " .. type(opts.master_weights))
  end
  local self = setmetatable({kind = kind.name, defaults = defaults, schedule = schedule, state = {}, steps = 0,
                             param_groups = {}, keys = {}, params = {}, impl = kind,
                             master_weights = opts.master_weights or nil}, Optimizer)
  local auto = {no_decay = opts.no_decay}
  add_groups(self, kind, groups_mod.normalize(who, params, auto), defaults, who)
  add_keys(self, who)
  if #self.params == 0 then raise(who .. ": no parameters given") end
  return self
end

-- The lr group `g` uses at step `step` (default: the next step), given an override.
function Optimizer:group_lr(g, step, lr)
  local base = lr
  if base == nil and self.schedule then base = self.schedule(step or self.steps) end
  if base == nil then return g.lr end
  if g.lr == self.defaults.lr then return base end
  if self.defaults.lr == 0 then
    raise(self.impl.title .. ": a group lr cannot be scaled by the schedule when the optimizer's lr is 0")
  end
  return base * (g.lr / self.defaults.lr)
end

-- The lr of group 1 (or group gi) at `step` (default: the next step).
function Optimizer:get_lr(step, gi) return self:group_lr(self.param_groups[gi or 1], step) end

local function grad_of(p)
  if S == nil or not require("lutra.tensor").properties.grad then
    raise("optim: tensors have no .grad (autograd is not loaded): pass the gradients, opt:step{grads = ...}")
  end
  return p.grad
end

-- One optimizer step. opts (all optional):
--   grads   the gradients by state key (a list for unnamed params, a name -> tensor map
--           for named ones) instead of each parameter's .grad
--   lr      the lr for this step (instead of the schedule's)
-- Parameters without a gradient are skipped (their state does not advance).
function Optimizer:step(opts)
  opts = opts or {}
  if type(opts) ~= "table" then raise(self.impl.title .. ":step: expected a table {grads =, lr =}, got " .. type(opts)) end
  local grads, lr = opts.grads, opts.lr
  if lr ~= nil and (type(lr) ~= "number" or not (lr >= 0)) then
    raise(self.impl.title .. ":step: lr must be a number >= 0, got " .. tostring(lr))
  end
  if grads ~= nil and type(grads) ~= "table" then
    raise(self.impl.title .. ":step: grads must be a table keyed like opt.keys, got " .. type(grads))
  end
  local impl, state, keys = self.impl, self.state, self.keys
  without_grad(memory.tidy, function()
    local k = 0
    for _, g in ipairs(self.param_groups) do
      local glr = self:group_lr(g, self.steps, lr)
      g.last_lr = glr
      local batch = impl.update_group and {} or nil -- kinds that step a group in one call
      for _, p in ipairs(g.params) do
        k = k + 1
        local key = keys[k]
        local grad
        if grads then grad = grads[key] else grad = grad_of(p) end
        if grad ~= nil then
          if not is_tensor(grad) then
            raise(string.format("%s:step: the gradient of %s is %s, not a tensor", impl.title, tostring(key), type(grad)))
          end
          local st = state[key]
          if st == nil then
            st = impl.init(p, g)
            if self.master_weights and (p.dtype == "bf16" or p.dtype == "f16") then
              st.master = Optimizer.keep(p:to("f32"))
            end
            state[key] = st
          end
          if batch then
            batch[#batch + 1] = {p = p, grad = grad, st = st}
          elseif st.master ~= nil then -- master weights: step the f32 copy, round it into p
            if grad.dtype ~= "f32" then grad = grad:to("f32") end
            impl.update(st.master, grad, st, g, glr)
            p:copy_(st.master)
            Optimizer.bump(p)
          else
            impl.update(p, grad, st, g, glr)
          end
        end
      end
      if batch and #batch > 0 then impl.update_group(batch, g, glr) end
    end
  end)
  self.steps = self.steps + 1
end

-- Drops every parameter's gradient (set_to_none, the default, as torch 2) or zeroes it.
function Optimizer:zero_grad(set_to_none)
  for _, p in ipairs(self.params) do
    local g = grad_of(p)
    if g ~= nil then
      if set_to_none == false then
        without_grad(g.zero_, g)
      else
        p.grad = nil
      end
    end
  end
end

-- ---- checkpoints --------------------------------------------------------------------

local function group_settings(g)
  local s = {}
  for k, v in pairs(g) do
    if k ~= "params" and k ~= "names" and k ~= "last_lr" then s[k] = copy_value(v) end
  end
  return s
end

-- {optimizer = kind, steps =, param_groups = {{settings..., keys = {...}}},
--  state = {[key] = {step = n, exp_avg = tensor, ...}}}: plain tables of numbers,
-- strings and tensors. The tensors are the live buffers (as torch's): save them before
-- the next step.
function Optimizer:state_dict()
  local sd = {optimizer = self.kind, steps = self.steps, param_groups = {}, state = {}}
  local k = 0
  for gi, g in ipairs(self.param_groups) do
    local s = group_settings(g)
    s.keys = {}
    for j = 1, #g.params do
      k = k + 1
      s.keys[j] = self.keys[k]
    end
    sd.param_groups[gi] = s
  end
  for key, st in pairs(self.state) do
    local c = {}
    for f, v in pairs(st) do c[f] = v end
    sd.state[key] = c
  end
  return sd
end

-- The state_dict's kind and layout (steps, param_groups, state, as many groups).
local function check_state_dict_header(self, sd, who)
  if type(sd) ~= "table" then raise(who .. ": expected a state_dict table, got " .. type(sd)) end
  if sd.optimizer ~= self.kind then
    raise(string.format("%s: the state is for optimizer '%s', this one is '%s'", who, tostring(sd.optimizer), self.kind))
  end
  if type(sd.steps) ~= "number" or type(sd.param_groups) ~= "table" or type(sd.state) ~= "table" then
    raise(who .. ": a state_dict needs steps, param_groups and state")
  end
  if #sd.param_groups ~= #self.param_groups then
    raise(string.format("%s: the state has %d parameter groups, this optimizer %d", who, #sd.param_groups,
      #self.param_groups))
  end
end

-- key -> {p = the parameter, g = its group}, checking that each group of the state lists
-- the same keys in the same order.
local function index_parameters(self, sd, who)
  local index, k = {}, 0
  for gi, g in ipairs(self.param_groups) do
    local sg = sd.param_groups[gi]
    if type(sg) ~= "table" or type(sg.keys) ~= "table" or #sg.keys ~= #g.params then
      raise(string.format("%s: group %d has %s parameters in the state, %d here", who, gi,
        type(sg) == "table" and type(sg.keys) == "table" and tostring(#sg.keys) or "no list of", #g.params))
    end
    for j = 1, #g.params do
      k = k + 1
      if sg.keys[j] ~= self.keys[k] then
        raise(string.format("%s: group %d, parameter %d is '%s' in the state, '%s' here", who, gi, j,
          tostring(sg.keys[j]), tostring(self.keys[k])))
      end
      index[self.keys[k]] = {p = g.params[j], g = g}
    end
  end
  return index
end

-- A copy of one saved state tensor v (field f of key's state) in a fresh buffer: the
-- kind's fresh_buf for that field, else one of parameter p's shape in the state's dtype.
local function load_state_tensor(who, key, f, v, fresh_buf, p, state_dt)
  if not is_tensor(v) then raise(string.format("%s: state '%s'.%s must be a tensor, got %s", who, tostring(key), f, type(v))) end
  local ref = fresh_buf or p
  local want_shape, got_shape = table.concat(ref.shape, ", "), table.concat(v.shape, ", ")
  if want_shape ~= got_shape then
    raise(string.format("%s: state '%s'.%s has shape [%s], the parameter [%s]", who, tostring(key), f, got_shape,
      want_shape))
  end
  local buf = fresh_buf or Optimizer.keep(create.zeros_like(p, {dtype = state_dt}))
  without_grad(buf.copy_, buf, v)
  return buf
end

-- One parameter's loaded state: its fields checked against the kind's, tensors copied.
local function load_param_state(self, who, key, st, at)
  if type(st) ~= "table" then raise(string.format("%s: state of '%s' is %s, not a table", who, tostring(key), type(st))) end
  local fresh = self.impl.init(at.p, at.g)
  -- with master weights the state is of the f32 copy (an SGD momentum buffer too)
  local state_dt = self.impl.state_dtype(st.master ~= nil and {dtype = "f32"} or at.p)
  local c = {}
  for f, v in pairs(st) do
    local want = self.impl.fields[f] or (f == "master" and "tensor")
    if not want then raise(string.format("%s: state of '%s' has an unknown field '%s'", who, tostring(key), tostring(f))) end
    if want == "number" then
      if type(v) ~= "number" then raise(string.format("%s: state '%s'.%s must be a number", who, tostring(key), f)) end
      c[f] = v
    else
      c[f] = load_state_tensor(who, key, f, v, fresh[f], at.p, state_dt)
    end
  end
  for f in pairs(self.impl.required) do
    if c[f] == nil then raise(string.format("%s: state of '%s' lacks field '%s'", who, tostring(key), f)) end
  end
  return c
end

-- Checks each saved group's settings: known to the kind, and valid merged over the group.
local function check_group_settings(self, sd, who)
  for gi, g in ipairs(self.param_groups) do
    local sg = sd.param_groups[gi]
    local settings = {}
    for f, v in pairs(sg) do
      if f ~= "keys" then
        if self.impl.defaults[f] == nil and not self.impl.optional[f] and f ~= "name" then
          raise(string.format("%s: group %d has an unknown setting '%s'", who, gi, tostring(f)))
        end
        settings[f] = copy_value(v)
      end
    end
    local merged = {}
    for f, v in pairs(g) do merged[f] = v end
    for f, v in pairs(settings) do merged[f] = v end
    self.impl.check(merged, string.format("%s: group %d", who, gi))
  end
end

-- Loads a state_dict of the same optimizer kind over the same parameters (same group
-- sizes and keys, same shapes): settings, steps and state are restored; state tensors
-- are copied into fresh buffers.
function Optimizer:load_state_dict(sd)
  local who = self.impl.title .. ":load_state_dict"
  check_state_dict_header(self, sd, who)
  local index = index_parameters(self, sd, who)
  -- check everything before changing anything
  local new_state = {}
  for key, st in pairs(sd.state) do
    local at = index[key]
    if not at then raise(string.format("%s: the state has an entry for '%s', not a parameter here", who, tostring(key))) end
    new_state[key] = load_param_state(self, who, key, st, at)
  end
  check_group_settings(self, sd, who)
  for gi, g in ipairs(self.param_groups) do
    for f, v in pairs(sd.param_groups[gi]) do
      if f ~= "keys" then g[f] = copy_value(v) end
    end
  end
  self.state = new_state
  self.steps = sd.steps
end

function Optimizer:__tostring()
  local parts = {}
  for gi, g in ipairs(self.param_groups) do
    local s = {}
    for k, v in pairs(group_settings(g)) do
      s[#s + 1] = k .. "=" .. (type(v) == "table" and "{" .. table.concat(v, ", ") .. "}" or tostring(v))
    end
    table.sort(s)
    parts[gi] = string.format("  group %d: %d params, %s", gi, #g.params, table.concat(s, ", "))
  end
  return string.format("%s (step %d)\n%s", self.impl.title, self.steps, table.concat(parts, "\n"))
end

return Optimizer
