-- lutra.train.extras — the extra metrics a loss_fn gives beside its loss, reduced over a step's
-- micro-batches and the ranks of a parallel layout into one number a name.
--
--   loss_fn(model, batch) -> loss, {accuracy = 0.31, n_correct = {97, reduce = "sum"}}
--
-- A value (a number or a one-element tensor) is averaged: over the step's micro-batches
-- (grad_accum, pipeline micro-batches: equal rows, so the mean of their means) and the
-- data-parallel ranks. {value, reduce = "sum"} is summed instead: a count (tokens, correct
-- predictions) comes out as the step's total over the global batch. Every rank must give the
-- same names and reductions (checked where they are reduced).
--
--   local acc = extras.new()
--   extras.add(acc, extra, w)        -- one micro-batch's table: means get v * w (w = its share)
--   extras.merge(acc, part, w)       -- another accumulator, its means weighted by w
--   extras.over(group, acc, rank)    -- all-reduced over a group (collective): sums, means / size
--   extras.share(group, acc, root)   -- root's accumulator on every rank of group (collective)
--   extras.values(acc)               -- {name = number}, nil when there are none
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local ops = require "lutra.ops"
local create = require "lutra.create"
local ffi, C = lt.ffi, lt.C

local raise, is_tensor = errors.raise, ops.is_tensor

local M = {}

function M.new() return {} end

local function number_of(name, v)
  if type(v) == "number" then return v end
  if is_tensor(v) then
    if v:numel() ~= 1 then
      raise(string.format("train: loss_fn's extra metric '%s' is a tensor of %d elements; give one number", name,
        v:numel()))
    end
    return v:item()
  end
  raise(string.format("train: loss_fn's extra metric '%s' must be a number, a one-element tensor or "
    .. "{value, reduce = \"sum\"}, got %s", name, type(v)))
end

-- name -> value, summed (true) or averaged, from one entry of loss_fn's table.
local function entry(name, v)
  if type(v) == "table" and not is_tensor(v) then
    local how = v.reduce or "mean"
    if how ~= "mean" and how ~= "sum" then
      raise(string.format("train: loss_fn's extra metric '%s' has reduce = %s; use \"mean\" (the default) or \"sum\"",
        name, tostring(how)))
    end
    return number_of(name, v[1]), how == "sum"
  end
  return number_of(name, v), false
end

local function put(acc, name, v, sum, w)
  local e = acc[name]
  if e == nil then
    e = {value = 0, sum = sum}
    acc[name] = e
  elseif e.sum ~= sum then
    raise(string.format("train: loss_fn's extra metric '%s' is summed in one micro-batch and averaged in another",
      name))
  end
  e.value = e.value + (sum and v or v * w)
end

function M.add(acc, extra, w)
  if type(extra) ~= "table" then return acc end -- (a second result of another kind is not metrics)
  for name, v in pairs(extra) do
    if type(name) ~= "string" then raise("train: loss_fn's extra metrics are named by strings, got a " .. type(name)) end
    local value, sum = entry(name, v)
    put(acc, name, value, sum, w)
  end
  return acc
end

function M.merge(acc, part, w)
  for name, e in pairs(part or {}) do put(acc, name, e.value, e.sum, w) end
  return acc
end

local function sorted_names(acc)
  local names = {}
  for name in pairs(acc) do names[#names + 1] = name end
  table.sort(names)
  return names
end

-- A number for the names and their reductions, the same on every rank that has the same.
local function names_hash(acc, names)
  local h = 5381
  for _, name in ipairs(names) do
    for c in (name .. (acc[name].sum and "+" or "")):gmatch(".") do h = (h * 33 + c:byte()) % 2147483647 end
    h = (h * 33 + 1) % 2147483647
  end
  return h
end

local function describe(acc, names)
  local parts = {}
  for i, name in ipairs(names) do parts[i] = acc[name].sum and name .. " (sum)" or name end
  return table.concat(parts, ", ")
end

-- Two small all-reduces: the names' count and hash (max of {n, -n, h, -h}: equal everywhere
-- when max = -min), then the values (one sum; the means divided by the group's size).
function M.over(group, acc, rank)
  if group == nil or group.size == 1 then return acc end
  local names = sorted_names(acc)
  local h = names_hash(acc, names)
  local check = create.tensor({#names, -#names, h, -h}, {dtype = "f64"})
  group:all_reduce(check, "max")
  local c = check:tolist()
  check:free()
  if c[1] ~= -c[2] or c[3] ~= -c[4] then
    raise(string.format("train: loss_fn's extra metrics differ across the data-parallel ranks (this rank, %d, gives "
      .. "{%s}): every rank must return the same names and reductions", rank or group.rank, describe(acc, names)))
  end
  if #names == 0 then return acc end
  local values = {}
  for i, name in ipairs(names) do values[i] = acc[name].value end
  local t = create.tensor(values, {dtype = "f64"})
  group:all_reduce(t, "sum")
  local out = {}
  for i, v in ipairs(t:tolist()) do
    local sum = acc[names[i]].sum
    out[names[i]] = {value = sum and v or v / group.size, sum = sum}
  end
  t:free()
  return out
end

-- root's accumulator on every rank: a header {bytes, count}, then the names ("+" marks a sum,
-- "\n" ends each) followed by the values' f64 bytes.
function M.share(group, acc, root)
  if group == nil or group.size == 1 then return acc end
  local mine = group.rank == root
  local names, text = {}, ""
  if mine then
    names = sorted_names(acc)
    local lines = {}
    for i, name in ipairs(names) do lines[i] = name .. (acc[name].sum and "+" or "") .. "\n" end
    text = table.concat(lines)
  end
  local head = create.tensor({#text, #names}, {dtype = "f64"})
  group:broadcast(head, root)
  local nbytes, n = unpack(head:tolist())
  head:free()
  if n == 0 then return {} end
  local buf = create.empty({nbytes + 8 * n}, {dtype = "u8"})
  local p = ffi.cast("uint8_t *", C.lt_data_ptr(buf))
  if mine then
    ffi.copy(p, text, nbytes)
    local vals = ffi.new("double[?]", n)
    for i, name in ipairs(names) do vals[i - 1] = acc[name].value end
    ffi.copy(p + nbytes, vals, 8 * n)
  end
  group:broadcast(buf, root)
  local out, vals, i = {}, ffi.new("double[?]", n), 0
  ffi.copy(vals, p + nbytes, 8 * n)
  for line in ffi.string(p, nbytes):gmatch("([^\n]*)\n") do
    local sum = line:sub(-1) == "+"
    out[sum and line:sub(1, -2) or line] = {value = vals[i], sum = sum}
    i = i + 1
  end
  buf:free()
  return out
end

function M.values(acc)
  if acc == nil or next(acc) == nil then return nil end
  local out = {}
  for name, e in pairs(acc) do out[name] = e.value end
  return out
end

return M
