-- lutra.nn.state_dict — a module's state as a table name -> tensor, and loading one
-- back with name and shape checks.
--
--   m:state_dict()                        -> {["blocks.0.attn.qkv.weight"] = t, ...}
--   m:load_state_dict(sd, {strict = true}) -> {missing_keys = {...}, unexpected_keys = {...}}
--
-- The state is every parameter and persistent buffer under every name (a tied tensor
-- appears under each of its names), as the module's own tensors, not copies. Loading
-- copies values into the module's tensors (converting dtype and device), without
-- recording for autograd. strict (the default) refuses missing and unexpected keys;
-- a shape mismatch or a value that is not a tensor is always refused. Weights read from a
-- file name it (opts.source = the file or checkpoint): then each value must have its
-- parameter's dtype and be finite, as lutra.ckpt.weight_checks says (opts.allow_cast,
-- opts.allow_nonfinite), and the errors name the file. Nothing is copied when anything is
-- refused. The error lists every problem.
local ops = require "lutra.ops"
local errors = require "lutra.errors"
local fields = require "lutra.tensor.fields"
local grad = require "lutra.nn.grad"
local traverse = require "lutra.nn.traverse"
local weight_checks = require "lutra.ckpt.weight_checks"

local raise, is_tensor = errors.raise, ops.is_tensor
local collect = traverse.collect

local M = {}

function M.state_dict(m)
  local sd = {}
  for _, kind in ipairs {"param", "buffer"} do
    local names, ts = collect(m, kind, true)
    for i, name in ipairs(names) do sd[name] = ts[i] end
  end
  return sd
end

-- The names of the state in traversal order (the order of named_parameters, then buffers).
function M.state_names(m)
  local list = {}
  for _, kind in ipairs {"param", "buffer"} do
    local names = collect(m, kind, true)
    for _, name in ipairs(names) do list[#list + 1] = name end
  end
  return list
end

local function shape_str(t) return "[" .. table.concat(t.shape, ", ") .. "]" end

local function sorted_keys(set)
  local list = {}
  for k in pairs(set) do list[#list + 1] = k end
  table.sort(list)
  return list
end

function M.load_state_dict(m, sd, opts)
  if type(sd) ~= "table" then raise("load_state_dict: expected a table name -> tensor, got " .. type(sd)) end
  if opts ~= nil and type(opts) ~= "table" then raise("load_state_dict: options must be a table {strict=}") end
  local strict = not (opts and opts.strict == false)
  local source = opts and opts.source
  local own = M.state_dict(m)
  local missing, unexpected, problems = {}, {}, {}
  for k in pairs(own) do
    if sd[k] == nil then missing[k] = true end
  end
  for _, k in ipairs(sorted_keys(sd)) do
    local v, mine = sd[k], own[k]
    if type(k) ~= "string" then
      problems[#problems + 1] = "key " .. tostring(k) .. " is not a string"
    elseif mine == nil then
      unexpected[k] = true
    elseif not is_tensor(v) then
      problems[#problems + 1] = string.format("'%s' is a %s, not a tensor", k, type(v))
    elseif not fields.same_shape(v, mine) then
      problems[#problems + 1] = string.format("shape mismatch for '%s': the state dict has %s, the model %s", k,
        shape_str(v), shape_str(mine))
    elseif source then
      local where = string.format("%s: tensor '%s'", source, k)
      problems[#problems + 1] = weight_checks.dtype_problem(v.dtype, mine.dtype, where, opts)
        or weight_checks.finite_problem(v, where, opts)
    end
  end
  local missing_list, unexpected_list = sorted_keys(missing), sorted_keys(unexpected)
  local lines = {}
  if strict and #missing_list > 0 then lines[#lines + 1] = "missing keys: " .. table.concat(missing_list, ", ") end
  if strict and #unexpected_list > 0 then
    lines[#lines + 1] = "unexpected keys: " .. table.concat(unexpected_list, ", ")
  end
  for _, p in ipairs(problems) do lines[#lines + 1] = p end
  if #lines > 0 then
    raise("load_state_dict: cannot load into " .. m.__name .. (source and " from " .. source or "") .. ":\n  "
      .. table.concat(lines, "\n  "))
  end
  grad.no_grad(function()
    for k, v in pairs(sd) do
      local mine = own[k]
      if mine ~= nil and mine ~= v then mine:copy_(v) end
    end
  end)
  return {missing_keys = missing_list, unexpected_keys = unexpected_list}
end

return M
