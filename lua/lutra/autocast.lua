-- lutra.autocast — the mixed-precision switch that ops consult (torch.autocast's idea).
--
--   autocast.run("bf16", fn, ...)   -- fn(...) with autocast on; the previous setting after
--   autocast.dtype                  -- nil (off), "bf16" or "f16"
--   autocast.low(t)                 -- t cast to autocast.dtype when t is f32 (else t itself)
--
-- While it is on, the ops that do the heavy compute (F.linear, F.scaled_dot_product_attention;
-- F.embedding's rows) cast their f32 inputs to autocast.dtype per call, through autograd, so
-- f32 weights get f32 gradients of the low-precision compute. Other ops take what they are
-- given. lutra.train's config.precision turns it on around each forward and backward
-- (lua/lutra/train/precision.lua). It lives in its own module, holding no other state, so
-- that any op module can consult it without requiring lutra.functional.
local dtype = require "lutra.dtype"
local errors = require "lutra.errors"
local fields = require "lutra.tensor.fields"

local M = {dtype = nil}

local F32 = dtype.F32

function M.low(t)
  if t ~= nil and fields.dtype_id(t) == F32 then return t:to(M.dtype) end
  return t
end

-- Runs fn(...) with autocast to dt ("bf16", "f16"; nil or "f32": off), restoring the previous
-- setting after, also on error. Returns fn's results.
function M.run(dt, fn, ...)
  if dt == "f32" then dt = nil end
  if dt ~= nil and dt ~= "bf16" and dt ~= "f16" then
    errors.raise("autocast: dtype must be \"bf16\", \"f16\" or nil, got " .. tostring(dt))
  end
  return errors.with_field(M, "dtype", dt, fn, ...)
end

return M
