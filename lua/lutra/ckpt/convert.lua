-- lutra.ckpt.convert — `lutra convert SRC DST`: between lutra's checkpoints and Hugging Face
-- directories (config.json + model.safetensors + tokenizer.json), for gpt2 and llama.
--
--   lutra convert runs/x DST            the run's latest checkpoint (runs/x/ckpt/latest) -> HF dir
--   lutra convert runs/x/ckpt/step_000200 DST   one checkpoint -> HF dir
--   lutra convert HF_DIR DST            HF dir -> a lutra checkpoint (model weights, config; no optimizer)
--
-- The direction comes from SRC: a directory with config.json is Hugging Face's, one with
-- manifest.json (or ckpt/latest, or lutra_model/) is lutra's. The model's shape comes from the
-- checkpoint's config (config.model, as recipes save it) checked against its weights.
local atomic_file = require "lutra.atomic_file"
local errors = require "lutra.errors"
local json = require "lutra.json"
local models = require "lutra.models"
local ckpt = require "lutra.ckpt"
local hf = require "lutra.hf"

local raise = errors.raise

local M = {}

M.USAGE = [[usage: lutra convert SRC DST [options]

Converts between lutra checkpoints and Hugging Face model directories (gpt2, llama).
  SRC a lutra checkpoint (a dir with manifest.json), a run dir (its ckpt/latest), a model
      dir in lutra's format (lutra_model/)   ->  DST a Hugging Face dir: config.json,
      model.safetensors (or shards + model.safetensors.index.json), tokenizer.json
  SRC a Hugging Face dir (config.json)     ->  DST a lutra checkpoint (weights and config,
      no optimizer state; tokenizer.json copied next to manifest.json)
  The tokenizer's companions (tokenizer_config.json, chat_template.jinja, chat_template.json,
  special_tokens_map.json, generation_config.json) travel with tokenizer.json both ways.
Options:
  --tokenizer=PATH        tokenizer.json for a checkpoint without one (default: found in the
                          checkpoint, the run dir's model/, or config.tokenizer)
  --dtype=f32|bf16|f16|f64  dtype of the exported weights (default: the model's)
  --max-shard-size=SIZE   shard the safetensors above SIZE bytes (suffixes K, M, G: 2G)
  --ignore-key=KEY        accept an unknown config.json key (repeatable)
  --cast                  load weights stored in a narrower float dtype than the model's
                          (bf16, f16 -> f32; lossless): refused without it
  --force                 write into a DST that exists and is not empty
  -h, --help              this text
]]

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

local function is_dir(path)
  local ok = os.rename(path, path) -- true for anything that exists
  return ok and exists(path .. "/.") or false
end

local function non_empty_dir(path)
  local p = io.popen("ls -A '" .. path:gsub("'", "'\\''") .. "' 2>/dev/null")
  if not p then return false end
  local first = p:read("*l")
  p:close()
  return first ~= nil
end

local function dirname(p) return p:match("^(.*)/[^/]+/*$") or "." end

-- The files beside tokenizer.json that a model directory's tokenizer and chat template live in
-- (transformers reads the special tokens and the template from them): carried both ways as they are.
local TOKENIZER_FILES = {"tokenizer_config.json", "chat_template.jinja", "chat_template.json",
                         "special_tokens_map.json", "generation_config.json"}

-- Copies TOKENIZER_FILES found in directory `from` to `to`, each byte as it is (a file of that name
-- already in `to`, with --force, is replaced); returns how many.
local function copy_tokenizer_files(from, to)
  local n = 0
  for _, name in ipairs(TOKENIZER_FILES) do
    local src, dst = from .. "/" .. name, to .. "/" .. name
    if exists(src) then
      local f = assert(io.open(src, "rb"))
      local bytes = f:read("*a")
      f:close()
      local ok, err = atomic_file.write(dst, bytes)
      if not ok then raise("convert: " .. err) end
      n = n + 1
    end
  end
  return n
end

local function parse_size(s)
  local n, unit = tostring(s):match("^(%d+%.?%d*)([KMGkmg]?)[Bb]?$")
  if not n or tonumber(n) <= 0 then error("bad size", 0) end
  local mult = ({[""] = 1, k = 1e3, m = 1e6, g = 1e9})[unit:lower()]
  return math.floor(tonumber(n) * mult)
end

-- Options and the two positional words; returns nil, status for --help and usage errors.
local function parse(words)
  local opts, pos = {ignore_keys = {}}, {}
  for _, w in ipairs(words) do
    local key, value = w:match("^%-%-([%w%-]+)=(.*)$")
    key = key or w:match("^%-%-([%w%-]+)$")
    if w == "-h" or w == "--help" then
      io.stdout:write(M.USAGE)
      return nil, 0
    elseif key == "tokenizer" and value then
      opts.tokenizer = value
    elseif key == "dtype" and value then
      if not ({f32 = true, bf16 = true, f16 = true, f64 = true})[value] then
        io.stderr:write("lutra convert: --dtype must be f32, bf16, f16 or f64, got '", value, "'\n")
        return nil, 2
      end
      opts.dtype = value
    elseif key == "max-shard-size" and value then
      local ok, n = pcall(parse_size, value)
      if not ok then
        io.stderr:write("lutra convert: --max-shard-size: expected a size such as 500M or 2G, got '", value, "'\n")
        return nil, 2
      end
      opts.max_shard_size = n
    elseif key == "ignore-key" and value then
      opts.ignore_keys[#opts.ignore_keys + 1] = value
    elseif key == "force" and not value then
      opts.force = true
    elseif key == "cast" and not value then
      opts.cast = true
    elseif w:sub(1, 1) == "-" and w ~= "-" then
      io.stderr:write("lutra convert: unknown option '", w, "'\n", M.USAGE)
      return nil, 2
    else
      pos[#pos + 1] = w
    end
  end
  if #pos ~= 2 then
    io.stderr:write("lutra convert: expected SRC and DST, got ", #pos, " argument", #pos == 1 and "" or "s", "\n", M.USAGE)
    return nil, 2
  end
  return opts, pos[1], pos[2]
end

-- lutra's model config for a checkpoint's state dict: the saved config (config.model as recipes
-- save it, or a complete model config) with the sizes the weights imply.
function M.model_config(saved, sd, source)
  local src = saved
  if type(src) == "table" and src.arch == nil and type(src.model) == "table" then src = src.model end
  if type(src) ~= "table" or src.arch == nil then
    raise("convert: " .. source .. ": no model config in the checkpoint (config.model.arch)")
  end
  local cfg = models.recipe_keys(src)
  local wte = sd["wte.weight"]
  if wte == nil then raise("convert: " .. source .. ": the checkpoint's model has no wte.weight") end
  cfg.vocab_size, cfg.d_model = wte:size(0), wte:size(1)
  local n = 0
  while sd["blocks." .. n .. ".ln_1.weight"] do n = n + 1 end
  cfg.n_layer = n
  if sd["wpe.weight"] then cfg.block_size = sd["wpe.weight"]:size(0) end
  local fc = sd["blocks.0.mlp.fc.weight"] or sd["blocks.0.mlp.gate.weight"]
  if fc then cfg.ffn_hidden = fc:size(0) end
  local qkv = sd["blocks.0.attn.qkv.weight"]
  if qkv and cfg.n_head then
    local D = cfg.head_dim or cfg.d_model / cfg.n_head
    cfg.n_kv_head = (qkv:size(0) / D - cfg.n_head) / 2
  end
  cfg.dtype = wte.dtype
  return models.config(cfg)
end

local function find_tokenizer(opts, ckpt_dir, saved)
  if opts.tokenizer then
    if not exists(opts.tokenizer) then raise("convert: --tokenizer " .. opts.tokenizer .. " not found") end
    return opts.tokenizer
  end
  local run_dir = dirname(dirname(ckpt_dir))
  local candidates = {ckpt_dir .. "/tokenizer.json", dirname(ckpt_dir) .. "/tokenizer.json",
                      run_dir .. "/model/tokenizer.json", run_dir .. "/tokenizer.json"}
  if type(saved) == "table" and type(saved.tokenizer) == "string" and saved.tokenizer:match("%.json$") then
    table.insert(candidates, 1, saved.tokenizer)
  end
  for _, c in ipairs(candidates) do
    if exists(c) then return c end
  end
end

-- The lutra checkpoint directory SRC stands for, or nil. A single-process checkpoint
-- (manifest.lua) is returned as one, so that loading it says why it is not read.
local function lutra_source(src)
  if exists(src .. "/manifest.json") or exists(src .. "/manifest.lua") then return src end
  for _, m in ipairs {"manifest.json", "manifest.lua"} do
    if exists(src .. "/lutra_model/" .. m) then return src .. "/lutra_model" end
  end
  return ckpt.latest(src .. "/ckpt") or ckpt.latest(src)
end

local function to_hf(ckpt_dir, dst, opts)
  local st = ckpt.load_weights(ckpt_dir)
  if type(st.model) ~= "table" then raise("convert: " .. ckpt_dir .. ": the checkpoint holds no model state") end
  local cfg = M.model_config(st.config, st.model, ckpt_dir)
  local model = models.build(cfg)
  model:load_state_dict(st.model, {source = ckpt_dir, allow_cast = opts.cast})
  local tok_path = find_tokenizer(opts, ckpt_dir, st.config)
  local tok = tok_path and require("lutra.tokenizer").load(tok_path)
  hf.save_pretrained(dst, model, tok, {dtype = opts.dtype, max_shard_size = opts.max_shard_size})
  if tok_path then copy_tokenizer_files(dirname(tok_path), dst) end
  return string.format("%s (step %s, %s, %d layers) -> %s (Hugging Face %s%s)", ckpt_dir, tostring(st.step or "?"),
    cfg.arch, cfg.n_layer, dst, hf.family_of(cfg), tok and ", with tokenizer.json" or ", no tokenizer")
end

local function to_lutra(src, dst, opts)
  local model, tok, cfg = hf.load_pretrained(src, {ignore_keys = opts.ignore_keys, dtype = opts.dtype,
                                                     allow_cast = opts.cast})
  local plain = {}
  for k, v in pairs(cfg) do plain[k] = v end
  ckpt.save_weights(dst, model:state_dict(), {model = plain, source = {format = "huggingface", path = src}})
  if tok then
    tok:save(dst .. "/tokenizer.json")
    copy_tokenizer_files(src, dst)
  end
  return string.format("%s (Hugging Face %s, %d layers) -> %s (lutra checkpoint, model weights only%s)", src,
    hf.family_of(cfg),
    cfg.n_layer, dst, tok and ", with tokenizer.json" or "")
end

-- The absolute path with symlinks resolved of `path`, which may not exist yet: its nearest existing
-- ancestor resolved, and the rest appended.
local ffi = require "ffi"
pcall(ffi.cdef, "char *realpath(const char *path, char *resolved);")
pcall(ffi.cdef, "void free(void *p);")
local function resolved_path(path)
  local rest = ""
  while true do
    local p = ffi.C.realpath(path, nil)
    if p ~= nil then
      local full = ffi.string(p)
      ffi.C.free(p)
      return (full:gsub("/$", "")) .. rest
    end
    local parent, name = path:match("^(.*)/([^/]+)/*$")
    if parent == nil then parent, name = ".", path end
    if parent == "" then parent = "/" end
    rest = "/" .. name .. rest
    path = parent
  end
end

-- Whether directory `a` is `b` or inside it (both resolved).
local function within(a, b) return a == b or a:sub(1, #b + 1) == b .. "/" end

-- DST must not be SRC, inside it, or hold it: writing there (with --force above all) would
-- overwrite or delete the files being converted.
local function check_distinct(src, dst)
  local s, d = resolved_path(src), resolved_path(dst)
  if within(d, s) then
    raise("convert: the destination " .. dst .. (d == s and " is the source " or " is inside the source ") .. src
      .. ": choose a directory outside it")
  end
  if within(s, d) then
    raise("convert: the destination " .. dst .. " contains the source " .. src .. ": choose a directory outside it")
  end
end

function M.convert(src, dst, opts)
  opts = opts or {}
  if not is_dir(src) then raise("convert: " .. src .. " is not a directory") end
  check_distinct(src, dst)
  if not opts.force and is_dir(dst) and non_empty_dir(dst) then
    raise("convert: " .. dst .. " exists and is not empty (pass --force to write into it)")
  end
  -- a Hugging Face dir holds config.json; so does a lutra run dir (its settings), told apart by
  -- its checkpoints (ckpt/, a manifest, lutra_model/)
  local run_like = is_dir(src .. "/ckpt") or exists(src .. "/manifest.json") or is_dir(src .. "/lutra_model")
  if exists(src .. "/config.json") and not run_like then return to_lutra(src, dst, opts) end
  local ckpt_dir = lutra_source(src)
  if ckpt_dir == nil then
    raise("convert: " .. src .. " is neither a Hugging Face dir (config.json) nor a lutra checkpoint (manifest.json, "
      .. "ckpt/latest or lutra_model/)")
  end
  return to_hf(ckpt_dir, dst, opts)
end

-- `lutra convert ...`: the exit status.
function M.main(words)
  local opts, src, dst = parse(words or {})
  if opts == nil then return src end
  local ok, msg = pcall(M.convert, src, dst, opts)
  if not ok then
    io.stderr:write("lutra convert: ", (tostring(msg):gsub("^[^:]*%.lua:%d+: ", "")), "\n")
    return 1
  end
  io.stdout:write(msg, "\n")
  return 0
end

return M
