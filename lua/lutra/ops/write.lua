-- lutra.ops.write — how every op wrapper writes its result, for autograd.
--
-- After the C call, an op whose input has autograd data (fields.is_tracked) while grad mode is on
-- hands its output to the record function its declaration registers (lutra.autograd.op's
-- records, by the op's name: lutra/autograd/elementwise.lua, reduce.lua, nn.lua), which
-- attaches the node. Writing into a given `out` (in-place forms included) is checked first
-- (before_write: S.check_inplace), bumps out's version counter, and is recorded with
-- S.dest = out, so that an input saved from out's storage is known to be overwritten
-- (recording).
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local S = require "lutra.autograd.state"
local fields = require "lutra.tensor.fields"
local is_tracked = fields.is_tracked
local ffi = lt.ffi

local M = {}

local bump, clear = S.bump, S.clear

-- Before writing into a caller's tensor `out` (an in-place op or out=): autograd refuses
-- writes it cannot follow (S.check_inplace raises).
local function before_write(name, out, a, b)
  if S.enabled and (is_tracked(out) or (a ~= nil and is_tracked(a)) or (b ~= nil and is_tracked(b))) then
    S.check_inplace(name, out, a, b)
  end
end
M.before_write = before_write

-- After an op wrote `out` (the caller's `given`, or a new tensor): bumps given's version and
-- says whether to record the op (grad mode on and track: an input requires grad); the caller
-- then calls the op's record and sets S.dest back to nil. Otherwise given's old record is
-- dropped. The record call stays at each op's own site: one target per call site for the JIT.
--   if recording(given, out, is_tracked(a)) then records.clamp(out, a, lo, hi); S.dest = nil end
local function recording(given, out, track)
  if given ~= nil then bump(given) end
  if S.enabled then
    if track then
      S.dest = given
      return true
    elseif given ~= nil then
      clear(out)
    end
  end
  return false
end
M.recording = recording

local raise = errors.raise
local type, istype = type, ffi.istype
local Tensor = ffi.typeof("lt_tensor")

-- Whether x is a lutra tensor.
local function is_tensor(x) return type(x) == "cdata" and istype(Tensor, x) end
M.is_tensor = is_tensor

-- Raises unless out is nil or a tensor.
function M.check_out(op, out)
  if out ~= nil and not is_tensor(out) then raise(op .. ": out must be a tensor, got " .. type(out)) end
end

return M

