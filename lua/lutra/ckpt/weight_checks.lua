-- lutra.ckpt.weight_checks — what a weight read from a file must be before it goes into a
-- parameter: of the parameter's dtype, and finite.
--
--   local wc = require "lutra.ckpt.weight_checks"
--   wc.dtype(file_dtype, param_dtype, where, opts)   -- raises unless equal, or lossless and opts.allow_cast
--   wc.finite(t, where, opts)                         -- raises on NaN/inf unless opts.allow_nonfinite
--   wc.dtype_problem(...), wc.finite_problem(...)     -- the same, as the message (nil: fine)
--   wc.lossless(from, to)                             -- true for bf16/f16 -> f32/f64 and f32 -> f64
--   wc.count_nonfinite(t)                             -- NaN and inf values of a float tensor
--
-- `where` names the file and the tensor ("runs/x/model.safetensors: tensor 'wte.weight'").
-- A weight whose dtype differs from its parameter's is refused by default, even where the
-- values would survive: it is usually the wrong file or a mistaken config, and a conversion
-- from integers (I32 weights read as f32: values of 1e9) or to a narrower float changes the
-- values silently. opts.allow_cast (`--cast` where a command loads weights) accepts the
-- lossless conversions only: bf16 and f16 into f32 or f64, f32 into f64. Non-finite values
-- are refused with their count unless opts.allow_nonfinite (opts.nonfinite_hint: what the
-- message advises instead of that option, where the caller has none).
local lt = require "lutra.ffi"
local bit = require "bit"
local errors = require "lutra.errors"
require "lutra.tensor" -- the tensor metatype (methods, properties) for the copies made here
local ffi, C = lt.ffi, lt.C

local M = {}
local raise, band = errors.raise, bit.band

local WIDER = {bf16 = {f32 = true, f64 = true}, f16 = {f32 = true, f64 = true}, f32 = {f64 = true}}
local FLOAT = {f32 = true, f64 = true, bf16 = true, f16 = true}

function M.lossless(from, to) return from == to or (WIDER[from] ~= nil and WIDER[from][to] == true) end

-- Why a weight of file_dtype may not go into a parameter of param_dtype, or nil.
function M.dtype_problem(file_dtype, param_dtype, where, opts)
  if file_dtype == param_dtype then return nil end
  local head = string.format("%s is %s, the parameter is %s", where, tostring(file_dtype), tostring(param_dtype))
  if not FLOAT[file_dtype] then
    return head .. ": integer and bool tensors are not weights of a floating-point parameter (the wrong file or "
      .. "tensor?)"
  end
  if not M.lossless(file_dtype, param_dtype) then
    return head .. ": converting it would lose precision; convert the file to " .. tostring(param_dtype)
      .. " first, or build the model in " .. tostring(file_dtype)
  end
  if not (opts and opts.allow_cast) then
    return head .. ": the conversion is lossless but is not made unless asked for (allow_cast = true, --cast)"
  end
  return nil
end

function M.dtype(file_dtype, param_dtype, where, opts)
  local problem = M.dtype_problem(file_dtype, param_dtype, where, opts)
  if problem then raise(problem) end
end

-- The bits that make a value NaN or inf: all ones in the exponent, on the word that holds it.
local EXPONENT = {f32 = {"uint32_t *", 0x7F800000, 1, 0}, f64 = {"uint32_t *", 0x7FF00000, 2, 1},
                  bf16 = {"uint16_t *", 0x7F80, 1, 0}, f16 = {"uint16_t *", 0x7C00, 1, 0}}

function M.count_nonfinite(t)
  local e = EXPONENT[t.dtype]
  if not e then return 0 end
  local n = t:numel()
  if n == 0 then return 0 end
  local c = t
  if c.device ~= "cpu" then c = c:cpu() end
  if C.lt_is_contiguous(c) == 0 then c = c:contiguous() end
  local words, mask, stride, at = ffi.cast(e[1], C.lt_data_ptr(c)), e[2], e[3], e[4]
  local bad = 0
  for i = 0, n - 1 do
    if band(words[i * stride + at], mask) == mask then bad = bad + 1 end
  end
  return bad
end

-- Why t's values may not be loaded (NaN or inf among them), or nil.
function M.finite_problem(t, where, opts)
  if opts and opts.allow_nonfinite then return nil end
  local bad = M.count_nonfinite(t)
  if bad == 0 then return nil end
  return string.format("%s: %d of its %d values are not finite (NaN or inf); %s", where, bad, t:numel(),
    opts and opts.nonfinite_hint or "pass allow_nonfinite = true to load them anyway")
end

function M.finite(t, where, opts)
  local problem = M.finite_problem(t, where, opts)
  if problem then raise(problem) end
end

return M
