-- lutra.functional.histogram — counting values, as torch's bincount and histc (not differentiable).
--
--   F.bincount(x, weights, minlength) -> counts
--       x: 1-d i32/i64/u8 of non-negative values; counts[v] = how many x equal v (i64), or with
--       weights (1-d, x's length, any dtype) their sum: f32 for f32 weights, else f64 (as torch);
--       length max(max(x) + 1, minlength), minlength default 0.
--   F.histc(x, bins, min, max) -> counts (bins values, x's float dtype)
--       bins equal-width bins from min to max (defaults 100, 0, 0); min == max takes the range of
--       the data (x's smallest and largest values; one value v gives [v - 1, v + 1]). Values outside
--       [min, max] are left out, and so is NaN (torch 1.13's CPU histc counts NaN in the first bin,
--       its CUDA one leaves it out); max itself falls in the last bin.
--
-- Both are made of ops that run on either device: the counts are index_add's of ones (or of the
-- weights) in x's order, as torch's loops add them. histc finds each bin as torch's CPU does for f32
-- and f64, in x's dtype with its rounding after each step: trunc((v - min) * bins / (max - min)), min
-- and max rounded to the dtype (the ends of its bin edges); bf16 and f16 values are binned so in f32
-- (torch 1.13's bf16 histc rounds its steps otherwise, and it has no f16 one), their counts kept in
-- the dtype. The largest value (bincount) and the data range (histc) are read to the host (a wait on
-- a GPU), as torch's.
local errors = require "lutra.errors"
local U = require "lutra.functional.util"
local ops = require "lutra.ops"
local create = require "lutra.create"
local index_add = require("lutra.functional.index_select").index_add

local M = {}

local raise, int_arg = errors.raise, errors.int_arg
local need, is_tensor = U.need, ops.is_tensor
local INTS = {i32 = true, i64 = true, u8 = true}
local FLOATS = {f32 = true, f64 = true, bf16 = true, f16 = true}

function M.bincount(x, weights, minlength)
  need("bincount", "x", x)
  minlength = int_arg("bincount", minlength, "minlength", true) or 0
  if minlength < 0 then raise("bincount: minlength must be non-negative, got " .. minlength) end
  if x.ndim ~= 1 or not INTS[x.dtype] then
    raise(string.format("bincount: x must be a 1-d tensor of non-negative integers, got %d-d %s", x.ndim, x.dtype))
  end
  local len = x:size(0)
  if weights ~= nil then
    if not is_tensor(weights) then raise("bincount: weights must be a tensor or nil, got " .. type(weights)) end
    if weights.ndim ~= 1 or weights:size(0) ~= len or weights.device ~= x.device then
      raise(string.format("bincount: weights must be 1-d with x's length %d on %s, got [%s] on %s", len, x.device,
        table.concat(weights.shape, ","), weights.device))
    end
  end
  local n = minlength
  if len > 0 then
    local lo, hi = x:min():item(), x:max():item()
    if lo < 0 then raise(string.format("bincount: x must be non-negative, it holds %d", lo)) end
    n = math.max(n, hi + 1)
  end
  -- torch: i64 counts for an empty x, weights or not
  local dt = (weights == nil or len == 0) and "i64" or (weights.dtype == "f32" and "f32" or "f64")
  local counts = create.zeros({n}, {dtype = dt, device = x.device})
  if len == 0 then return counts end
  local index = x.dtype == "u8" and x:to("i64") or x
  local add = weights == nil and create.ones({len}, {dtype = "i64", device = x.device}) or weights:detach():to(dt)
  return index_add(counts, 0, index, add)
end

-- v as x's dtype rounds it
local function rounded(v, dt) return create.full({1}, v, {dtype = dt}):item() end

function M.histc(x, bins, min, max)
  need("histc", "x", x)
  bins = int_arg("histc", bins, "bins", true) or 100
  if bins < 1 then raise("histc: bins must be at least 1, got " .. bins) end
  min, max = min or 0, max or 0
  if type(min) ~= "number" or type(max) ~= "number" then raise("histc: min and max must be numbers") end
  local dt = x.dtype
  if not FLOATS[dt] then raise("histc: x must be a float tensor (f32, f64, bf16, f16), got " .. dt) end
  x = x:detach():reshape(-1)
  if min == max and x:numel() > 0 then min, max = x:min():item(), x:max():item() end
  if min == max then min, max = min - 1, max + 1 end
  if min ~= min or max ~= max or math.abs(min) == math.huge or math.abs(max) == math.huge then
    raise(string.format("histc: the range [%s, %s] is not finite", tostring(min), tostring(max)))
  end
  if min > max then raise(string.format("histc: max must be larger than min (got min %s, max %s)", min, max)) end
  local counts = create.zeros({bins}, {dtype = dt, device = x.device})
  if x:numel() == 0 then return counts end
  local lo, hi = rounded(min, dt), rounded(max, dt) -- the ends of x's dtype's bin edges
  if dt == "bf16" or dt == "f16" then x = x:to("f32") end -- binned in f32
  local width, scale = rounded(hi - lo, x.dtype), rounded(bins, x.dtype)
  local inside = ops.where(x:ge(lo), x:le(hi), false) -- lo <= v <= hi (NaN: false)
  local v = ops.where(inside, x, lo) -- outside values (and NaN) at bin 0, counted 0 times
  local bin = (((v - lo) * scale) / width):to("i64"):clamp(nil, bins - 1)
  return index_add(counts, 0, bin, inside:to(dt))
end

return M
