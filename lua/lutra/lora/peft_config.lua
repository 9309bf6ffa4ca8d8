-- lutra.lora.peft_config — adapter_config.json as peft 0.21 (LoraConfig) writes it: every field
-- lutra honours is read and typed, every field that would change the math in a way lutra does not
-- implement is refused by name, and an unknown field is refused (lutra cannot tell what it does).
-- Also peft's rules for the per-module options:
--   rank_pattern / alpha_pattern  {regex = value}: a module named K takes the value of the key P
--                                 for which re.match("(.*\.)?(P)$", K) holds (peft's get_pattern_key);
--                                 lutra reads the regex subset module patterns use (literals, ".",
--                                 "\.", "\d", "\w", [classes], "*", "+", "?", one level of (a|b)).
--   layers_to_transform            the layer indices that have adapters (layers_pattern names the list).
local errors = require "lutra.errors"
local json = require "lutra.json"

local raise = errors.raise
local null = json.null

local M = {}

local is_null = json.is_null
local function show(v) return json.show(v, 80) end

-- Fields that change only how peft initialises new adapters (a saved adapter is loaded as it is).
local INIT_ONLY = {init_lora_weights = true, loftq_config = true, eva_config = true, corda_config = true,
                   lora_ga_config = true, runtime_config = true, megatron_core = true}
M.INIT_ONLY = INIT_ONLY
-- Fields that change the computation in ways lutra does not implement: refused unless unset.
local REFUSED = {
  lora_bias = "a trainable bias on lora_B (lora_bias = true)",
  use_qalora = "QALoRA (quantization-aware pooling of the adapter input)",
  target_parameters = "adapters on parameters (nn.Parameter targets, e.g. MoE experts)",
  megatron_config = "Megatron-LM parallel LoRA layers",
  trainable_token_indices = "trainable token embeddings (TrainableTokens)",
  layer_replication = "replicated layers (layer_replication)",
  velora_config = "VeLoRA", alora_invocation_tokens = "activated LoRA (aLoRA)",
  monteclora_config = "MonteCLoRA", use_bdlora = "block-diagonal LoRA (BD-LoRA)", arrow_config = "Arrow routing",
  kasa_config = "KaSA",
}
-- Fields read (or harmless: bookkeeping).
local READ = {peft_type = true, task_type = true, auto_mapping = true, peft_version = true,
              base_model_name_or_path = true, revision = true, inference_mode = true, r = true,
              target_modules = true, exclude_modules = true, lora_alpha = true, lora_dropout = true,
              fan_in_fan_out = true, bias = true, use_rslora = true, modules_to_save = true,
              layers_to_transform = true, layers_pattern = true, rank_pattern = true, alpha_pattern = true,
              use_dora = true, ensure_weight_tying = true, qalora_group_size = true}

local function unset(v)
  return is_null(v) or v == false or (type(v) == "table" and next(v) == nil)
end

-- Reads and checks path (adapter_config.json). Returns a table: r, alpha, dropout, rslora, dora,
-- bias, modules_to_save (list or nil), rank_pattern, alpha_pattern, layers (set of indices or nil),
-- path.
function M.read(path)
  local conf = json.read_file(path)
  local function bad(key, need)
    raise(string.format("lora.load: %s: %s = %s: lutra needs %s", path, key, show(conf[key]), need))
  end
  if type(conf) ~= "table" or json.is_array(conf) then raise("lora.load: " .. path .. " must hold a JSON object") end
  local keys = {}
  for k in pairs(conf) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  for _, k in ipairs(keys) do
    if REFUSED[k] then
      if not unset(conf[k]) then
        raise(string.format("lora.load: %s: %s = %s: lutra does not implement %s", path, k, show(conf[k]), REFUSED[k]))
      end
    elseif not (READ[k] or INIT_ONLY[k]) then
      raise(string.format("lora.load: %s: unknown field '%s' (lutra cannot tell whether it changes the model)", path, k))
    end
  end
  if conf.peft_type ~= "LORA" then bad("peft_type", '"LORA" (lutra loads LoRA and DoRA adapters)') end
  if not (is_null(conf.task_type) or conf.task_type == "CAUSAL_LM") then
    bad("task_type", '"CAUSAL_LM" or null (a causal language model with its own head)')
  end
  local c = {path = path}
  local function int(key, v)
    if type(v) ~= "number" or v ~= math.floor(v) or v < 1 or v > 2 ^ 31 - 1 then bad(key, "a positive integer") end
    return v
  end
  local function num(key, v)
    if type(v) ~= "number" or v ~= v or v <= 0 or v == math.huge then bad(key, "a positive number") end
    return v
  end
  local function bool(key, default)
    local v = conf[key]
    if is_null(v) then return default end
    if type(v) ~= "boolean" then bad(key, "true or false") end
    return v
  end
  c.r = int("r", conf.r == nil and 8 or conf.r)
  c.alpha = num("lora_alpha", conf.lora_alpha == nil and 8 or conf.lora_alpha)
  local drop = is_null(conf.lora_dropout) and 0 or conf.lora_dropout
  if type(drop) ~= "number" or drop < 0 or drop >= 1 then bad("lora_dropout", "a number in [0, 1)") end
  c.dropout = drop
  c.rslora = bool("use_rslora", false)
  c.dora = bool("use_dora", false)
  bool("fan_in_fan_out", false) -- peft sets it by the layer's kind (Conv1D or Linear): the same weights either way
  bool("inference_mode", true)
  c.bias = is_null(conf.bias) and "none" or conf.bias
  if c.bias ~= "none" and c.bias ~= "all" and c.bias ~= "lora_only" then bad("bias", '"none", "all" or "lora_only"') end
  local mts = conf.modules_to_save
  if not is_null(mts) then
    if type(mts) ~= "table" or (next(mts) ~= nil and not json.is_array(mts)) then bad("modules_to_save", "a list of module names") end
    for _, v in ipairs(mts) do
      if type(v) ~= "string" then bad("modules_to_save", "a list of module names") end
    end
    if #mts > 0 then c.modules_to_save = mts end
  end
  if c.modules_to_save and bool("ensure_weight_tying", false) then
    bad("ensure_weight_tying", "false (lutra unties an embedding saved by modules_to_save, as peft does without it)")
  end
  for _, key in ipairs {"rank_pattern", "alpha_pattern"} do
    local p = conf[key]
    if is_null(p) then p = {} end
    if type(p) ~= "table" or json.is_array(p) and #p > 0 then bad(key, "an object {module pattern: number}") end
    local out = {}
    for k, v in pairs(p) do
      local integral = type(v) == "number" and (key ~= "rank_pattern" or v == math.floor(v))
      if not integral or v <= 0 or v ~= v or v == math.huge then
        raise(string.format("lora.load: %s: %s.%s = %s: lutra needs a positive %s", path, key, tostring(k), show(v),
          key == "rank_pattern" and "integer" or "number"))
      end
      out[#out + 1] = {key = k, value = v, lua = M.translate(k, "lora.load: " .. path .. ": " .. key)}
    end
    c[key] = out
  end
  local ltt = conf.layers_to_transform
  if not is_null(ltt) then
    local set = {}
    if type(ltt) == "number" then ltt = {ltt} end
    if type(ltt) ~= "table" then bad("layers_to_transform", "a layer index or a list of them") end
    for _, i in ipairs(ltt) do
      if type(i) ~= "number" or i ~= math.floor(i) or i < 0 then bad("layers_to_transform", "a list of layer indices >= 0") end
      set[i] = true
    end
    c.layers = set
  end
  return c
end

-- ---- peft's regex subset -----------------------------------------------------------------------------

local CLASS = {d = "%d", w = "[%w_]", s = "%s", D = "%D", W = "[^%w_]", S = "%S"}

-- One alternative (no groups) as a Lua pattern, or an error naming where.
local function to_lua(re, where, whole)
  local out, i = {}, 1
  local function fail(why)
    raise(string.format("%s: pattern '%s': %s (lutra reads literals, '.', '\\.', '\\d', '\\w', "
      .. "[classes], '*', '+', '?' and one level of (a|b))", where, whole, why))
  end
  while i <= #re do
    local ch = re:sub(i, i)
    if ch == "\\" then
      local n = re:sub(i + 1, i + 1)
      if CLASS[n] then out[#out + 1] = CLASS[n]
      elseif n:match("[%p]") then out[#out + 1] = "%" .. n
      else fail("the escape \\" .. n) end
      i = i + 2
    elseif ch == "[" then
      local j = re:find("]", i + 2, true)
      if not j then fail("an unclosed [") end
      local body = re:sub(i + 1, j - 1):gsub("\\d", "%%d"):gsub("\\w", "%%w_")
      out[#out + 1] = "[" .. body .. "]"
      i = j + 1
    elseif ch == "*" or ch == "+" or ch == "?" then
      if #out == 0 then fail("a quantifier with nothing before it") end
      if re:sub(i + 1, i + 1):match("[%?%+]") then fail("a lazy or possessive quantifier") end
      out[#out + 1] = ch == "*" and "*" or ch
      i = i + 1
    elseif ch:match("[%w_/ :]") then
      out[#out + 1] = ch
      i = i + 1
    elseif ch == "." then
      out[#out + 1] = "."
      i = i + 1
    elseif ch == "-" then
      out[#out + 1] = "%-"
      i = i + 1
    else
      fail("the character '" .. ch .. "'")
    end
  end
  return table.concat(out)
end

-- A regex as a list of Lua patterns (anchored, one per alternative).
function M.translate(re, where)
  if type(re) ~= "string" or re == "" then raise(where .. ": a pattern must be a non-empty string") end
  local alts = {""}
  local i = 1
  local function add(pieces)
    local next_alts = {}
    for _, a in ipairs(alts) do
      for _, p in ipairs(pieces) do next_alts[#next_alts + 1] = a .. p end
    end
    alts = next_alts
  end
  -- top-level alternation: a|b as (a|b)
  local depth, top = 0, false
  for k = 1, #re do
    local ch = re:sub(k, k)
    if ch == "(" then depth = depth + 1 elseif ch == ")" then depth = depth - 1
    elseif ch == "|" and depth == 0 and re:sub(k - 1, k - 1) ~= "\\" then top = true end
  end
  local src = top and "(" .. re .. ")" or re
  while i <= #src do
    local open = src:find("(", i, true)
    if not open then
      add({to_lua(src:sub(i), where, re)})
      break
    end
    add({to_lua(src:sub(i, open - 1), where, re)})
    local close = src:find(")", open, true)
    if not close then to_lua("(", where, re) end
    local body = src:sub(open + 1, close - 1):gsub("^%?:", "")
    if body:find("(", 1, true) then to_lua("(", where, re) end
    if src:sub(close + 1, close + 1):match("[%*%+%?{]") then
      raise(string.format("%s: pattern '%s': a quantified group (lutra reads one level of (a|b))", where, re))
    end
    local pieces = {}
    for alt in (body .. "|"):gmatch("(.-)|") do pieces[#pieces + 1] = to_lua(alt, where, re) end
    add(pieces)
    i = close + 1
  end
  for k, a in ipairs(alts) do alts[k] = "^" .. a .. "$" end
  return alts
end

-- Whether re.match("(.*\.)?(P)$", key) holds for the pattern P translated as lua (a list).
local function matches(lua, key)
  local starts = {1}
  for pos in key:gmatch("()%.") do starts[#starts + 1] = pos + 1 end
  for _, s in ipairs(starts) do
    local rest = key:sub(s)
    for _, p in ipairs(lua) do
      if rest:find(p) then return true end
    end
  end
  return false
end
M.matches = matches

-- The value of patterns (read's rank_pattern / alpha_pattern list) for module `key`, or default
-- (where: the start of an error's message).
-- peft takes the first key in the file's order that matches; JSON objects have no order in lutra,
-- so two matching keys with different values are an error.
function M.pattern_value(patterns, key, default, what, where)
  local hit
  for _, p in ipairs(patterns) do
    if matches(p.lua, key) then
      if hit and hit.value ~= p.value then
        raise(string.format("%s: %s: the keys '%s' and '%s' both match %s with different values "
          .. "(peft takes the first in the file; lutra does not keep JSON key order)", where, what, hit.key, p.key, key))
      end
      hit = p
    end
  end
  return hit and hit.value or default
end

-- Patterns given as a Lua table {pattern = value} (lora.apply's rank_pattern / alpha_pattern).
function M.patterns(t, what)
  local out = {}
  for k, v in pairs(t or {}) do
    if type(k) ~= "string" or type(v) ~= "number" or v <= 0 then
      raise(string.format("lora.apply: %s must map module patterns to positive numbers, got %s = %s", what,
        tostring(k), tostring(v)))
    end
    out[#out + 1] = {key = k, value = v, lua = M.translate(k, "lora.apply: " .. what)}
  end
  return out
end

return M
