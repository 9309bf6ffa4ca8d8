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
-- {model = the model's config}) and tokenizer.json. Both get the chat template where transformers
-- reads it: chat_template.jinja and tokenizer_config.json's chat_template (AutoTokenizer's
-- chat_template is then the same text). load also reads either format whatever is installed, and
-- a trainer checkpoint (manifest.json with the recipe's config.model; the tokenizer then comes
-- from opts.tokenizer, a tokenizer.json path).
--
-- The chat template (info.template) is opts.template when given (a name of lutra's, or a
-- template); else the directory's (chat_template.jinja, else tokenizer_config.json's
-- chat_template, else chat_template.json): lutra's own template when the text is one of lutra's,
-- else the model's own Jinja template, run by lutra.jinja (lutra.sft.hf_template); else, with no
-- template declared, llama3 for a tokenizer with <|eot_id|> and chatml otherwise. A template
-- lutra.jinja cannot run is an error naming the file and line, before the weights load.
local atomic_file = require "lutra.atomic_file"
local errors = require "lutra.errors"
local models = require "lutra.models"
local ckpt = require "lutra.ckpt"
local tokenizer = require "lutra.tokenizer"
local templates = require "lutra.sft.templates"
local hf_template = require "lutra.sft.hf_template"

local raise = errors.raise

local M = {}

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

-- Writes the template where transformers reads it: chat_template.jinja, and the chat_template
-- field of tokenizer_config.json (the file's other fields kept; a Jinja template's special tokens
-- added where the file has none).
local function write_template(dir, t)
  local json = require "lutra.json"
  local text = t.kind == "jinja" and t.source or templates.builtin[t.name].jinja
  local ok, err = atomic_file.write(dir .. "/chat_template.jinja", text)
  if not ok then errors.raise("save: " .. err) end
  local path = dir .. "/tokenizer_config.json"
  local cfg = exists(path) and json.read_file(path) or {}
  if type(cfg) ~= "table" or json.is_array(cfg) then cfg = {} end
  cfg.chat_template = text
  for k, v in pairs(t.special_tokens_map or {}) do
    if cfg[k] == nil then cfg[k] = v end
  end
  json.write_file(path, cfg, {indent = 2})
  if t.kind ~= "jinja" then -- lutra's record of its own template (transformers' tokenizers do not read it)
    json.write_file(dir .. "/chat_template.json", {lutra_template = t.name, chat_template = text}, {indent = 2})
  end
end

-- save(dir, model, tok, {template =, format = "hf" | "lutra"}) -> dir
function M.save(dir, model, tok, opts)
  opts = opts or {}
  local template = templates.get(opts.template)
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
  write_template(dir, template)
  return dir
end

