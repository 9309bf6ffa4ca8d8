-- lutra.lora.tp_peft — lora.save and lora.load on a tensor-parallel model (one whose LoRA
-- layers are lutra.lora.tp's): PEFT's files (lutra.lora.peft) of the whole adapters, gathered
-- over the model's tp group to save, cut into each rank's pieces on load.
local create = require "lutra.create"
local grad = require "lutra.nn.grad"
local errors = require "lutra.errors"
local L = require "lutra.dist.tp_layers"
local tp = require "lutra.dist.tp"
local linear = require "lutra.lora.linear"
local lora_tp = require "lutra.lora.tp"
local peft = require "lutra.lora.peft"
local peft_config = require "lutra.lora.peft_config"

local layers, linear_of, is_parallel = linear.layers, lora_tp.linear_of, lora_tp.is_parallel
local Column = lora_tp.ColumnParallelLoRALinear

local M = {}

local function shape_of(t)
  local s = {}
  for i = 1, t.ndim do s[i] = t:size(i - 1) end
  return s
end

-- lora.save on a tensor-parallel model: each layer's adapters gathered (collectives over
-- the model's tp group: every rank of it calls this, in the same order), the full ones put
-- in place of the pieces while tp rank 0 writes PEFT's files, then the pieces back. With
-- data parallelism one replica's tp ranks call it (mesh.dp_rank == 0): each tp rank 0 writes.
-- The Hugging Face names come from the model's config (global shapes and rows).
function M.save(dir, model, opts)
  local cfg = rawget(model, "_lora") or {}
  if (cfg.bias or "none") ~= "none" or cfg.modules_to_save then
    errors.raise("lora.save: a tensor-parallel model's biases and modules_to_save (bias = \"" .. tostring(cfg.bias)
      .. "\") are not gathered by lutra: save before tp.parallelize")
  end
  local group = tp.group(model)
  local swapped = {}
  for _, l in ipairs(layers(model)) do
    local m = l[2]
    if is_parallel(m) then
      local A, B = tp.gather(model, m.lora_A.weight), tp.gather(model, m.lora_B.weight)
      swapped[#swapped + 1] = {m, m.lora_A, m.lora_B}
      rawset(m, "lora_A", linear_of(A))
      rawset(m, "lora_B", linear_of(B))
    end
  end
  local ok, err = true, nil
  if group == nil or group.rank == 0 then ok, err = pcall(peft.save, dir, model, opts) end
  for _, s in ipairs(swapped) do
    rawset(s[1], "lora_A", s[2])
    rawset(s[1], "lora_B", s[3])
  end
  if group ~= nil then group:barrier() end -- (the files are there when it returns)
  if not ok then error(err, 0) end
  return dir
end

-- lora.load into a tensor-parallel model: each layer is given full-size adapters (zeros, the
-- global in / out features) for lutra.lora.peft.load to fill, then this rank's pieces are
-- copied into its own tensors (no collective: every rank reads the files). The file's row
-- blocks must be the layer's (else: load before tp.parallelize).
function M.load(dir, model, opts)
  local conf = peft_config.read(dir .. "/adapter_config.json")
  local function refuse(field, value)
    errors.raise(string.format("lora.load: %s: %s = %s: lutra loads it into the full model only (before "
      .. "tp.parallelize)", conf.path, field, value))
  end
  if conf.bias ~= "none" then refuse("bias", '"' .. conf.bias .. '"') end
  if conf.modules_to_save then refuse("modules_to_save", "[" .. table.concat(conf.modules_to_save, ", ") .. "]") end
  if conf.dora then refuse("use_dora", "true") end
  local saved = {}
  for _, l in ipairs(layers(model)) do
    local m = l[2]
    if is_parallel(m) then
      local A, B = m.lora_A.weight, m.lora_B.weight
      local column = getmetatable(m) == Column
      local ga = column and shape_of(A) or {A:size(0), m.global_in_features}
      local gb = column and {m.global_out_features, B:size(1)} or shape_of(B)
      local like = {dtype = A.dtype, device = A.device}
      saved[#saved + 1] = {name = l[1], m = m, A = m.lora_A, B = m.lora_B, inf = m.in_features, outf = m.out_features,
                           mask = rawget(m, "_mask"), blocks = rawget(m, "blocks"), column = column, ga = ga, gb = gb}
      rawset(m, "lora_A", linear_of(create.zeros(ga, like)))
      rawset(m, "lora_B", linear_of(create.zeros(gb, like)))
      rawset(m, "in_features", ga[2])
      rawset(m, "out_features", gb[1])
    end
  end
  local ok, err = pcall(peft.load, dir, model, opts)
  local bad
  grad.no_grad(function()
    for _, s in ipairs(saved) do
      local m = s.m
      local A, B = m.lora_A.weight, m.lora_B.weight
      local same = A:size(0) == s.ga[1] and B:size(1) == s.gb[2] and rawequal(rawget(m, "blocks"), s.blocks)
      if ok and same then
        if s.column then
          s.A.weight:copy_(A)
          s.B.weight:copy_(L.take(B, 0, m.pieces))
        else
          s.A.weight:copy_(L.take(A, 1, m.pieces))
          s.B.weight:copy_(B)
        end
      elseif ok and not bad then
        bad = s.name
      end
      rawset(m, "lora_A", s.A)
      rawset(m, "lora_B", s.B)
      rawset(m, "in_features", s.inf)
      rawset(m, "out_features", s.outf)
      rawset(m, "_mask", s.mask)
      rawset(m, "blocks", s.blocks)
    end
  end)
  if not ok then error(err, 0) end
  if bad then
    errors.raise("lora.load: " .. dir .. ": the adapters of '" .. bad .. "' are split in other row blocks than "
      .. "this tensor-parallel layer's: load them into the full model, before tp.parallelize")
  end
  return model
end

return M
