-- lutra.sft.modeldir — a model directory: weights, architecture, tokenizer and chat template
-- in one place, written by recipes (pretrain, sft) and read by `lutra chat` / `generate`.
--
--   local modeldir = require "lutra.sft.modeldir"
--   modeldir.save("runs/sft/model", model, tok, {template = "chatml"})
--   local model, tok, info = modeldir.load("runs/sft/model")   -- info.template, info.format
--
-- With lutra.hf (Hugging Face's layout: config.json, model.safetensors, tokenizer.json) the
-- directory is written by hf.save_pretrained and read by hf.load_pretrained; without it, in
-- lutra's own format: lutra_model/ (a checkpoint, lutra.ckpt.save_weights, with config =
-- {model = the model's config}) and tokenizer.json. Both get chat_template.json:
-- {"lutra_template": name, "chat_template": Jinja text for other tools}. load also reads
-- either format whatever is installed, and a trainer checkpoint (manifest.json with the
-- recipe's config.model; the tokenizer then comes from opts.tokenizer, a tokenizer.json path).
local errors = require "lutra.errors"
local models = require "lutra.models"
local ckpt = require "lutra.ckpt"
local tokenizer = require "lutra.tokenizer"
local templates = require "lutra.sft.templates"

local raise = errors.raise

local M = {}

local JINJA = {
  chatml = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    .. "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
  llama3 = "{{ '<|begin_of_text|>' }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    .. "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    .. "{% if add_generation_prompt %}"
    .. "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
}

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

local function hf_module()
  local ok, hf = pcall(require, "lutra.hf")
  if ok and type(hf) == "table" and hf.save_pretrained and hf.load_pretrained then return hf end
  return nil
end

local function write_template(dir, name)
  local json = require "lutra.json"
  json.write_file(dir .. "/chat_template.json", {lutra_template = name, chat_template = JINJA[name]}, {indent = 2})
end

-- save(dir, model, tok, {template =, format = "hf" | "lutra"}) -> dir
function M.save(dir, model, tok, opts)
  opts = opts or {}
  local name = templates.get(opts.template).name
  os.execute("mkdir -p '" .. dir .. "'")
  local hf = opts.format ~= "lutra" and hf_module()
  local saved = false
  if hf then
    local ok, err = pcall(hf.save_pretrained, dir, model, tok)
    if not ok and opts.format == "hf" then error(err, 0) end
    if not ok then -- (a model hf does not describe yet): lutra's own format, said out loud
      io.stderr:write("modeldir: lutra.hf cannot save this model (" .. tostring(err) .. "); saving in lutra's format\n")
      os.remove(dir .. "/config.json")
    end
    saved = ok
  elseif opts.format == "hf" then
    raise("modeldir.save: lutra.hf is not available")
  end
  if not saved then
    ckpt.save_weights(dir .. "/lutra_model", model:state_dict(), {model = model.cfg})
    tok:save(dir .. "/tokenizer.json")
  end
  write_template(dir, name)
  return dir
end

local function template_of(dir, tok)
  if exists(dir .. "/chat_template.json") then
    local ok, t = pcall(function() return require("lutra.json").read_file(dir .. "/chat_template.json") end)
    if ok and type(t) == "table" and templates.builtin[t.lutra_template] then return t.lutra_template end
  end
  if tok and tok:token_id("<|eot_id|>") then return "llama3" end
  return templates.default
end

-- The model of a checkpoint: its config.model (the model's config, or a recipe's model part)
-- with the vocabulary size of its weights, and the weights assembled whole from any layout.
local function checkpoint_model(dir, opts)
  local st = ckpt.load_weights(dir)
  local m = type(st.config) == "table" and st.config.model
  if type(m) ~= "table" or st.model["wte.weight"] == nil then
    raise("modeldir.load: " .. dir .. ": no model config in this checkpoint")
  end
  local known, cfg = {}, {}
  for _, k in ipairs(models.keys) do known[k] = true end
  for k, v in pairs(m) do
    if known[k] and not (k == "n_kv_head" and v == 0) then cfg[k] = v end -- 0: as many as n_head
  end
  cfg.vocab_size = st.model["wte.weight"]:size(0)
  local model = models.build(models.config(cfg))
  model:load_state_dict(st.model, {source = dir, allow_cast = opts.allow_cast, allow_nonfinite = opts.allow_nonfinite})
  return model
end

-- load(dir, {tokenizer = path, allow_cast =, allow_nonfinite =}) -> model, tok, {template =, format =}
-- (the weights' dtype and values as lutra.ckpt.weight_checks says)
function M.load(dir, opts)
  opts = opts or {}
  if type(dir) ~= "string" then raise("modeldir.load: expected a directory, got " .. type(dir)) end
  local model, tok, format
  if exists(dir .. "/config.json") then
    local hf = hf_module()
    if not hf then raise("modeldir.load: " .. dir .. " is a Hugging Face directory but lutra.hf is not available") end
    model, tok = hf.load_pretrained(dir, {allow_cast = opts.allow_cast, allow_nonfinite = opts.allow_nonfinite})
    format = "hf"
  elseif exists(dir .. "/lutra_model/manifest.json") or exists(dir .. "/lutra_model/manifest.lua") then
    model, format = checkpoint_model(dir .. "/lutra_model", opts), "lutra"
    tok = tokenizer.load(dir .. "/tokenizer.json")
  elseif exists(dir .. "/manifest.json") or exists(dir .. "/manifest.lua") then
    model, format = checkpoint_model(dir, opts), "checkpoint" -- a trainer checkpoint
    local tok_path = opts.tokenizer or (exists(dir .. "/tokenizer.json") and dir .. "/tokenizer.json")
    if not tok_path then raise("modeldir.load: a checkpoint without tokenizer.json: pass its tokenizer") end
    tok = tokenizer.load(tok_path)
  else
    raise("modeldir.load: " .. dir .. " is not a model directory (no config.json, lutra_model/ or manifest.json)")
  end
  return model, tok, {template = opts.template or template_of(dir, tok), format = format}
end

return M
