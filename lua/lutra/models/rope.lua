-- lutra.models.rope — RoPE's frequency scalings, as Hugging Face transformers defines them
-- (modeling_rope_utils.py): the inverse frequencies of a head's dim / 2 rotation pairs and the
-- factor that multiplies cos and sin ("attention scaling"), from a model config's rope_scaling.
--
--   rope.check(params, where, why)          -> a checked copy of a rope_scaling table (errors name where;
--                                              why: what they end with, or nil)
--   rope.frequencies(params, theta, dim, seq_len) -> {inv_freq = {dim / 2 doubles}, scale = number}
--   rope.dynamic(params)                    -> whether the frequencies depend on the sequence length
--
-- params (every field resolved: lutra.hf fills in what transformers defaults):
--   rope_type "default"   inv_freq[i] = theta^(-2i / dim), scale 1
--             "linear"    default / factor
--             "dynamic"   NTK: past original_max_position_embeddings positions, theta grows to
--                         theta (factor seq_len / orig - (factor - 1))^(dim / (dim - 2)); below it, default
--             "llama3"    low frequencies (wavelength > orig / low_freq_factor) / factor, high ones
--                         (< orig / high_freq_factor) kept, a smooth blend between
--             "yarn"      a ramp between interpolated (/ factor) and extrapolated frequencies over
--                         the dims between beta_fast and beta_slow rotations; scale attention_factor
--                         (default 0.1 ln(factor) + 1, or the mscale / mscale_all_dim ratio)
--             "longrope"  default / short_factor[i] (seq_len <= orig) or / long_factor[i]; scale
--                         attention_factor (default sqrt(1 + ln(factor) / ln(orig)))
-- The frequencies are computed in double precision; transformers computes them in float32, so
-- the two agree to float32's rounding.
local errors = require "lutra.errors"

local raise = errors.raise

local M = {}

local FIELDS = {
  default = {},
  linear = {factor = true},
  dynamic = {factor = true, original_max_position_embeddings = true},
  llama3 = {factor = true, low_freq_factor = true, high_freq_factor = true, original_max_position_embeddings = true},
  yarn = {factor = true, original_max_position_embeddings = true, attention_factor = false, beta_fast = false,
          beta_slow = false, mscale = false, mscale_all_dim = false, truncate = false},
  longrope = {short_factor = true, long_factor = true, factor = true, original_max_position_embeddings = true,
              attention_factor = false},
}
M.types = {"default", "linear", "dynamic", "llama3", "yarn", "longrope"}

local function finite(v) return type(v) == "number" and v == v and v > -math.huge and v < math.huge end

-- A checked copy of params: rope_type one of M.types, each field of the right type; a field the
-- type does not read is an error (it would be dropped).
function M.check(params, where, why)
  local raw_raise = raise
  local function raise(msg) raw_raise(msg .. (why or "")) end
  if type(params) ~= "table" then raise(where .. " must be a table {rope_type =, ...}, got " .. type(params)) end
  local kind = params.rope_type
  local fields = FIELDS[kind]
  if fields == nil then
    raise(string.format("%s: rope_type %s is not one lutra computes (%s)", where, tostring(kind),
      table.concat(M.types, ", ")))
  end
  local out = {rope_type = kind}
  for k, v in pairs(params) do
    if k ~= "rope_type" then
      if fields[k] == nil then
        raise(string.format("%s: rope_type %s has no field %s", where, kind, tostring(k)))
      end
      if k == "short_factor" or k == "long_factor" then
        if type(v) ~= "table" or #v == 0 then raise(string.format("%s: %s must be a list of numbers", where, k)) end
        local copy = {}
        for i, x in ipairs(v) do
          if not finite(x) or x <= 0 then
            raise(string.format("%s: %s[%d] = %s: must be a positive number", where, k, i, tostring(x)))
          end
          copy[i] = x
        end
        v = copy
      elseif k == "truncate" then
        if type(v) ~= "boolean" then raise(string.format("%s: truncate must be true or false", where)) end
      elseif not finite(v) or (v <= 0 and k ~= "mscale" and k ~= "mscale_all_dim") then
        raise(string.format("%s: %s = %s: must be a positive number", where, k, tostring(v)))
      end
      out[k] = v
    end
  end
  local names = {}
  for k in pairs(fields) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do
    if fields[k] and out[k] == nil then raise(string.format("%s: rope_type %s needs %s", where, kind, k)) end
  end
  if (kind == "linear" or kind == "dynamic" or kind == "llama3") and out.factor < 1 then
    raise(string.format("%s: factor = %s: must be >= 1", where, tostring(out.factor)))
  end
  if kind == "llama3" and out.high_freq_factor <= out.low_freq_factor then
    raise(string.format("%s: high_freq_factor (%s) must be above low_freq_factor (%s)", where,
      tostring(out.high_freq_factor), tostring(out.low_freq_factor)))
  end
  return out
