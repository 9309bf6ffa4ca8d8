-- hf_model_fixtures.lua — what the tests over tests/hf/fixtures/models share (not a test file
-- itself): the fixture names, each one's expected logits, and the logits of a model.
--   local fx = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "hf_model_fixtures.lua")
local lt = require "lutra"
local st = require "lutra.ckpt.safetensors"

local M = {}

local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/lua/[^/]*$")) or "."
M.dir = root .. "/tests/hf/fixtures/models"

-- every model tests/hf/gen_models.py writes
M.NAMES = {"gpt2", "gpt2_bf16_untied", "llama", "llama_linear", "llama_dynamic", "llama_llama3", "llama_yarn",
           "llama_longrope", "llama_bias_headdim_sharded", "qwen2", "qwen2_sliding", "qwen3", "qwen3_bias_bf16",
           "mistral_window", "smollm2", "llama_v4_config", "mixtral", "qwen2_moe", "qwen3_moe"}

-- max |a - b| / max |b| over every element (b: the reference), on the CPU in f64
function M.rel_diff(a, b)
  local a64, b64 = a:cpu():to("f64"), b:cpu():to("f64")
  return (a64 - b64):abs():max():item() / math.max(b64:abs():max():item(), 1e-300)
end

-- the tensors of a fixture's expected.safetensors (ids, logits, ...), by name
function M.expected(name)
  local r = st.open(M.dir .. "/" .. name .. "/expected.safetensors")
  local out = {}
  for k in pairs(r.tensors) do out[k] = r:load(k) end
  r:close()
  return out
end

-- The logits of ids (B, T); through a key/value cache when T passes block_size (RoPE models may
-- run past it, as transformers does).
function M.logits_of(model, ids)
  return lt.no_grad(function()
    local B, Tn = ids:size(0), ids:size(1)
    if Tn > model.cfg.block_size then return model(ids, nil, {cache = model:kv_cache(B, Tn)}) end
    return model(ids)
  end)
end

return M