-- The chat templates a directory declares, in the order transformers prefers them:
-- chat_template.jinja, tokenizer_config.json's chat_template (a text, or the "default" of a list
-- of {name =, template =}), then chat_template.json (lutra's record: lutra_template, the name of
-- one of lutra's templates, and chat_template, its Jinja text). Each: {file =, what =, text =,
-- name = lutra's template when the text is one of lutra's own}.
local function declared_templates(dir)
  local json = require "lutra.json"
  local found = {}
  local function jinja(file, text, what)
    if type(text) ~= "string" then
      raise(string.format("modeldir.load: %s: %s is not a text (a Jinja template)", file, what))
    end
    found[#found + 1] = {file = file, text = text, name = templates.recognise(text), what = what}
  end
  local path = dir .. "/chat_template.jinja"
  if exists(path) then
    local f = assert(io.open(path, "rb"))
    jinja(path, f:read("*a"), "the template")
    f:close()
  end
  local cfg
  path = dir .. "/tokenizer_config.json"
  if exists(path) then
    cfg = json.read_file(path)
    if type(cfg) ~= "table" or json.is_array(cfg) then raise("modeldir.load: " .. path .. " must hold a JSON object") end
    local ok, text = pcall(hf_template.config_template, path, cfg)
    if not ok then raise("modeldir.load: " .. tostring(text):gsub("^[^\n]-:%d+: ", "")) end
    if text then jinja(path, text, "chat_template") end
  end
  path = dir .. "/chat_template.json"
  if exists(path) then
    local t = json.read_file(path)
    if type(t) ~= "table" or json.is_array(t) then raise("modeldir.load: " .. path .. " must hold a JSON object") end
    if t.lutra_template ~= nil then
      if not templates.builtin[t.lutra_template] then
        raise(string.format("modeldir.load: %s: lutra_template %s is not one of lutra's templates (%s)", path,
          json.encode(t.lutra_template), templates.names()))
      end
      found[#found + 1] = {file = path, name = t.lutra_template, what = "lutra_template"}
    elseif t.chat_template ~= nil and t.chat_template ~= json.null then
      jinja(path, t.chat_template, "chat_template")
    end
  end
  return found, cfg
end

-- The chat template the directory declares (each file that declares one must declare the same),
-- or nil: the name of lutra's template when the text is one of lutra's own (templates.recognise),
-- else the model's own Jinja template (lutra.sft.hf_template, compiled: a template lutra.jinja
-- cannot run stops here, naming its file and line).
local function declared_template(dir)
  local found, cfg = declared_templates(dir)
  local chosen = found[1]
  for _, d in ipairs(found) do
    if (d.name or d.text) ~= (chosen.name or chosen.text) then
      raise(string.format("modeldir.load: %s declares %s as %s but %s declares %s; pick one with --template=NAME",
        chosen.file, chosen.what, chosen.name or "a Jinja template of its own", d.file,
        d.name or "another Jinja template"))
    end
  end
  if chosen == nil then return nil end
  if chosen.name then return chosen.name end
  return hf_template.new(chosen.text, {file = chosen.file, special_tokens = cfg and hf_template.special_tokens(cfg) or {}})
end

-- The model of a checkpoint: its config.model (the model's config, or a recipe's model part)
-- with the vocabulary size of its weights, and the weights assembled whole from any layout.
local function checkpoint_model(dir, opts)
  local st = ckpt.load_weights(dir)
  local m = type(st.config) == "table" and st.config.model
  if type(m) ~= "table" or st.model["wte.weight"] == nil then
    raise("modeldir.load: " .. dir .. ": no model config in this checkpoint")
  end
  local cfg = models.recipe_keys(m)
  cfg.vocab_size = st.model["wte.weight"]:size(0)
  local model = models.build(models.config(cfg))
  model:load_state_dict(st.model, {source = dir, allow_cast = opts.allow_cast, allow_nonfinite = opts.allow_nonfinite})
  return model
end

-- load(dir, {tokenizer = path, template = name, allow_cast =, allow_nonfinite =, ignore_keys =})
--   (ignore_keys: config.json keys to accept, a list or "KEY,KEY" as --ignore-key gives them)
--   -> model, tok, {template =, format =} (the weights' dtype and values as lutra.ckpt.weight_checks says)
function M.load(dir, opts)
  opts = opts or {}
  if type(dir) ~= "string" then raise("modeldir.load: expected a directory, got " .. type(dir)) end
  -- the template first: a directory whose template lutra cannot run stops before its weights load
  local template = opts.template or declared_template(dir)
  local model, tok, format
  if exists(dir .. "/config.json") then
    local hf = hf_module()
    if not hf then raise("modeldir.load: " .. dir .. " is a Hugging Face directory but lutra.hf is not available") end
    model, tok = hf.load_pretrained(dir, {allow_cast = opts.allow_cast, allow_nonfinite = opts.allow_nonfinite,
                                          ignore_keys = opts.ignore_keys})
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
  if template == nil then template = tok and tok:token_id("<|eot_id|>") and "llama3" or templates.default end
  return model, tok, {template = template, format = format}
end

return M
