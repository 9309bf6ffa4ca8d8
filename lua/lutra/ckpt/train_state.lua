-- lutra.ckpt.train_state — the trainer's tensors and optimizer state in the names the sharded
-- checkpoint uses, and their restore into any layout.
--
--   local ts = require "lutra.ckpt.train_state"
--   local tensors, optim_extra = ts.collect(named, opt)
--   ckpt.save(dir, {step =, layout =, config =, tensors = tensors,
--                   extra = {optim = optim_extra, rng = ..., loader = ...}}, {world = group, async = true})
--   ...
--   local r = ckpt.load(ckpt.latest(run_dir))
--   ts.restore(r, named, opt)        -- parameters and optimizer state, resharded to this rank's pieces
--   ts.check(r, named, opt, all_names)  -- what restore checks first: names, shapes, dtypes
--   ts.model_state(r)                -- {name = whole tensor} of the model (no optimizer state)
--
-- named: this rank's parameters, {{name =, tensor =}, ...} or {name = tensor} (global names;
-- sharded ones carry their lutra.dist.spec). Names in the checkpoint:
--   <param name>                       the parameter
--   optim.<param key>.<field>          each tensor field of its optimizer state (AdamW: exp_avg,
--                                      exp_avg_sq), with the parameter's spec (the same boxes)
-- The optimizer's numbers (steps, each parameter's numeric fields such as AdamW's step) go
-- into extra.optim of every rank; restore merges them over the ranks, so a parameter that
-- moved to another rank (another layout) finds its numbers.
local errors = require "lutra.errors"
local spec = require "lutra.dist.spec"
local create = require "lutra.create"
local weight_checks = require "lutra.ckpt.weight_checks"
require "lutra.tensor"

local M = {}
local raise = errors.raise

local function as_list(named)
  if type(named) ~= "table" then raise("train_state: expected the named parameters as a table") end
  if named[1] ~= nil or next(named) == nil then return named end
  local list = {}
  for name, t in pairs(named) do list[#list + 1] = {name = name, tensor = t} end
  table.sort(list, function(a, b) return a.name < b.name end)
  return list
end
M.as_list = as_list

-- dst gets src's spec, its pieces included (lutra.dist.spec.copy leaves `pieces` out: a
-- tensor-parallel qkv moment would lose its q/k/v row boxes).
local function copy_spec(dst, src)
  local s = spec.get(src)
  if not s then return end
  spec.set(dst, {global = s.global, offset = s.offset, dup = s.dup})
  spec.get(dst).pieces = s.pieces
end

-- The shape of state field f of parameter p (global, or p's own with `local_shape`): the
-- parameter's, unless the kind says otherwise (Adafactor's factored moments).
local function state_shape(opt, p, f, local_shape)
  local shape = local_shape and p.shape or spec.global_shape(p)
  if opt.impl.state_shape then return opt.impl.state_shape(shape, f) end
  return shape
end

-- The optimizer's parameter for each state key.
local function param_of_key(opt)
  local out = {}
  for k, key in ipairs(opt.keys) do out[key] = opt.params[k] end
  return out
end

