-- lutra.functional.embedding — F.embedding (rows of a table by index), its backward, and its
-- autograd declaration (EmbeddingBackward). The C side: lt_embedding_forward /
-- lt_embedding_backward (host/ops/embedding.c).
--
--   F.embedding(ids, weight, out)              -> weight[ids] (..., C)
--   F.embedding_backward(dout, ids, weight)    -> dweight, shaped like weight (a tensor or a {V, C} list)
--
-- Under autocast (lutra.autocast) the f32 rows it picks are cast.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local ops = require "lutra.ops"
local dtype = require "lutra.dtype"
local op = require "lutra.autograd.op"
local U = require "lutra.functional.util"
local fields = require "lutra.tensor.fields"
local shape_of = require("lutra.autograd.util").shape_of
local AC = require "lutra.autocast"
local C = lt.C

local M = {}

local new, fail = memory.new, errors.fail
local need, tracked, writing = U.need, U.tracked, U.writing
local edge, attach, save = op.edge, op.attach, op.save
local is_tensor = ops.is_tensor
local low = AC.low

local record_embedding -- the declaration's, below

function M.embedding(ids, weight, out)
  need("embedding", "ids", ids)
  need("embedding", "weight", weight)
  writing("embedding", out, weight)
  local cast = AC.dtype ~= nil and out == nil
  out = out or new()
  if C.lt_embedding_forward(out, weight, ids) ~= 0 then fail() end
  if tracked(weight) then record_embedding(out, ids, weight) end
  if cast and fields.dtype_id(out) == dtype.F32 then
    local rows = out
    out = low(rows)
    rows:free() -- the f32 rows: the cast's record does not need them
  end
  return out
end

-- dweight (V, C) shaped like `weight` (a tensor, or a {V, C} shape list).
function M.embedding_backward(dout, ids, weight)
  local dweight
  if is_tensor(weight) then
    dweight = require("lutra.create").zeros_like(weight, {dtype = dtype.name(fields.dtype_id(dout))})
  else
    dweight = require("lutra.create").zeros(weight, {dtype = dtype.name(fields.dtype_id(dout)),
      device = dtype.device_name(fields.device_id(dout))})
  end
  if C.lt_embedding_backward(dweight, dout, ids) ~= 0 then fail() end
  return dweight
end
local embedding_backward = M.embedding_backward

record_embedding = op.declare {
  name = "EmbeddingBackward", op = "embedding", save = {"ids"},
  record = function(cls, out, ids, weight)
    local node = {edge(weight), cls = cls, wshape = shape_of(weight)}
    save(node, "ids", ids)
    attach(out, node)
  end,
  backward = function(n, g) return embedding_backward(g, n.ids, n.wshape) end,
  double_backward = function(n, g) -- the rows of g added at ids into zeros, recorded (index_add)
    local c = n.wshape[2]
    local z = require("lutra.create").zeros(n.wshape, {dtype = g.dtype, device = g.device})
    return require("lutra.functional.index_select").index_add(z, 0, n.ids:reshape(-1), g:reshape(-1, c))
  end,
}

return M
