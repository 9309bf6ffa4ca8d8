-- The attention-level ops against transformers (tests/hf/fixtures/attn, written by
-- tests/hf/gen_attn.py; float64 references):
-- - F.rope with {inv_freq =, scale =} of each rope type (default, linear, dynamic, llama3, yarn,
--   longrope) against transformers' apply_rotary_pos_emb with its own inv_freq and
--   attention_scaling; F.rope_backward is the transpose (checked through <rope(x), y>);
-- - F.scaled_dot_product_attention{window =} against torch's attention under the mask of
--   transformers' sliding_window_causal_mask_function (and packed_sequence_mask_function for
--   packed rows), queries at absolute positions after a cache included.
-- f64 inputs: max relative difference (max |got - want| / max |want|) <= 1e-12; the same in f32
-- (inputs rounded to f32, the reference kept in f64) <= 1e-5.
local lt = require "lutra"
local F = lt.F
local T = require "lutra.testing"
local st = require "lutra.ckpt.safetensors"

local DIR = "tests/hf/fixtures/attn/"
local rope = st.load(DIR .. "rope.safetensors")
local window = st.load(DIR .. "window.safetensors")

local function max_rel(got, want)
  local g = got:to("f64")
  return (g - want):abs():max():item() / want:abs():max():item()
end

local function check_rel(what, got, want, tol)
  local r = max_rel(got, want)
  print(string.format("  %-34s max relative difference %.3g", what, r))
  assert(r <= tol, string.format("%s: max relative difference %.3g > %g", what, r, tol))
end

local ROPE_TYPES = {"default", "linear", "dynamic", "llama3", "yarn", "longrope"}

for _, name in ipairs(ROPE_TYPES) do
  test("F.rope{inv_freq, scale} equals transformers' " .. name .. " rope", function()
    local x, pos, want = rope[name .. ".x"], rope[name .. ".positions"], rope[name .. ".out"]
    local spec = {inv_freq = rope[name .. ".inv_freq"], scale = rope[name .. ".scale"]:item()}
    check_rel(name .. " f64", F.rope(x, pos, spec), want, 1e-12)
    check_rel(name .. " f32", F.rope(x:to("f32"), pos, spec), want, 1e-5)
    -- the inverse is the transpose: <rope(x), y> == <x, rope_backward(y)>
    local y = lt.randn(x.shape, "f64")
    local a, b = (F.rope(x, pos, spec) * y):sum():item(), (x * F.rope_backward(y, pos, spec)):sum():item()
    assert(math.abs(a - b) <= 1e-12 * math.abs(a), string.format("%s: <rope x, y> %.17g, <x, rope' y> %.17g", name, a, b))
  end)
end

test("transformers' yarn and longrope scale cos and sin (attention_scaling != 1): the fixture covers it", function()
  assert(rope["yarn.scale"]:item() > 1.01 and rope["longrope.scale"]:item() > 1.01)
end)

for _, name in ipairs {"row", "cached", "decode", "packed", "wide"} do
  test("F.scaled_dot_product_attention{window} equals transformers' sliding window mask: " .. name, function()
    local q, k, v, want = window[name .. ".q"], window[name .. ".k"], window[name .. ".v"], window[name .. ".out"]
    local W, seg = window[name .. ".window"]:item(), window[name .. ".segments"]
    local out = F.scaled_dot_product_attention {q, k, v, causal = true, window = W, segment_ids = seg}
    check_rel(name .. " f64", out, want, 1e-12)
    local out32 = F.scaled_dot_product_attention {q:to("f32"), k:to("f32"), v:to("f32"), causal = true, window = W,
                                                   segment_ids = seg}
    check_rel(name .. " f32", out32, want, 1e-5)
    if W < q:size(1) + k:size(1) then -- the window hides keys here: without it the result differs
      local plain = F.scaled_dot_product_attention {q, k, v, causal = true, segment_ids = seg}
      assert(max_rel(plain, want) > 1e-3, name .. ": the window changed nothing")
    end
  end)
end
