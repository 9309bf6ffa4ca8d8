-- What the recipes reach through `lt.`: the lazily loaded fine-tuning modules (lt.lora,
-- lt.dpo, lt.sft.*), lt.now, lt.dist.once in a world of one, model:can_save_whole() (false
-- once a parameter is a shard or freed), and block:on_mlp_input (the hook sees the MLP's
-- input bit for bit, and the forward's result does not change).
local lt = require "lutra"
local T = require "lutra.testing"
local equal, fails = T.assert_equal, T.assert_error

local function small_model()
  lt.manual_seed(5)
  return lt.models.build{arch = "gpt2", n_layer = 2, n_head = 2, d_model = 16, vocab_size = 11, block_size = 8}
end

test("lt.lora, lt.dpo, lt.sft.* are the modules, loaded on first use; lt.now is a clock", function()
  equal(rawequal(lt.lora, require "lutra.lora"), true)
  equal(rawequal(lt.dpo, require "lutra.dpo"), true)
  for _, name in ipairs {"data", "modeldir", "eval", "templates"} do
    equal(rawequal(lt.sft[name], require("lutra.sft." .. name)), true, name)
  end
  equal(lt.sft.nothing, nil)
  equal(lt.no_such_field, nil)
  local t0 = lt.now()
  assert(type(t0) == "number" and lt.now() >= t0)
end)

test("lt.dist.once: a world of one runs fn once and returns all its results", function()
  local calls = 0
  local a, b, c, d = lt.dist.once(function(x, y)
    calls = calls + 1
    return x + y, nil, "three"
  end, 1, 2)
  equal(calls, 1)
  equal({a, b, c, d}, {3, nil, "three", nil})
  fails("dist.once: expected a function", lt.dist.once, 42)
end)

test("model:can_save_whole(): true for a whole model, false for a shard or a freed parameter", function()
  local spec = require "lutra.dist.spec"
  local model = small_model()
  equal(model:can_save_whole(), true)
  local w = model.blocks[1].attn.proj.weight
  spec.set(w, {global = w.shape, offset = {0, 0}, dup = true}) -- a whole copy owned elsewhere
  equal(model:can_save_whole(), true)
  spec.set(w, {global = {w.shape[1] * 2, w.shape[2]}, offset = {0, 0}}) -- the top half of a tensor
  equal(model:can_save_whole(), false)
  spec.set(w, nil)
  equal(model:can_save_whole(), true)
  model.ln_f.weight:free()
  equal(model:can_save_whole(), false)
end)

test("block:on_mlp_input: the hook sees ln_2(x + attn(ln_1(x))) exactly; the forward is unchanged", function()
  local model = small_model()
  local x = lt.randint(0, 11, {2, 8})
  local before = lt.no_grad(function() return model:forward(x) end)
  local seen = {}
  for i, block in ipairs(model.blocks) do
    block:on_mlp_input(function(b, h)
      equal(rawequal(b, block), true)
      seen[i] = h:clone()
    end)
  end
  local logits = lt.no_grad(function() return model:forward(x) end)
  equal(logits:tolist(), before:tolist())
  -- the inputs by hand, block by block, unfused
  lt.no_grad(function()
    local h = model.wte(x) + model.wpe(lt.arange(x:size(1)))
    for i, block in ipairs(model.blocks) do
      local hn = block.ln_2(h + block.attn(block.ln_1(h)))
      equal(seen[i]:tolist(), hn:tolist(), "block " .. i)
      h = h + block.attn(block.ln_1(h))
      h = h + block.mlp(block.ln_2(h))
    end
  end)
  for _, block in ipairs(model.blocks) do block:on_mlp_input(nil) end
  seen = {}
  lt.no_grad(function() return model:forward(x) end)
  equal(next(seen), nil)
end)
