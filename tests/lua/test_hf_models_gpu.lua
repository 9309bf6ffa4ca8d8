-- The Hugging Face families on cuda:0 (label gpu; skipped as a whole without a GPU): each model of
-- tests/hf/fixtures/models, moved to the GPU, gives transformers' float64 logits to the bound
-- test_hf_models.lua holds the CPU to (1e-5 relative to the largest), through the key/value cache
-- where T passes block_size; and one training step's loss and gradients equal the CPU's
-- to f32 summation-order bounds (selftest/train.lua's 1e-4 on the loss, 2e-3 on gradients,
-- relative to each tensor's largest); greedy generation past block_size gives the CPU's tokens.
-- This is where RoPE scalings (rope_freq), sliding windows and
-- q/k norms meet the CUDA kernels inside whole models.
local lt = require "lutra"
local hf = require "lutra.hf"
local T = require "lutra.testing"
local equal = T.assert_equal

T.need_gpu()

local fx = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "hf_model_fixtures.lua")
local NAMES, fixtures, rel_diff, expected, logits_of = fx.NAMES, fx.dir, fx.rel_diff, fx.expected, fx.logits_of

-- loss and gradients (by name) of one forward/backward on (x, y)
local function loss_and_grads(model, x, y)
  model:zero_grad()
  local _, loss = model:forward(x, y)
  loss:backward()
  local grads = {}
  for name, p in model:named_parameters() do grads[name] = p.grad:cpu() end
  return loss:cpu(), grads
end

local figures = {}
for _, name in ipairs(NAMES) do
  test(name .. " on cuda:0: transformers' logits; a training step's loss and gradients equal the CPU's", function()
    local dir = fixtures .. "/" .. name
    local exp = expected(name)
    local cpu_model = hf.load_pretrained(dir, {allow_cast = true})
    local gpu_model = hf.load_pretrained(dir, {allow_cast = true})
    gpu_model:to("cuda")
    local d = rel_diff(logits_of(gpu_model, exp.ids:to("cuda")), exp.logits)
    if exp.ids_short then d = math.max(d, rel_diff(logits_of(gpu_model, exp.ids_short:to("cuda")), exp.logits_short)) end
    assert(d <= 1e-5, string.format("%s: cuda logits differ from transformers' by %.3g (relative)", name, d))
    local Tn = math.min(exp.ids:size(1) - 1, cpu_model.cfg.block_size)
    local x = exp.ids:narrow(1, 0, Tn):contiguous()
    local y = exp.ids:narrow(1, 1, Tn):contiguous()
    local want_loss, want = loss_and_grads(cpu_model, x, y)
    local got_loss, got = loss_and_grads(gpu_model, x:to("cuda"), y:to("cuda"))
    local dl = rel_diff(got_loss, want_loss)
    assert(dl <= 1e-4, string.format("%s: loss differs from the CPU's by %.3g (relative)", name, dl))
    local worst, where = 0, "-"
    for pname, g in pairs(want) do
      assert(got[pname], name .. ": no gradient on cuda for " .. pname)
      local dg = rel_diff(got[pname], g)
      if dg > worst then worst, where = dg, pname end
    end
    assert(worst <= 2e-3, string.format("%s: gradient of %s differs from the CPU's by %.3g (relative)", name, where, worst))
    figures[#figures + 1] = string.format("%-28s logits %.2e  loss %.2e  grads %.2e (%s)", name, d, dl, worst, where)
  end)
end

-- Greedy decoding on the GPU, past block_size (the key/value cache restarts): the CPU's tokens. The
-- logits agree to ~1e-6 relative (above), far inside any top-2 gap these models have.
local generate = require "lutra.generate"
for _, name in ipairs {"gpt2", "llama_yarn", "mistral_window", "qwen3"} do
  test(name .. " on cuda:0: greedy generation past block_size gives the CPU's tokens", function()
    local dir = fixtures .. "/" .. name
    local cpu_model = hf.load_pretrained(dir, {allow_cast = true})
    local gpu_model = hf.load_pretrained(dir, {allow_cast = true})
    gpu_model:to("cuda")
    local n = cpu_model.cfg.block_size + 5
    local opts = {temperature = 0, max_new_tokens = n}
    local want = generate.generate(cpu_model, {1, 2, 3}, opts)
    local got, used_cache = generate.generate(gpu_model, {1, 2, 3}, opts)
    assert(used_cache, name .. ": generation did not use the key/value cache")
    equal(#got, 3 + n)
    equal(got, want)
  end)
end

test("the figures", function()
  for _, line in ipairs(figures) do print("  " .. line) end
end)
