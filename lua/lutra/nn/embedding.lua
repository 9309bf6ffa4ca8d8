-- nn.Embedding(num_embeddings, embedding_dim, {dtype =, device =}): rows of weight
-- (num, dim) picked by integer ids: ids (...) -> (..., dim). weight starts N(0, 1), as
-- in PyTorch.
local Module = require "lutra.nn.module"
local create = require "lutra.create"
local parameter = require("lutra.nn.parameter").parameter
local F = require "lutra.functional"
local O = require "lutra.nn.options"

local Embedding = Module:extend("Embedding")

function Embedding:init(num, dim, opts)
  opts = O.check("Embedding", opts, {"dtype", "device"})
  self.num_embeddings = O.positive_int("Embedding", "num_embeddings", num)
  self.embedding_dim = O.positive_int("Embedding", "embedding_dim", dim)
  self.weight = parameter(create.normal_(create.empty(num, dim, O.factory(opts)), 0, 1))
end

-- ids (...) integer ids -> the rows of weight they pick (..., dim).
function Embedding:forward(ids) return F.embedding(ids, self.weight) end

function Embedding:extra_repr() return string.format("%d, %d", self.num_embeddings, self.embedding_dim) end

return Embedding