end

function M.dynamic(params)
  return params ~= nil and (params.rope_type == "dynamic" or params.rope_type == "longrope")
end

local function base_freqs(theta, dim)
  local inv = {}
  for i = 1, dim / 2 do inv[i] = 1 / theta ^ ((2 * (i - 1)) / dim) end
  return inv
end

-- yarn's mscale (YaRN paper, eq. 21).
local function yarn_mscale(scale, mscale)
  if scale <= 1 then return 1 end
  return 0.1 * (mscale or 1) * math.log(scale) + 1
end

local function yarn(p, theta, dim)
  local factor, orig = p.factor, p.original_max_position_embeddings
  local scale = p.attention_factor
  if scale == nil then
    if p.mscale and p.mscale ~= 0 and p.mscale_all_dim and p.mscale_all_dim ~= 0 then
      scale = yarn_mscale(factor, p.mscale) / yarn_mscale(factor, p.mscale_all_dim)
    else
      scale = yarn_mscale(factor)
    end
  end
  local beta_fast, beta_slow = p.beta_fast or 32, p.beta_slow or 1
  -- the dim whose wavelength makes num_rotations turns over orig positions
  local function correction_dim(num_rotations)
    return (dim * math.log(orig / (num_rotations * 2 * math.pi))) / (2 * math.log(theta))
  end
  local low, high = correction_dim(beta_fast), correction_dim(beta_slow)
  if p.truncate ~= false then low, high = math.floor(low), math.ceil(high) end
  low, high = math.max(low, 0), math.min(high, dim - 1)
  if low == high then high = high + 0.001 end -- transformers' guard against a zero-width ramp
  local inv = {}
  for i = 1, dim / 2 do
    local extrapolation = 1 / theta ^ ((2 * (i - 1)) / dim)
    local interpolation = extrapolation / factor
    local ramp = math.min(math.max(((i - 1) - low) / (high - low), 0), 1)
    local keep = 1 - ramp -- the share of the extrapolated (unscaled) frequency
    inv[i] = interpolation * (1 - keep) + extrapolation * keep
  end
  return inv, scale
end

local function llama3(p, theta, dim)
  local inv = base_freqs(theta, dim)
  local factor, lff, hff, orig = p.factor, p.low_freq_factor, p.high_freq_factor, p.original_max_position_embeddings
  local low_wavelen, high_wavelen = orig / lff, orig / hff
  for i, f in ipairs(inv) do
    local wavelen = 2 * math.pi / f
    if wavelen > low_wavelen then
      inv[i] = f / factor
    elseif wavelen >= high_wavelen then
      local smooth = (orig / wavelen - lff) / (hff - lff)
      inv[i] = (1 - smooth) * f / factor + smooth * f
    end
  end
  return inv, 1
end

-- {inv_freq =, scale =} for params (nil: default) at theta, head dim dim, for sequences of up
-- to seq_len positions (read by dynamic and longrope only; nil: the shortest).
function M.frequencies(p, theta, dim, seq_len)
  local kind = p and p.rope_type or "default"
  if kind == "default" then return {inv_freq = base_freqs(theta, dim), scale = 1} end
  if kind == "linear" then
    local inv = base_freqs(theta, dim)
    for i, f in ipairs(inv) do inv[i] = f / p.factor end
    return {inv_freq = inv, scale = 1}
  elseif kind == "dynamic" then
    local orig = p.original_max_position_embeddings
    local n = math.max(seq_len or orig, orig)
    local base = theta * ((p.factor * n / orig) - (p.factor - 1)) ^ (dim / (dim - 2))
    return {inv_freq = base_freqs(base, dim), scale = 1}
  elseif kind == "llama3" then
    return {inv_freq = (llama3(p, theta, dim)), scale = 1}
  elseif kind == "yarn" then
    local inv, scale = yarn(p, theta, dim)
    return {inv_freq = inv, scale = scale}
  end
  -- longrope
  local orig = p.original_max_position_embeddings
  local ext = (seq_len and seq_len > orig) and p.long_factor or p.short_factor
  if #ext ~= dim / 2 then
    raise(string.format("rope: longrope needs head_dim / 2 = %d factors, got %d", dim / 2, #ext))
  end
  local scale = p.attention_factor
  if scale == nil then
    scale = p.factor <= 1 and 1 or math.sqrt(1 + math.log(p.factor) / math.log(orig))
  end
  local inv = base_freqs(theta, dim)
  for i, f in ipairs(inv) do inv[i] = f / ext[i] end
  return {inv_freq = inv, scale = scale}
end

return M
