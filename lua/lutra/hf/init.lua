-- lutra.hf — Hugging Face model directories of the gpt2, llama (SmolLM2), qwen2, qwen3,
-- mistral, mixtral, qwen2_moe and qwen3_moe families (lutra.hf.families; config.json: lutra.hf.config; weight names: lutra.hf.weights):
-- config.json, model.safetensors (or model-0000k-of-0000n.safetensors with
-- model.safetensors.index.json) and tokenizer.json.
--
--   local hf = require "lutra.hf"
--   local model, tok, cfg = hf.load_pretrained("gpt2-dir")          -- {dtype =, device =, ignore_keys = {..}}
--   hf.save_pretrained("out-dir", model, tok)                       -- {dtype = "bf16", max_shard_size = bytes}
--   local cfg = hf.config_from_hf(json.read_file("config.json"), {path = "config.json"})  -- lutra's model config
--
-- The architecture comes from config.json (model_type; architectures, when present, must name
-- that family's classes), written by transformers 4.x or 5.x. A key lutra cannot honour (another
-- hidden_act, cross attention, a RoPE scaling it does not compute, ...) is an error that names
-- it; keys that do not change the model (dtype, token ids, generation settings, ...) are
-- accepted; an unknown key is an error unless listed in opts.ignore_keys (--ignore-key on the
-- command line: lutra cannot tell whether it changes the math).
-- Every key lutra reads is typed: sizes are integers in [1, 2^31 - 1], epsilons and
-- rope_theta positive finite numbers, dropouts in [0, 1), flags true or false (a string "16" or
-- "yes" is an error, never converted); and a model whose parameters would not fit in the
-- device's memory is refused before anything is allocated (lutra.models.size). Errors name
-- the file and the key. The model is built in f32 (HF's default; opts.dtype to change) and each
-- weight must have the model's dtype (lutra.ckpt.weight_checks): opts.allow_cast accepts the
-- lossless conversions (bf16, f16 -> f32), opts.allow_nonfinite NaN/inf values. tokenizer is
-- nil when the directory has no tokenizer.json.
local errors = require "lutra.errors"
local fields = require "lutra.tensor.fields"
local json = require "lutra.json"
local models = require "lutra.models"
local st = require "lutra.ckpt.safetensors"
local W = require "lutra.hf.weights"
local HC = require "lutra.hf.config"
local Fam = require "lutra.hf.families"
local wc = require "lutra.ckpt.weight_checks"
local grad = require "lutra.nn.grad"

local raise = errors.raise

local M = {}

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local show = HC.show

M.model_types = Fam.model_types
M.config_from_hf = HC.from_hf
M.config_to_hf = HC.to_hf
M.family_of = HC.family_of

-- ---- weights: one file or shards ------------------------------------------------------------

local INDEX = "model.safetensors.index.json"

-- {hf name = file path} of dir's weights: model.safetensors, or the files its sharded index names.
function M.weight_files(dir)
  local single = dir .. "/model.safetensors"
  if exists(single) then
    local out = {}
    for _, name in ipairs(st.read_header(single).names) do out[name] = single end
    return out
  end
  local index_path = dir .. "/" .. INDEX
  if not exists(index_path) then raise("hf: " .. dir .. " has neither model.safetensors nor " .. INDEX) end
  local index = json.read_file(index_path)
  if type(index) ~= "table" or type(index.weight_map) ~= "table" then
    raise("hf: " .. index_path .. ": weight_map is missing or not an object")
  end
  local out = {}
  for name, file in pairs(index.weight_map) do
    if type(file) ~= "string" or file:find("/", 1, true) or file:find("\\", 1, true) or file == ".." or file == "" then
      raise("hf: " .. index_path .. ": weight_map['" .. name .. "'] = " .. show(file) .. " is not a file name in " .. dir)
    end
    out[name] = dir .. "/" .. file
  end
  return out
end

-- Opens every file once; returns {path = reader} and {hf name = header entry}. A name the
-- index puts in a file that does not hold it is an error.
local function open_weights(files)
  local readers, entries = {}, {}
  local ok, err = pcall(function()
    for name, path in pairs(files) do
      if not readers[path] then readers[path] = st.open(path) end
      local e = readers[path].tensors[name]
      if e == nil then raise("hf: " .. path .. " does not hold " .. name .. " (as " .. INDEX .. " says)") end
      entries[name] = e
    end
  end)
  if not ok then
    for _, r in pairs(readers) do r:close() end
    error(err, 0)
  end
  return readers, entries
end

-- {hf name = tensor} from dir's model.safetensors or its sharded index (CPU, stored dtypes).
function M.read_weights(dir)
  local files = M.weight_files(dir)
  local readers = open_weights(files)
  local out = {}
  for name, path in pairs(files) do out[name] = readers[path]:load(name) end
  for _, r in pairs(readers) do r:close() end
  return out
end

-- Reads dir's weights into model one tensor at a time (straight into the parameter when the
-- dtypes match and no transpose is needed), after checking every name and shape; each one's
-- dtype and values as lutra.ckpt.weight_checks says (opts.allow_cast, opts.allow_nonfinite).
function M.load_weights(model, dir, opts)
  local cfg = model.cfg
  local family = M.family_of(cfg)
  local files = M.weight_files(dir)
  local readers, entries = open_weights(files)
  local ok, err = pcall(function()
    local plan = W.plan(cfg, entries, family, dir)
    local sd = model:state_dict()
    grad.no_grad(function()
      for _, p in ipairs(plan) do
        local e, key = p.entry, p.key
        local dst, r = sd[e.lt], readers[files[key]]
        local where = string.format("hf: %s: tensor '%s'", files[key], key)
        wc.dtype(r.tensors[key].dtype, dst.dtype, where, opts)
        if not e.rows and not e.t and r.tensors[key].dtype == dst.dtype and fields.is_cpu(dst) and dst:is_contiguous() then
          r:load(key, dst)
          wc.finite(dst, where, opts)
        else
          local t = r:load(key)
          wc.finite(t, where, opts)
          if e.view then dst = dst:reshape(e.view[1], e.view[2]) end -- (a view: the parameter is contiguous)
          if e.rows then dst = dst:narrow(0, e.rows[1], e.rows[2]) end
          dst:copy_(e.t and t:t() or t)
          t:free()
        end
      end
    end)
  end)
  for _, r in pairs(readers) do r:close() end
  if not ok then error(err, 0) end
  return model
