-- lutra.dist.spec — what piece of which global tensor a local tensor is.
--
--   spec.set(t, {global = {R, C}, offset = {r0, 0}, dup = false})
--   spec.get(t)   -- that table, or nil: t is the whole tensor, owned by this rank
--
-- A sharded parameter is the box [offset, offset + t.shape) of a global tensor of shape
-- `global` (or several boxes: `pieces`, see M.boxes). dup = true marks a copy whose owner is another rank (a tensor-parallel
-- replicated norm on tp_rank > 0, the last pipeline stage's copy of a tied embedding):
-- global norms and checkpoints skip it. Checkpoints reshard from these boxes; the
-- parameter's name stays the global one.
local errors = require "lutra.errors"
local ops = require "lutra.ops"

local raise, is_tensor = errors.raise, ops.is_tensor

local M = {}

-- keyed by the tensor's storage-independent identity: the cdata object itself (weak)
local specs = setmetatable({}, {__mode = "k"})

local function int_list(v, n, what)
  if type(v) ~= "table" or #v ~= n then raise(string.format("spec.set: %s must be a list of %d integers", what, n)) end
  for i = 1, n do
    if type(v[i]) ~= "number" or v[i] < 0 or v[i] ~= math.floor(v[i]) then
      raise(string.format("spec.set: %s[%d] must be a non-negative integer, got %s", what, i, tostring(v[i])))
    end
  end
end

function M.set(t, s)
  if not is_tensor(t) then raise("spec.set: expected a tensor, got " .. type(t)) end
  if s == nil then
    specs[t] = nil
    return t
  end
  if type(s) ~= "table" then raise("spec.set: expected a table {global =, offset =, dup =}") end
  local n = t.ndim
  int_list(s.global, n, "global")
  local offset = s.offset or {}
  if s.offset == nil then
    for i = 1, n do offset[i] = 0 end
  end
  int_list(offset, n, "offset")
  for i = 1, n do
    if offset[i] + t:size(i - 1) > s.global[i] then
      raise(string.format("spec.set: dim %d: the piece [%d, %d) does not fit the global size %d", i - 1, offset[i],
        offset[i] + t:size(i - 1), s.global[i]))
    end
  end
  specs[t] = {global = s.global, offset = offset, dup = s.dup and true or false}
  return t
end

function M.get(t) return specs[t] end

-- The boxes of t: a list of {offset = global offset, local_offset =, shape =}. One box
-- (all of t) unless the spec lists `pieces`: a tensor-parallel fused qkv weight holds
-- three row ranges of the global tensor (its q, k and v heads).
function M.boxes(t)
  local s = specs[t]
  if s and s.pieces then return s.pieces end
  local shape, zeros = {}, {}
  for i = 1, t.ndim do shape[i], zeros[i] = t:size(i - 1), 0 end
  return {{offset = s and s.offset or zeros, local_offset = zeros, shape = shape}}
end

-- The global shape of t (its own shape when it has no spec).
function M.global_shape(t)
  local s = specs[t]
  if s then return s.global end
  local out = {}
  for i = 1, t.ndim do out[i] = t:size(i - 1) end
  return out
end

-- Whether this rank owns t's values (not a dup).
function M.owned(t)
  local s = specs[t]
  return s == nil or not s.dup
end

-- Copies the spec of src onto dst (a same-shaped tensor: an optimizer moment, a grad).
function M.copy(dst, src)
  local s = specs[src]
  if s then specs[dst] = {global = s.global, offset = s.offset, dup = s.dup, pieces = s.pieces} end
  return dst
end

return M
