-- lutra.generate — sampling text from a language model: temperature, top-k, top-p.
--
--   local generate = require "lutra.generate"
--   local ids = generate(model, {0}, {max_new_tokens = 200, temperature = 0.8, top_k = 40, top_p = 0.95})
--   print(tok:decode(ids))
--   generate.text(model, tok, "ROMEO:", {max_new_tokens = 100})   -- prompt and continuation as text
--
-- prompt: a list of token ids (0-based), or a (T) / (1, T) integer tensor. Returns the
-- prompt followed by the new ids, as a Lua list. Runs under no_grad and in eval mode
-- (the model's mode is restored after).
--
-- KV cache: when the model has kv_cache(batch, len) (the model zoo's gpt2 and llama),
-- the prompt runs once and each new token is one position of forward(idx, nil, {cache =
-- cache}): O(T) work per token. Without it (or with opts.cache = false), every token
-- recomputes the forward over the last block_size tokens (opts.block_size, or the
-- model's cfg.block_size / block_size / max_seq_len). When the cache is full (prompt +
-- new tokens beyond block_size) the cache restarts from the last block_size / 2 tokens.
--
-- Choosing a token: logits / temperature; top_k keeps the k largest; top_p keeps the
-- smallest set of the most likely tokens whose probability reaches p; then one draw from
-- the default generator (lutra.manual_seed makes it reproducible). temperature = 0 is
-- greedy (argmax).
--
-- Stopping and streaming: opts.stop_token (an id) or opts.stop_tokens (a list of ids) end
-- the generation once one is produced (it is kept in the result); opts.on_token(id, ids) is
-- called after each new token (ids: the list so far), for streaming; returning true from it
-- stops there (e.g. on a stop string).
local ffi = require "ffi"
local errors = require "lutra.errors"
local ops = require "lutra.ops"
local create = require "lutra.create"
local grad = require "lutra.nn.grad"
local memory = require "lutra.memory"

local raise, is_tensor = errors.raise, ops.is_tensor
local exp, floor = math.exp, math.floor

local M = {}

-- ---- choosing a token from one row of logits ---------------------------------------------------

-- logits: a float array (cdata, 0-based) of V values. u: uniform in [0, 1).
function M.choose(logits, V, opts, u)
  local temperature = opts.temperature or 1.0
  if temperature <= 0 then
    local best, bi = -math.huge, 0
    for i = 0, V - 1 do
      if logits[i] > best then best, bi = logits[i], i end
    end
    return bi
  end
  -- candidates sorted by logit, descending (a full sort: V is at most tens of thousands)
  local idx = {}
  for i = 1, V do idx[i] = i - 1 end
  table.sort(idx, function(a, b)
    local la, lb = logits[a], logits[b]
    if la ~= lb then return la > lb end
    return a < b
  end)
  local n = V
  if opts.top_k and opts.top_k > 0 and opts.top_k < n then n = opts.top_k end
  local top = logits[idx[1]]
  local probs, total = {}, 0
  for i = 1, n do
    local p = exp((logits[idx[i]] - top) / temperature)
    probs[i] = p
    total = total + p
  end
  local top_p = opts.top_p
  if top_p and top_p > 0 and top_p < 1 then
    local acc = 0
    for i = 1, n do
      acc = acc + probs[i] / total
      if acc >= top_p then
        n = i
        break
      end
    end
    total = 0
    for i = 1, n do total = total + probs[i] end
  end
  local target, acc = u * total, 0
  for i = 1, n do
    acc = acc + probs[i]
    if target < acc then return idx[i] end
  end
  return idx[n]
end

-- ---- the model -----------------------------------------------------------------------

local function block_size_of(model, opts)
  if opts.block_size then return opts.block_size end
  local cfg = rawget(model, "cfg") or rawget(model, "config")
  if type(cfg) == "table" then
    local b = cfg.block_size or cfg.max_seq_len or cfg.seq_len
    if type(b) == "number" then return b end
  end
  local b = rawget(model, "block_size") or rawget(model, "max_seq_len")
  if type(b) == "number" then return b end
  return nil
end

-- The last position's logits (1, T, V) -> a float array of V values (a contiguous f32 copy).
local function last_logits(logits)
  local T = logits:size(1)
  local row = logits:select(1, T - 1):select(0, 0):float():cpu():contiguous() -- read through the FFI: host memory
  return ffi.cast("float *", row:data_ptr()), row:size(0), row
end

local function ids_tensor(ids, from, to, device)
  local t = create.tensor({{unpack(ids, from, to)}}, {dtype = "i64"})
  if device and device ~= "cpu" then t = t:to(device) end
  return t
end

local function model_device(model)
  local ok, params = pcall(model.parameters, model)
  if ok and type(params) == "table" and params[1] then return params[1].device end
  return "cpu"
end

local function uniform()
  return create.rand(1):item()
end

local function run(model, prompt, opts)
  local ids = {}
  if is_tensor(prompt) then
    for i, v in ipairs(prompt:reshape(-1):tolist()) do ids[i] = v end
  elseif type(prompt) == "table" then
    for i, v in ipairs(prompt) do ids[i] = v end
  else
    raise("generate: prompt must be a list of token ids or a tensor, got " .. type(prompt))
  end
  if #ids == 0 then raise("generate: the prompt is empty (give at least one token, e.g. {0})") end
  local max_new = opts.max_new_tokens or 100
  local block = block_size_of(model, opts)
  local device = model_device(model)
  local use_cache = opts.cache ~= false and type(model.kv_cache) == "function" and block ~= nil
  local stop = opts.stop_token
  local stops = {}
  for _, id in ipairs(opts.stop_tokens or {}) do stops[id] = true end
  local on_token = opts.on_token
  local cache = nil
  for _ = 1, max_new do
    local logits
    if use_cache then
      if cache == nil or cache.pos >= cache.len then
        -- (re)start: the prompt, or the last block / 2 tokens once the cache is full
        local keep = cache == nil and math.min(#ids, block) or floor(block / 2)
        cache = model:kv_cache(1, block)
        logits = model:forward(ids_tensor(ids, #ids - keep + 1, #ids, device), nil, {cache = cache})
      else
        logits = model:forward(ids_tensor(ids, #ids, #ids, device), nil, {cache = cache})
      end
    else
      local from = block and math.max(1, #ids - block + 1) or 1
      logits = model:forward(ids_tensor(ids, from, #ids, device))
    end
    -- a tensor-parallel model gives this rank's vocabulary slice: gather the whole (every
    -- tp rank runs this loop in step, with the same generator, and picks the same token)
    if rawget(model, "_tp") ~= nil then logits = require("lutra.dist.tp").gather_logits(model, logits) end
    local arr, V = last_logits(logits)
    local id = M.choose(arr, V, opts, uniform())
    ids[#ids + 1] = id
    if on_token and on_token(id, ids) == true then break end
    if (stop and id == stop) or stops[id] then break end
  end
  return ids, use_cache
end

-- generate(model, prompt, opts) -> ids (list), used_cache (boolean)
function M.generate(model, prompt, opts)
  opts = opts or {}
  if type(model) ~= "table" or type(model.forward) ~= "function" then
    raise("generate: expected a model with forward(), got " .. type(model))
  end
  for _, k in ipairs {"temperature", "top_k", "top_p", "max_new_tokens"} do
    if opts[k] ~= nil and (type(opts[k]) ~= "number" or opts[k] < 0) then
      raise(string.format("generate: %s must be a number >= 0, got %s", k, tostring(opts[k])))
    end
  end
  local was_training = rawget(model, "training")
  if type(model.eval) == "function" then model:eval() end
  local ok, ids, used = errors.pcall(grad.no_grad, memory.tidy, run, model, prompt, opts)
  if type(model.train) == "function" then model:train(was_training ~= false) end -- the mode it had
  if not ok then error(ids, 0) end
  return ids, used
end

-- generate.text(model, tok, prompt_text, opts) -> the prompt and its continuation, decoded (one string).
function M.text(model, tok, prompt, opts)
  local ids
  if prompt == nil or prompt == "" then
    ids = {opts and opts.start_token or 0}
  else
    ids = tok:encode(prompt)
  end
  local out = M.generate(model, ids, opts)
  return (tok:decode(out))
end

return setmetatable(M, {__call = function(_, ...) return M.generate(...) end})
