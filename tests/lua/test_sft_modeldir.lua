-- lutra.sft.modeldir: a model directory round trip (same logits, same tokenizer, the template
-- name kept), in lutra's format and, when lutra.hf is there, Hugging Face's; a trainer
-- checkpoint loads with its tokenizer; errors.
local lt = require "lutra"
local models = require "lutra.models"
local modeldir = require "lutra.sft.modeldir"
local ckpt = require "lutra.ckpt"
local T = require "lutra.testing"
local equal, close, fails = T.assert_equal, T.assert_close, T.assert_error

local tok = lt.tokenizer.char("abcdefghij \n", {special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}})

local function tmpdir()
  local p = os.tmpname()
  os.remove(p)
  os.execute("mkdir -p '" .. p .. "'")
  return p
end

local function roundtrip(arch, format)
  lt.manual_seed(5)
  local model = models.build {arch = arch, n_layer = 1, n_head = 2, d_model = 16, vocab_size = tok.vocab_size,
                              block_size = 16}
  local dir = tmpdir() .. "/m"
  modeldir.save(dir, model, tok, {template = "llama3", format = format})
  local m2, tok2, info = modeldir.load(dir)
  equal(info.template, "llama3")
  equal(tok2:encode("abc<|im_end|>"), tok:encode("abc<|im_end|>"))
  local x = lt.tensor({{1, 2, 3, 4, 5}}, {dtype = "i64"})
  close(m2:forward(x), model:forward(x), {atol = 1e-6, msg = arch .. " " .. tostring(format)})
  equal(modeldir.load(dir, {template = "chatml"}) ~= nil, true)
  equal(select(3, modeldir.load(dir, {template = "chatml"})).template, "chatml")
  os.execute("rm -rf '" .. dir:match("^(.*)/m$") .. "'")
end

test("lutra format: gpt2 and llama round trips", function()
  roundtrip("gpt2", "lutra")
  roundtrip("llama", "lutra")
end)

test("the default format (Hugging Face's when lutra.hf is there)", function()
  roundtrip("gpt2")
  roundtrip("llama")
end)

test("a trainer checkpoint with its tokenizer", function()
  lt.manual_seed(6)
  local model = models.build {arch = "gpt2", n_layer = 1, n_head = 2, d_model = 16, vocab_size = tok.vocab_size,
                              block_size = 16}
  local dir = tmpdir()
  ckpt.save_weights(dir .. "/ckpt/step_000001", model:state_dict(),
    {model = {arch = "gpt2", n_layer = 1, n_head = 2, n_kv_head = 0, d_model = 16, block_size = 16, dropout = 0}},
    {step = 1})
  tok:save(dir .. "/tok.json")
  local m2, _, info = modeldir.load(dir .. "/ckpt/step_000001", {tokenizer = dir .. "/tok.json"})
  equal(info.format, "checkpoint")
  local x = lt.tensor({{1, 2, 3}}, {dtype = "i64"})
  close(m2:forward(x), model:forward(x), {atol = 1e-6})
  fails("a checkpoint without tokenizer.json", function() modeldir.load(dir .. "/ckpt/step_000001") end)
  fails("is not a model directory", function() modeldir.load(dir) end)
  -- the single-process format (manifest.lua, code) is refused by name, not run
  for _, sub in ipairs {"/old", "/old2/lutra_model"} do
    os.execute("mkdir -p '" .. dir .. sub .. "'")
    local f = assert(io.open(dir .. sub .. "/manifest.lua", "w"))
    f:write("error('this file must not run')")
    f:close()
  end
  fails("old/manifest.lua: the single-process checkpoint format (manifest.lua) is no longer read",
    function() modeldir.load(dir .. "/old", {tokenizer = dir .. "/tok.json"}) end)
  fails("lutra_model/manifest.lua: the single-process checkpoint format", function() modeldir.load(dir .. "/old2") end)
  os.execute("rm -rf '" .. dir .. "'")
end)

test("a sharded trainer checkpoint carries its tokenizer and config", function()
  lt.manual_seed(6)
  local cfg = {arch = "llama", n_layer = 1, n_head = 2, d_model = 16, vocab_size = tok.vocab_size, block_size = 8}
  local model = models.build(cfg)
  local dir = tmpdir()
  local ids = {}
  for i = 1, 200 do ids[i] = (i * 7) % tok.vocab_size end
  local data = {step = 0}
  function data:next()
    local x = lt.tensor({{ids[1], ids[2], ids[3], ids[4], ids[5], ids[6], ids[7], ids[8]}}, {dtype = "i64"})
    return x, x
  end
  function data:state() return {step = self.step} end
  function data:set_state(st) self.step = st.step end
  local r = lt.train{model = model, data = data, tokenizer = tok, quiet = true, no_interrupt = true,
                     config = {steps = 2, warmup = 0, eval_every = 0, run_dir = dir, ckpt_every = 2, model = cfg}}
  local m2, tok2, info = modeldir.load(r.checkpoint)
  equal(info.format, "checkpoint")
  equal(tok2.vocab_size, tok.vocab_size)
  local x = lt.tensor({{1, 2, 3}}, {dtype = "i64"})
  close(m2:forward(x), model:forward(x), {atol = 1e-6})
  os.execute("rm -rf '" .. dir .. "'")
end)