-- Tensors (parameters and optimizer state) to save, and the optimizer's numbers (for extra).
function M.collect(named, opt)
  local tensors = {}
  for _, e in ipairs(as_list(named)) do tensors[#tensors + 1] = {name = e.name, tensor = e.tensor} end
  if not opt then return tensors, nil end
  local params = param_of_key(opt)
  local numbers = {}
  local keys = {}
  for key in pairs(opt.state) do keys[#keys + 1] = key end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for _, key in ipairs(keys) do
    local st, p = opt.state[key], params[key]
    local fields = {}
    for f in pairs(st) do fields[#fields + 1] = f end
    table.sort(fields)
    for _, f in ipairs(fields) do
      local v = st[f]
      if type(v) == "number" then
        numbers[tostring(key)] = numbers[tostring(key)] or {}
        numbers[tostring(key)][f] = v
      elseif v ~= nil then
        if p and opt.impl.state_shape and spec.get(p) and shape_str(v.shape) ~= shape_str(p.shape) then
          raise(string.format("train_state: %s's state '%s' of the sharded parameter '%s' is not of its shape "
            .. "(factored): it cannot be resharded; use one process or another optimizer", tostring(opt.kind), f,
            tostring(key)))
        end
        if p then copy_spec(v, p) end
        tensors[#tensors + 1] = {name = "optim." .. tostring(key) .. "." .. f, tensor = v}
      end
    end
  end
  return tensors, {kind = opt.kind, steps = opt.steps, numbers = numbers}
end

local function shape_str(s) return "{" .. table.concat(s, ", ") .. "}" end

-- 1 + the largest N of the names blocks.N.* (0 when there is none).
local function layer_count(names)
  local n = 0
  for _, name in ipairs(names) do
    local i = tonumber(name:match("^blocks%.(%d+)%."))
    if i and i + 1 > n then n = i + 1 end
  end
  return n
end

-- The optimizer's numbers saved in the extra state, merged over the ranks: numbers (key ->
-- fields), steps, kind.
local function saved_optim(r)
  local numbers, steps, kind = {}, nil, nil
  for rank = 0, #(r.manifest.extra or {}) - 1 do
    local x = r:extra(rank).optim
    if type(x) == "table" then
      steps, kind = steps or x.steps, kind or x.kind
      for key, fields in pairs(x.numbers or {}) do numbers[key] = numbers[key] or fields end
    end
  end
  return numbers, steps, kind
end

-- Checks reader r against the parameters (named, this rank's) and the optimizer before
-- anything is loaded, and raises listing every problem with the checkpoint's manifest named:
-- a parameter the checkpoint lacks or holds in another global shape or dtype; a model tensor
-- of the checkpoint that the model has no parameter for (all_names: every parameter name of
-- the whole model, other ranks' included; nil: named's); with opt, optimizer state for a
-- parameter the model does not have, a field this optimizer does not keep, or of another shape
-- than its parameter.
function M.check(r, named, opt, all_names)
  local list = as_list(named)
  local problems, known, model_names = {}, {}, {}
  local function problem(fmt, ...) problems[#problems + 1] = string.format(fmt, ...) end
  for _, name in ipairs(all_names or {}) do known[name] = true end
  for _, e in ipairs(list) do known[e.name] = true end
  for name in pairs(known) do model_names[#model_names + 1] = name end
  for _, e in ipairs(list) do
    local t = r.by_name[e.name]
    if not t then
      problem("the checkpoint has no tensor '%s' (a parameter of the model)", e.name)
    else
      local g = spec.global_shape(e.tensor)
      if shape_str(g) ~= shape_str(t.shape) then
        problem("tensor '%s' is %s in the checkpoint, the model's is %s", e.name, shape_str(t.shape), shape_str(g))
      elseif t.dtype ~= e.tensor.dtype then
        problem("tensor '%s' is %s in the checkpoint, the model's parameter is %s", e.name, t.dtype, e.tensor.dtype)
      end
    end
  end
  local param_of = {}
  if opt then
    local kind = select(3, saved_optim(r))
    if kind and kind ~= opt.kind then
      raise(string.format("train_state.restore: %s: the checkpoint's optimizer is '%s', this one is '%s'", r.dir, kind,
        opt.kind))
    end
    for k, key in ipairs(opt.keys) do param_of[tostring(key)] = opt.params[k] end
  end
  local ckpt_names = {}
  for _, t in ipairs(r.manifest.tensors) do
    local key, field = t.name:match("^optim%.(.+)%.([^.]+)$")
    if not key then
      ckpt_names[#ckpt_names + 1] = t.name
      if not known[t.name] then problem("unexpected tensor '%s' (the checkpoint has it, the model does not)", t.name) end
    elseif opt then
      local p = param_of[key]
      if not p then -- another rank's parameter (a pipeline stage) is fine, one of no model is not
        if not known[key] then
          problem("unexpected optimizer state '%s': the model has no parameter '%s'", t.name, key)
        end
      elseif opt.impl.fields[field] ~= "tensor" then
        problem("unexpected optimizer state '%s': %s keeps no tensor '%s'", t.name, tostring(opt.kind), field)
      elseif shape_str(state_shape(opt, p, field)) ~= shape_str(t.shape) then
        problem("optimizer state '%s' is %s, its parameter %s%s", t.name, shape_str(t.shape),
          shape_str(spec.global_shape(p)), opt.impl.state_shape and " (expected "
          .. shape_str(state_shape(opt, p, field)) .. ")" or "")
      elseif t.dtype ~= "f32" and t.dtype ~= "f64" and t.dtype ~= "bf16" and t.dtype ~= "f16" then
        problem("optimizer state '%s' is %s: optimizer state is floating-point", t.name, t.dtype)
      end
    end
  end
  if #problems == 0 then return end
  local saved, have = layer_count(ckpt_names), layer_count(model_names)
  if saved ~= have then -- one line for the layers only one side has, not one per tensor
    local lo, hi = math.min(saved, have), math.max(saved, have)
    local kept, extra = {}, 0
    for _, p in ipairs(problems) do
      local i = tonumber(p:match("tensor 'blocks%.(%d+)%."))
      if i and i >= lo then extra = extra + 1 else kept[#kept + 1] = p end
    end
    table.insert(kept, 1, string.format("the checkpoint holds %d layer%s (blocks.*), the model %d: %d tensors of "
      .. "blocks.%d%s %s", saved, saved == 1 and "" or "s", have, extra, lo, hi - 1 > lo and "-" .. (hi - 1) or "",
      saved > have and "are in the checkpoint only" or "are missing from it"))
    problems = kept
  end
  local shown = {}
  for i = 1, math.min(#problems, 12) do shown[i] = problems[i] end
  if #problems > 12 then shown[#shown + 1] = string.format("... and %d more", #problems - 12) end
  raise(string.format("ckpt: %s/manifest.json does not match this model:\n  %s", r.dir, table.concat(shown, "\n  ")))
end

-- Fills the parameters (always) and the optimizer state (when opt is given) from reader r,
-- resharded to this rank's pieces, after M.check (opts.all_names: every parameter name of the
-- whole model). A parameter without saved optimizer state starts fresh (as one never updated).
-- A value that is not finite (NaN, inf) is an error naming the tensor, unless
-- opts.allow_nonfinite.
function M.restore(r, named, opt, opts)
  opts = opts or {}
  local list = as_list(named)
  M.check(r, list, opt, opts.all_names)
  r:load_into(list)
  local hint = {allow_nonfinite = opts.allow_nonfinite,
                nonfinite_hint = "the run that saved it had diverged: resume from an earlier checkpoint"}
  local function finite(name, t)
    weight_checks.finite(t, string.format("ckpt: %s: tensor '%s'", r.dir, name), hint)
  end
  for _, e in ipairs(list) do finite(e.name, e.tensor) end
  if not opt then return end
  -- the optimizer's own parameters when they are other tensors (ZeRO shards that are not
  -- views of the model's parameters): filled from the same global names
  local filled = {}
  for _, e in ipairs(list) do filled[e.tensor] = true end
  for k, key in ipairs(opt.keys) do
    local p = opt.params[k]
    if not filled[p] and r.by_name[tostring(key)] then r:load_into({{name = tostring(key), tensor = p}}) end
  end
  local numbers, steps = saved_optim(r)
  local sd = opt:state_dict()
  sd.steps = steps or sd.steps
  sd.state = {}
  for k, key in ipairs(opt.keys) do
    local p = opt.params[k]
    local st = nil
    for f, want in pairs(opt.impl.fields) do
      local name = "optim." .. tostring(key) .. "." .. f
      if want == "tensor" and r.by_name[name] then
        local buf = create.zeros(state_shape(opt, p, f, true), {dtype = r:info(name).dtype})
        if shape_str(buf.shape) == shape_str(p.shape) then copy_spec(buf, p) end
        r:load_into({{name = name, tensor = buf}})
        finite(name, buf)
        st = st or {}
        st[f] = buf
      end
    end
    if st then
      for f, v in pairs(numbers[tostring(key)] or {}) do st[f] = v end
      sd.state[key] = st
    end
  end
  opt:load_state_dict(sd)
end

-- The model's whole tensors from reader r ({name = CPU tensor}, every tensor not under
-- "optim."): what `lutra convert` or an inference load wants, whatever the saved layout.
function M.model_state(r)
  local out = {}
  for _, name in ipairs(r:names()) do
    if name:sub(1, 6) ~= "optim." then out[name] = r:tensor(name) end
  end
  return out
end

return M
