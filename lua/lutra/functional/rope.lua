-- lutra.functional.rope — F.rope, rotary position embedding ("rotate half"), its backward (the
-- inverse rotation), and its autograd declaration (RopeBackward). The C side: lt_rope and
-- lt_rope_freq (host/ops/rope.c).
--
--   F.rope(x, positions, rope, out)             -> x rotated; x (B, T, H, D), positions (T),
--                                                  (B, T) or nil (0 .. T-1)
--   F.rope_backward(dout, positions, rope, out) -> dx
--   F.rope_backward_graph(dout, positions, rope) -> dx, recorded (gradients of gradients)
--   F.rope_table(where, rope, half)             -> rope checked, its inv_freq an f64 cpu tensor
--
-- rope is theta (a number, 10000 when nil: frequencies theta^(-2i/D)) or a table
-- {inv_freq =, scale =}: the D/2 frequencies (a list of numbers or an f64 tensor of D/2 on the
-- cpu) that Hugging Face's rope types compute (linear, dynamic, llama3, yarn, longrope), and
-- scale (their attention_scaling, multiplying cos and sin; 1 when nil).
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local ops = require "lutra.ops"
local op = require "lutra.autograd.op"
local U = require "lutra.functional.util"
local ffi, C = lt.ffi, lt.C

local M = {}

local new, fail, raise = memory.new, errors.fail, errors.raise
local need, tensor_or_nil, tracked, writing = U.need, U.tensor_or_nil, U.tracked, U.writing
local edge, attach, save = op.edge, op.attach, op.save
local is_tensor = ops.is_tensor

local record_rope -- the declaration's, below

-- A rope table {inv_freq =, scale =} checked, as a new table whose inv_freq is an f64 cpu tensor
-- (the caller's, or the list copied) and whose scale is a positive number (1 when nil). `where`
-- starts the messages ("rope: rope"); half, when given, is the length inv_freq must have.
function M.rope_table(where, rope, half)
  if type(rope) ~= "table" then raise(where .. " must be a table {inv_freq =, scale =}, got " .. type(rope)) end
  for k in pairs(rope) do
    if k ~= "inv_freq" and k ~= "scale" then
      raise(string.format("%s: unknown key '%s' (inv_freq, scale)", where, tostring(k)))
    end
  end
  local scale, inv = rope.scale == nil and 1.0 or rope.scale, rope.inv_freq
  if type(scale) ~= "number" or not (scale > 0) or scale == math.huge then
    raise(string.format("%s.scale must be a positive number, got %s", where, tostring(scale)))
  end
  if is_tensor(inv) then
    if inv.ndim ~= 1 or inv.dtype ~= "f64" or inv.device ~= "cpu" or (half and inv:size(0) ~= half) then
      raise(string.format("%s.inv_freq must be an f64 cpu tensor of %s numbers, got %s %s [%s]", where,
        half or "D / 2", inv.dtype, inv.device, table.concat(inv.shape, ", ")))
    end
    return {inv_freq = inv, scale = scale}
  end
  if type(inv) ~= "table" or #inv == 0 then
    raise(where .. ".inv_freq must be a list of numbers or an f64 cpu tensor, got " .. type(inv))
  end
  local n = #inv
  if half and n ~= half then raise(string.format("%s.inv_freq has %d numbers, expected %d", where, n, half)) end
  local buf = ffi.new("double[?]", n)
  for i = 1, n do
    local f = inv[i]
    if type(f) ~= "number" or f ~= f or f == math.huge or f == -math.huge then
      raise(string.format("%s.inv_freq[%d] must be a finite number, got %s", where, i, tostring(f)))
    end
    buf[i - 1] = f
  end
  local t = new()
  if C.lt_empty(t, 1, ffi.new("int64_t[1]", n), C.LT_F64, C.LT_DEVICE_CPU) ~= 0 then fail() end
  if C.lt_copy_from_buffer(t, buf, C.LT_F64, n) ~= 0 then fail() end
  return {inv_freq = t, scale = scale}
end
local rope_table = M.rope_table

-- lt_rope or lt_rope_freq as `rope` says; 0 or the C status.
local function rotate(out, x, positions, rope, inverse)
  if rope == nil or type(rope) == "number" then return C.lt_rope(out, x, positions, rope or 10000.0, inverse) end
  if type(rope) ~= "table" then
    raise("rope: rope must be theta (a number) or a table {inv_freq =, scale =}, got " .. type(rope))
  end
  local r = rope_table("rope: rope", rope)
  return C.lt_rope_freq(out, x, positions, r.inv_freq, r.scale, inverse)
end

function M.rope(x, positions, rope, out)
  need("rope", "x", x)
  tensor_or_nil("rope", "positions", positions)
  writing("rope", out, x)
  out = out or new()
  if rotate(out, x, positions, rope, 0) ~= 0 then fail() end
  if tracked(x) then record_rope(out, x, positions, rope or 10000.0) end
  return out
end

function M.rope_backward(dout, positions, rope, out)
  out = out or new()
  if rotate(out, dout, positions, rope, 1) ~= 0 then fail() end
  return out
end
local rope_backward = M.rope_backward

local function rope_node(cls, out, x, positions, rope)
  local node = {edge(x), cls = cls, rope = rope}
  if positions ~= nil then save(node, "positions", positions) end
  attach(out, node)
end

-- The inverse rotation, recorded (RopeBackward's double_backward): its gradient is the rotation.
local record_rope_inverse = op.declare {
  name = "RopeInverseBackward", save = {"positions"}, record = rope_node,
  backward = function(n, g) return M.rope(g, n.positions, n.rope) end,
  twice_differentiable = true,
}

-- F.rope_backward recorded for autograd (the inverse rotation of dout, differentiable again).
function M.rope_backward_graph(dout, positions, rope)
  local dx = rope_backward(dout, positions, rope)
  if tracked(dout) then record_rope_inverse(dx, dout, positions, rope) end
  return dx
end
local rope_backward_graph = M.rope_backward_graph

record_rope = op.declare {
  name = "RopeBackward", op = "rope", save = {"positions"}, record = rope_node,
  backward = function(n, g) return rope_backward(g, n.positions, n.rope) end,
  double_backward = function(n, g) return rope_backward_graph(g, n.positions, n.rope) end,
}

return M
