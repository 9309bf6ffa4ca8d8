-- lutra.autograd.state — the per-tensor autograd data that the op wrappers (ops, tensor,
-- functional, index, create) share with autograd, with no dependency on them, so that they
-- can require it while autograd's formulas require them. How an op declares its node and
-- backward: lutra/autograd/op.lua.
--
-- Per tensor, kept by lutra.tensor.fields under the tensor's registry slot (lutra.memory):
--   autograd_state  UNTRACKED; LEAF, a leaf that requires grad; RECORDED, the result of a recorded op.
--   view_kind       VIEW: made by a view op (shares another tensor's storage); SAVED_ALIAS: an alias
--                   that autograd made to save a tensor (freed by the engine after use).
-- A tensor that has autograd data has a record: the leaf record {leaf = true, grad =,
-- hooks =} or the node of the op that made it. Records live in the registry next to
-- the tensor (memory.records[slot]: an array store, no hashing; inserting into a table keyed
-- by the tensor cdata costs as much as the op itself), and the registry's sweep drops them
-- with the tensor.
--
-- A record lives as long as its tensor, and a tensor as long as something holds it. A
-- node that held a tensor which itself has a record (the result of a recorded op)
-- would keep that tensor, its node, the tensors that node holds, ... alive one GC cycle
-- per level of the graph once the graph is dropped. So nodes never hold such tensors:
-- save() keeps results of recorded ops (RECORDED) through an alias (a new tensor sharing
-- the storage, with no record), owned by the node and freed once backward used it.
-- Leaves and plain tensors are held as they are.
--
-- A node is a table {edge_1, edge_2, ..., cls = class}: edge_i is the record of input i
-- (false when input i does not require grad); saved tensors are named fields listed by
-- the class, each with its version at save time in field "ver_" .. name.
--
-- Versions: in-place writes bump a counter per storage (views share it), kept in a
-- table keyed by the storage's address for storages that were saved for backward (a
-- saved tensor keeps its storage, so the address cannot be reused while it matters).
local lt = require "lutra.ffi"
local memory = require "lutra.memory"
local dtype = require "lutra.dtype"
local errors = require "lutra.errors"
local fields = require "lutra.tensor.fields"
local is_tracked = fields.is_tracked
local is_recorded = fields.is_recorded

local M = {}

M.enabled = true -- grad mode (lutra.no_grad turns it off)
M.retain_graph = false -- while backward runs: whether saved tensors must survive it
-- lutra.detect_anomaly's checks while it is on ({forward = fn(out, node), backward = fn(node, ...)},
-- lutra/autograd/anomaly.lua), else nil: one field test per recorded op and backward node
M.anomaly = nil

local records = memory.records

-- t's record (nil when it has none).
local function record(t) return records[fields.slot(t)] end
M.record = record

local function set_record(t, rec) records[fields.slot(t)] = rec end
M.set_record = set_record

-- ---- versions ------------------------------------------------------------------------

local versions = {} -- storage address -> version
local saved_refs = setmetatable({}, {__mode = "v"}) -- saved tensors, to prune versions
local n_refs, prune_at = 0, 4096

local function storage_key(t)
  return fields.storage_key(t)
end

-- Notes an in-place write into t (any tensor: only saved storages are counted).
function M.bump(t)
  if not fields.is_freed(t) then
    local k = fields.storage_key(t)
    local v = versions[k]
    if v ~= nil then versions[k] = v + 1 end
  end
end

-- Keeps the entries of storages that saved tensors still hold.
local function prune()
  local kept, live = 0, {}
  for i = 1, n_refs do
    local t = saved_refs[i]
    saved_refs[i] = nil
    if t ~= nil and not fields.is_freed(t) then
      kept = kept + 1
      saved_refs[kept] = t
      local k = storage_key(t)
      live[k] = versions[k]
    end
  end
  versions = live
  n_refs = kept
  prune_at = kept * 2 > 4096 and kept * 2 or 4096
end

-- The current version of t's storage (registering it).
local function version_of(t)
  local k = fields.storage_key(t)
  local v = versions[k]
  if v == nil then
    v = 0
    versions[k] = 0
  end
  return v
end

local function remember(t)
  n_refs = n_refs + 1
  saved_refs[n_refs] = t
  if n_refs > prune_at then prune() end