end

-- Writes {name = tensor} as model.safetensors, or as shards of at most max_shard_size bytes
-- (a tensor larger than that gets a shard of its own) with the index. Stale files of an
-- earlier save in the other layout are removed.
function M.write_weights(dir, tensors, max_shard_size)
  local names = {}
  for name in pairs(tensors) do names[#names + 1] = name end
  table.sort(names)
  local old_index = dir .. "/" .. INDEX
  if exists(old_index) then
    local ok, index = pcall(json.read_file, old_index)
    if ok and type(index) == "table" and type(index.weight_map) == "table" then
      for _, file in pairs(index.weight_map) do
        if type(file) == "string" and not file:find("/", 1, true) then os.remove(dir .. "/" .. file) end
      end
    end
    os.remove(old_index)
  end
  local meta = {format = "pt"}
  if not max_shard_size then -- replaced by a rename (lt_st_save): never removed first
    st.save(dir .. "/model.safetensors", tensors, meta)
    return {"model.safetensors"}
  end
  local shards, cur, cur_bytes, total = {}, nil, 0, 0
  for _, name in ipairs(names) do
    local t = tensors[name]
    local bytes = t:numel() * t:element_size()
    if cur == nil or (cur_bytes > 0 and cur_bytes + bytes > max_shard_size) then
      cur, cur_bytes = {}, 0
      shards[#shards + 1] = cur
    end
    cur[name] = t
    cur_bytes, total = cur_bytes + bytes, total + bytes
  end
  local weight_map, files = {}, {}
  for k, shard in ipairs(shards) do
    local file = string.format("model-%05d-of-%05d.safetensors", k, #shards)
    st.save(dir .. "/" .. file, shard, meta)
    for name in pairs(shard) do weight_map[name] = file end
    files[k] = file
  end
  os.remove(dir .. "/model.safetensors")
  json.write_file(old_index, {metadata = {total_size = total}, weight_map = weight_map}, {indent = 2})
  return files
end

-- ---- directories ----------------------------------------------------------------------------

-- load_pretrained(dir, {dtype = "f32", device =, ignore_keys =, allow_cast =, allow_nonfinite =}) -> model, tokenizer (or nil), cfg, hf config
function M.load_pretrained(dir, opts)
  opts = opts or {}
  if type(dir) ~= "string" then raise("hf.load_pretrained: expected a directory, got " .. type(dir)) end
  local config_path = dir .. "/config.json"
  if not exists(config_path) then raise("hf.load_pretrained: " .. config_path .. " not found") end
  local hc = json.read_file(config_path)
  local cfg = M.config_from_hf(hc, {dtype = opts.dtype, device = opts.device, ignore_keys = opts.ignore_keys,
                                    path = config_path})
  local model = models.build(cfg)
  M.load_weights(model, dir, opts)
  local tok
  if exists(dir .. "/tokenizer.json") then
    tok = require("lutra.tokenizer").load(dir .. "/tokenizer.json")
    if tok.vocab_size > cfg.vocab_size then
      raise(string.format("hf.load_pretrained: %s/tokenizer.json has %d tokens, more than vocab_size %d", dir,
        tok.vocab_size, cfg.vocab_size))
    end
  end
  return model, tok, cfg, hc
end

-- save_pretrained(dir, model, tok, {dtype =, max_shard_size =}) -> dir
function M.save_pretrained(dir, model, tok, opts)
  opts = opts or {}
  if type(dir) ~= "string" then raise("hf.save_pretrained: expected a directory, got " .. type(dir)) end
  local cfg = model and model.cfg
  if type(cfg) ~= "table" or cfg.pos == nil then raise("hf.save_pretrained: expected a lutra.models model") end
  local hc, family = M.config_to_hf(cfg, tok, opts.dtype)
  local r = os.execute("mkdir -p " .. sh_quote(dir))
  if r ~= 0 and r ~= true then raise("hf.save_pretrained: cannot create " .. dir) end
  local tensors = W.to_hf(cfg, model:state_dict(), family)
  if opts.dtype then
    for name, t in pairs(tensors) do tensors[name] = t:to(opts.dtype) end
  end
  M.write_weights(dir, tensors, opts.max_shard_size)
  json.write_file(dir .. "/config.json", hc, {indent = 2})
  if tok then tok:save(dir .. "/tokenizer.json") end
  return dir
end

return M
