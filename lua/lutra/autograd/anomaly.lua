-- lutra.autograd.anomaly — lutra.detect_anomaly: which op made the first nan or inf, and where.
--
--   lt.detect_anomaly(true)        -- on; returns the previous setting
--   lt.detect_anomaly(false)       -- off (the default)
--   lt.detect_anomaly(fn, ...)     -- fn(...) with it on, the previous setting back after (an error too)
--   lt.is_anomaly_enabled()
--
-- While it is on (as torch.autograd.detect_anomaly, with a forward check added):
-- - forward: the output of every op that autograd records (grad mode on and an input that
--   requires grad: what a training forward runs) is read as it is made; the first that holds a
--   nan or inf raises "FILE:LINE: detect_anomaly: the output of log holds 1 nan and 0 inf (of 4
--   values)", FILE:LINE being the line of the caller's code (the first frame outside lua/lutra/)
--   that ran the op;
-- - each recorded node keeps that line; in backward the first node that returns a gradient
--   holding a nan or inf raises, naming its node class, its op and the forward line that made it.
-- Ops none of whose inputs require grad (inference, no_grad, integer results) are not checked.
-- Each check reads every value of the tensor (a GPU waits for it): a debugging mode, as torch's.
-- Off, what remains is one test of a field per recorded op and per backward node
-- (lutra.autograd.state's `anomaly`, nil), below what bench/autograd.lua can resolve.
--
-- Also here, for the trainer's non-finite checks (lutra/train/nonfinite.lua):
--   anomaly.finite(t)          true when every value of t is finite (one pass, one read back)
--   anomaly.counts(t)          the numbers of nan and inf values of t
local S = require "lutra.autograd.state"
local errors = require "lutra.errors"
local ops = require "lutra.ops"
local dtype = require "lutra.dtype"
local fields = require "lutra.tensor.fields"

local M = {}

local raise = errors.raise
local getinfo, sub, huge = debug.getinfo, string.sub, math.huge
local library_prefix = errors.library_prefix
local prefix_len = #library_prefix

-- fn(...) with grad mode off: the checks' own ops are not recorded (nor checked).
local function untracked(fn, ...)
  if not S.enabled then return fn(...) end
  return errors.with_field(S, "enabled", false, fn, ...)
end

-- sum(t * 0) is 0 when every value is finite and nan when one is not (nan * 0 and inf * 0 are nan).
local function finite_untracked(t)
  local z = ops.mul(t, 0)
  local s = z:sum()
  local v = s:item()
  z:free()
  s:free()
  return v == v
end

function M.finite(t)
  if not dtype.is_float(fields.dtype_id(t)) then return true end
  return untracked(finite_untracked, t)
end

local function count_untracked(t)
  local isnan = t:ne(t)
  local n = isnan:float():sum():item()
  local isinf = t:abs():eq(huge)
  local i = isinf:float():sum():item()
  return n, i
end

-- The numbers of nan and inf values of t.
function M.counts(t)
  if not dtype.is_float(fields.dtype_id(t)) then return 0, 0 end
  return untracked(count_untracked, t)
end

local function describe(t)
  local n, i = M.counts(t)
  return string.format("%d nan and %d inf (of %d values)", n, i, fields.numel(t))
end

-- "FILE:LINE" of the first frame outside lutra's own files (the caller's code that ran the op).
local function user_line()
  local level = 3
  while true do
    local info = getinfo(level, "Sl")
    if not info then return "?" end
    if info.what ~= "C" and sub(info.source, 1, prefix_len) ~= library_prefix then
      local src = info.source
      if sub(src, 1, 1) == "@" then src = sub(src, 2) else src = info.short_src end
      return src .. ":" .. tostring(info.currentline)
    end
    level = level + 1
  end
end

local unary_names = {} -- op code -> name, for the in-place unary node (its op field is the code)
for name, code in pairs(ops.UNARY) do unary_names[code] = name end

-- The op a node records ("log", "cross_entropy"), else its class name without "Backward".
local function op_name(node)
  local cls = node.cls
  if cls.op then return cls.op end
  if type(node.op) == "number" and unary_names[node.op] then return unary_names[node.op] end
  return (cls.name:gsub("Backward$", ""))
end

-- Forward: out was just made by the op of node (lutra.autograd.state.attach).
local function check_forward(out, node)
  node.forward_line = user_line()
  if M.finite(out) then return end
  S.dest = nil -- the op is abandoned: the write it was recording is no longer in flight
  raise(string.format("detect_anomaly: the output of %s holds %s", op_name(node), describe(out)))
end

-- Backward: the gradients node's backward formula returned (values, or one list).
local function check_backward(node, g1, g2, g3, delivered)
  local list = (type(g1) == "table" and g1 ~= delivered) and g1 or {g1, g2, g3}
  for i = 1, table.maxn(list) do
    local g = list[i]
    if g ~= nil and g ~= delivered and ops.is_tensor(g) and not M.finite(g) then
      local cls = node.cls
      raise(string.format("detect_anomaly: %s (the backward of %s, from the forward at %s) returned a gradient "
        .. "for its input %d that holds %s", cls.name, op_name(node), node.forward_line or "? (recorded before "
        .. "detect_anomaly was on)", i, describe(g)))
    end
  end
end

local CHECKS = {forward = check_forward, backward = check_backward}

function M.is_enabled() return S.anomaly ~= nil end

-- detect_anomaly(on) -> the previous setting; detect_anomaly(fn, ...) -> what fn returns.
function M.detect_anomaly(on, ...)
  local t = type(on)
  local mt = t == "table" and getmetatable(on)
  if t == "function" or (mt and mt.__call) then
    return errors.with_field(S, "anomaly", CHECKS, on, ...)
  end
  if t ~= "boolean" then
    raise("detect_anomaly: expected true, false or a function to run with it on, got " .. t)
  end
  local was = S.anomaly ~= nil
  S.anomaly = on and CHECKS or nil
  return was
end

return M
