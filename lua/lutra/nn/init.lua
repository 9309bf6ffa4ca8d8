-- lutra.nn — modules: the Module base (lutra/nn/module.lua explains declaring
-- parameters and submodules) and the transformer layers, one file each.
--
--   local nn = require "lutra.nn"
--   local fc = nn.Linear(32, 64)              -- weight (64, 32), bias (64)
--   local y = fc(x)                           -- x (..., 32) -> (..., 64)
--   local blk = nn.Block{d_model = 32, n_head = 4, norm = "rmsnorm", mlp = "swiglu", rope = true}
--   print(blk)                                -- the tree with parameter counts
local Module = require "lutra.nn.module"

return {
  Module = Module,
  parameter = require("lutra.nn.parameter").parameter,
  is_parameter = require("lutra.nn.parameter").is_parameter,
  ModuleList = Module.ModuleList,
  is_module = Module.is_module,
  Linear = require "lutra.nn.linear",
  Embedding = require "lutra.nn.embedding",
  LayerNorm = require "lutra.nn.layer_norm",
  RMSNorm = require "lutra.nn.rms_norm",
  Dropout = require "lutra.nn.dropout",
  CausalSelfAttention = require "lutra.nn.attention",
  MLP = require "lutra.nn.mlp",
  SwiGLU = require "lutra.nn.swiglu",
  Block = require "lutra.nn.block",
  state_names = require("lutra.nn.state_dict").state_names,
}
