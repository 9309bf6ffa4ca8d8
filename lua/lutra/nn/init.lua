-- lutra.nn — modules: the Module base (lutra/nn/module.lua explains declaring
-- parameters and submodules), the containers (ModuleList, Sequential, ModuleDict), the
-- activations (GELU, SiLU, ReLU, Tanh, Sigmoid, Identity) and the transformer layers, one file
-- each (a family per file).
--
--   local nn = require "lutra.nn"
--   local fc = nn.Linear(32, 64)              -- weight (64, 32), bias (64)
--   local y = fc(x)                           -- x (..., 32) -> (..., 64)
--   local blk = nn.Block{d_model = 32, n_head = 4, norm = "rmsnorm", mlp = "swiglu", rope = true}
--   print(blk)                                -- the tree with parameter counts
--   local ffn = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))
--   local w = lt.parameter(lt.randn(8, 8))    -- a tensor marked as a parameter (nn.parameter)
local Module = require "lutra.nn.module"
local activation = require "lutra.nn.activation"

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
  MoE = require "lutra.nn.moe",
  Sequential = require "lutra.nn.sequential",
  ModuleDict = require "lutra.nn.module_dict",
  GELU = activation.GELU,
  SiLU = activation.SiLU,
  ReLU = activation.ReLU,
  Tanh = activation.Tanh,
  Sigmoid = activation.Sigmoid,
  Identity = activation.Identity,
  state_names = require("lutra.nn.state_dict").state_names,
}
