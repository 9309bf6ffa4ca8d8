-- lutra.lora.hf_names — the Hugging Face module names of a lutra model's modules, as PEFT's
-- adapter files (lutra.lora.peft) and lora.apply's targets ("q_proj", "c_attn") name them.
-- Module names follow Hugging Face's checkpoints of each architecture:
--   lutra                  gpt2 (GPT2LMHeadModel)            llama, qwen2, qwen3, mistral (one naming)
--   blocks.i.attn.qkv      transformer.h.i.attn.c_attn       model.layers.i.self_attn.{q,k,v}_proj
--   blocks.i.attn.proj     transformer.h.i.attn.c_proj       model.layers.i.self_attn.o_proj
--   blocks.i.mlp.fc        transformer.h.i.mlp.c_fc          -
--   blocks.i.mlp.gate/up   -                                 model.layers.i.mlp.gate_proj/up_proj
--   blocks.i.mlp.proj      transformer.h.i.mlp.c_proj        model.layers.i.mlp.down_proj
--   lm_head                lm_head                           lm_head
-- (any other module keeps its lutra name; the map is lutra.hf.weights' when present).
local errors = require "lutra.errors"

local raise = errors.raise

local M = {}

-- The module that holds the layer named `name` (its parent), e.g. the attention of "blocks.0.attn.qkv".
function M.owner_attention(model, name)
  local parent = name:match("^(.*)%.[^.]+$")
  for n, m in model:named_modules() do
    if n == parent then return m end
  end
  raise("lora: no module holds '" .. name .. "'")
end

local GPT2 = {["attn.qkv"] = "attn.c_attn", ["attn.proj"] = "attn.c_proj", ["mlp.fc"] = "mlp.c_fc",
              ["mlp.proj"] = "mlp.c_proj"}
local LLAMA = {["attn.proj"] = "self_attn.o_proj", ["mlp.gate"] = "mlp.gate_proj", ["mlp.up"] = "mlp.up_proj",
               ["mlp.proj"] = "mlp.down_proj"}

-- The Hugging Face family of the model ("gpt2", "llama") or nil: lutra.hf's rule when it is
-- there (by pos, norm and mlp), else the arch.
local function family(model)
  if type(model.cfg) ~= "table" then return nil end
  local ok, hf = pcall(require, "lutra.hf")
  if ok and type(hf) == "table" and hf.family_of then
    local okf, fam = pcall(hf.family_of, model.cfg)
    return okf and fam or nil
  end
  local arch = model.cfg.arch
  return (arch == "llama" or arch == "gpt2") and arch or nil
end
M.family = family

-- lutra module name -> list of {HF module name, first row, rows}, from lutra.hf.weights' weight
-- map when it is there (one source of truth with the model import/export), else the table above.
local function module_map(model, fam)
  local map = {}
  local ok, W = pcall(require, "lutra.hf.weights")
  if ok and type(W) == "table" and W.entries then
    for _, e in ipairs(W.entries(model.cfg, fam)) do
      local lm, hm = e.lt:match("^(.*)%.weight$"), e.hf:match("^(.*)%.weight$")
      if lm and hm then
        map[lm] = map[lm] or {}
        local r = e.rows
        map[lm][#map[lm] + 1] = {hm, r and r[1], r and r[2]}
      end
    end
    return map
  end
  for i = 0, model.cfg.n_layer - 1 do
    local p = "blocks." .. i .. "."
    if fam == "gpt2" then
      for k, v in pairs(GPT2) do map[p .. k] = {{"transformer.h." .. i .. "." .. v}} end
    else
      for k, v in pairs(LLAMA) do map[p .. k] = {{"model.layers." .. i .. "." .. v}} end
      local attn = M.owner_attention(model, p .. "attn.qkv")
      local D = attn.head_dim
      local q, kv = attn.n_head * D, attn.n_kv_head * D
      local base = "model.layers." .. i .. ".self_attn."
      map[p .. "attn.qkv"] = {{base .. "q_proj", 0, q}, {base .. "k_proj", q, kv}, {base .. "v_proj", q + kv, kv}}
    end
  end
  return map
end

-- The Hugging Face module names of a lutra module: a list of {hf name, first row, rows} (rows
-- nil: all of them). qkv of a llama model is three. Modules without one keep their name.
function M.hf_names(model, name)
  local fam = family(model)
  if fam then
    local cache = rawget(model, "_peft_names")
    if cache == nil or cache.fam ~= fam then
      cache = {fam = fam, map = module_map(model, fam)}
      rawset(model, "_peft_names", cache)
    end
    if cache.map[name] then return cache.map[name] end
  end
  return {{name}}
end

return M