end

-- True when the storage of saved tensor t was written in place since version v (-1:
-- the op that saved it overwrote it).
function M.modified(t, v)
  if v == -1 then return true end
  if fields.is_freed(t) then return false end -- freed: the op reports it
  local now = versions[storage_key(t)]
  return now ~= nil and now ~= v
end

-- ---- saving tensors for backward ------------------------------------------------------

-- A new tensor sharing t's storage and geometry, with no autograd data (a view).
function M.share(t)
  local out = memory.new()
  if lt.C.lt_set(out, t) ~= 0 then errors.fail() end
  fields.set_view_kind(out, fields.VIEW)
  return out
end

-- A shared tensor that a node owns, marked SAVED_ALIAS (the engine frees it after use).
function M.alias(t)
  local a = M.share(t)
  fields.set_view_kind(a, fields.SAVED_ALIAS)
  return a
end

-- The caller's tensor an op is writing into (in place, or out=) while the op records,
-- else nil: an input saved from its storage is overwritten by the op itself.
M.dest = nil

-- The tensor to hold for backward in place of t (an alias for results of recorded ops,
-- see the header), its version, and for an alias the record of t (the node that made it:
-- backward{create_graph = true} connects the alias to it while the formulas run).
function M.save_value(t)
  local src
  if is_recorded(t) then
    src = record(t)
    t = M.alias(t)
  end
  local dest, v = M.dest, nil
  if dest ~= nil and fields.same_storage(dest, t) then
    v = -1
  else
    v = version_of(t)
  end
  remember(t)
  return t, v, src
end

-- Saves the output of the op being recorded (always through an alias: out becomes a
-- key of meta once the node is attached).
function M.save_output(node, field, vfield, out)
  local a = M.alias(out)
  node[field] = a
  node[vfield] = version_of(a)
  remember(a)
  return a
end

-- ---- nodes ------------------------------------------------------------------------------

-- The record of t as an edge: its node or leaf record, or false.
function M.edge(t)
  if is_tracked(t) then return record(t) or false end
  return false
end

-- Makes node the record of out.
function M.attach(out, node)
  set_record(out, node)
  fields.set_autograd_state(out, fields.RECORDED)
  local anomaly = M.anomaly
  if anomaly ~= nil then anomaly.forward(out, node) end
  return out
end

-- The tensor's record lost meaning (its values were overwritten by something that does
-- not depend on tensors that require grad): it becomes a plain tensor again.
function M.clear(t)
  if is_recorded(t) then
    set_record(t, nil)
    fields.set_autograd_state(t, fields.UNTRACKED)
  end
end

-- ---- requires_grad, in-place checks ---------------------------------------------------------

-- Makes t a leaf that requires grad (on), or stops it requiring grad (off; leaves only).
function M.set_requires_grad(t, on)
  if on then
    if is_tracked(t) then return t end
    if not dtype.is_float(fields.dtype_id(t)) then
      errors.raise("requires_grad: only floating point tensors can require gradients, got "
        .. dtype.name(fields.dtype_id(t)))
    end
    if record(t) == nil then set_record(t, {leaf = true}) end
    fields.set_autograd_state(t, fields.LEAF)
  else
    if is_recorded(t) then
      errors.raise("requires_grad: only leaf tensors can stop requiring grad (this one is the result of "
        .. record(t).cls.name .. "); use detach()")
    end
    fields.set_autograd_state(t, fields.UNTRACKED)
  end
  return t
end

-- Raised by the wrappers before an in-place write (or a write into `out`) when grad mode
-- is on and the target or an input has autograd data.
function M.check_inplace(op, out, a, b)
  if fields.autograd_state(out) == fields.LEAF then
    errors.raise(op .. ": a leaf tensor that requires grad cannot be modified in place (or written as out=) while "
      .. "grad mode is on; do it inside lutra.no_grad (as optimizer updates do), or on a detach()ed tensor")
  end
  if fields.view_kind(out) == fields.VIEW
    and (is_tracked(out) or (a ~= nil and is_tracked(a)) or (b ~= nil and is_tracked(b))) then
    errors.raise(op .. ": in-place write into a view that takes part in autograd is not supported; compute the "
      .. "result out of place (e.g. lutra.cat, or x = x + y)")
  end
end

return M
