-- lutra.nn.options — checks of constructor arguments: option tables with known keys
-- only, positive integers, probabilities. Errors name the module and the key.
local errors = require "lutra.errors"

local raise = errors.raise

local M = {}

-- opts (nil or a table) whose keys must all be in `allowed` (a list); returns a table.
function M.check(name, opts, allowed)
  if opts == nil then return {} end
  if type(opts) ~= "table" then raise(string.format("%s: options must be a table, got %s", name, type(opts))) end
  local set = {}
  for _, k in ipairs(allowed) do set[k] = true end
  for k in pairs(opts) do
    if not set[k] then
      table.sort(allowed)
      raise(string.format("%s: unknown option '%s' (known: %s)", name, tostring(k), table.concat(allowed, ", ")))
    end
  end
  return opts
end

function M.positive_int(name, what, v)
  if type(v) ~= "number" or v ~= math.floor(v) or v < 1 then
    raise(string.format("%s: %s must be a positive integer, got %s", name, what, tostring(v)))
  end
  return v
end

function M.probability(name, what, v)
  if type(v) ~= "number" or v < 0 or v > 1 or v ~= v then
    raise(string.format("%s: %s must be a number in [0, 1], got %s", name, what, tostring(v)))
  end
  return v
end

function M.positive(name, what, v)
  if type(v) ~= "number" or not (v > 0) or v == math.huge then
    raise(string.format("%s: %s must be a positive number, got %s", name, what, tostring(v)))
  end
  return v
end

function M.boolean(name, what, v, default)
  if v == nil then return default end
  if type(v) ~= "boolean" then raise(string.format("%s: %s must be true or false, got %s", name, what, tostring(v))) end
  return v
end

-- {dtype =, device =} of opts, for the factory functions.
function M.factory(opts) return {dtype = opts.dtype, device = opts.device} end

return M
