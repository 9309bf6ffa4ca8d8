-- lutra.functional.nan_to_num — finite checks and the replacement of non-finite values, made of
-- the comparison and where ops (every device, autograd through where):
--
--   F.isnan(x) -> bool tensor       F.isinf(x), F.isfinite(x) likewise; integers are finite
--   F.nan_to_num(x, nan, posinf, neginf) -> out
--       NaN -> nan (0 by default), +inf -> posinf, -inf -> neginf (by default the dtype's
--       largest and lowest finite values); the gradient flows to the finite elements only.
local ops = require "lutra.ops"
local errors = require "lutra.errors"
local U = require "lutra.functional.util"

local M = {}

local need, raise = U.need, errors.raise
local where = ops.where
local inf = math.huge

-- the largest finite value of each float dtype
local FINITE_MAX = {f32 = 3.4028234663852886e38, f64 = 1.7976931348623157e308, bf16 = 3.3895313892515355e38,
                    f16 = 65504}

function M.isnan(x)
  need("isnan", "x", x)
  return ops.ne(x, x)
end

function M.isinf(x)
  need("isinf", "x", x)
  if not x:is_floating_point() then return ops.ne(x, x) end
  return ops.eq(ops.abs(x), inf)
end

-- x - x is 0 exactly for finite x and NaN for +-inf and NaN
function M.isfinite(x)
  need("isfinite", "x", x)
  if not x:is_floating_point() then return ops.eq(x, x) end
  return ops.eq(ops.sub(x:detach(), x:detach()), 0)
end

local function number_or_nil(what, v)
  if v ~= nil and type(v) ~= "number" then raise("nan_to_num: " .. what .. " must be a number or nil, got " .. type(v)) end
  return v
end

function M.nan_to_num(x, nan, posinf, neginf)
  need("nan_to_num", "x", x)
  nan, posinf, neginf = number_or_nil("nan", nan) or 0, number_or_nil("posinf", posinf), number_or_nil("neginf", neginf)
  if not x:is_floating_point() then return x:clone() end
  local big = FINITE_MAX[x.dtype]
  posinf, neginf = posinf or big, neginf or -big
  local out = where(ops.eq(x, inf), posinf, x)
  out = where(ops.eq(x, -inf), neginf, out)
  return where(ops.ne(x, x), nan, out)
end

return M
