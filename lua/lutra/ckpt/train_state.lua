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
        if p then copy_spec(v, p) end
        tensors[#tensors + 1] = {name = "optim." .. tostring(key) .. "." .. f, tensor = v}
      end
    end
  end
  return tensors, {kind = opt.kind, steps = opt.steps, numbers = numbers}
end

-- Fills the parameters (always) and the optimizer state (when opt is given) from reader r,
-- resharded to this rank's pieces. A parameter the checkpoint lacks is an error; a
-- parameter without saved optimizer state starts fresh (as one never updated).
function M.restore(r, named, opt)
  local list = as_list(named)
  r:load_into(list)
  if not opt then return end
  -- the optimizer's own parameters when they are other tensors (ZeRO shards that are not
  -- views of the model's parameters): filled from the same global names
  local filled = {}
  for _, e in ipairs(list) do filled[e.tensor] = true end
  for k, key in ipairs(opt.keys) do
    local p = opt.params[k]
    if not filled[p] and r.by_name[tostring(key)] then r:load_into({{name = tostring(key), tensor = p}}) end
  end
  local numbers, steps, kind = {}, nil, nil
  for rank = 0, #(r.manifest.extra or {}) - 1 do
    local x = r:extra(rank).optim
    if type(x) == "table" then
      steps, kind = steps or x.steps, kind or x.kind
      for key, fields in pairs(x.numbers or {}) do numbers[key] = numbers[key] or fields end
    end
  end
  if kind and kind ~= opt.kind then
    raise(string.format("train_state.restore: the checkpoint's optimizer is '%s', this one is '%s'", kind, opt.kind))
  end
  local sd = opt:state_dict()
  sd.steps = steps or sd.steps
  sd.state = {}
  for k, key in ipairs(opt.keys) do
    local p = opt.params[k]
    local st = nil
    for f, want in pairs(opt.impl.fields) do
      local name = "optim." .. tostring(key) .. "." .. f
      if want == "tensor" and r.by_name[name] then
        local buf = create.zeros(p.shape, {dtype = r:info(name).dtype})
        copy_spec(buf, p)
        r:load_into({{name = name, tensor = buf}})
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
