-- lutra.chat's pieces: option parsing, streaming a reply that ends at a stop string spelled in
-- several tokens (never shown, even in part), and fitting a long conversation to the block.
local lt = require "lutra"
local models = require "lutra.models"
local templates = require "lutra.sft.templates"
local chat = require "lutra.chat"
local T = require "lutra.testing"
local equal = T.assert_equal

local tok = lt.tokenizer.char("abcdefghijklmnopqrstuvwxyz \n:", {special_tokens = {"<|im_start|>", "<|im_end|>"}})

-- A llama whose greedy next token depends on the current one alone: succ[a] = b.
local function automaton(succ, block)
  local V, C = tok.vocab_size, 32
  local model = models.build {arch = "llama", n_layer = 1, n_head = 2, d_model = C, vocab_size = V,
                              block_size = block or 64}
  local id = function(s) return tok:encode(s)[1] end
  local wte, head = {}, {}
  for v = 1, V do
    wte[v], head[v] = {}, {}
    for c = 1, C do wte[v][c], head[v][c] = (c == v) and 1 or 0, 0 end
  end
  for a, b in pairs(succ) do head[id(b) + 1][id(a) + 1] = 1 end
  lt.no_grad(function()
    model.wte.weight:copy_(lt.tensor(wte))
    model.lm_head.weight:copy_(lt.tensor(head))
    for _, b in ipairs(model.blocks) do
      b.attn.proj.weight:zero_()
      b.mlp.proj.weight:zero_()
    end
  end)
  return model
end

-- an output that records each write
local function recorder()
  local r = {parts = {}}
  function r:write(s) self.parts[#self.parts + 1] = s end
  function r:flush() end
  return r
end

test("parse: --k=v, --k v, flags, numbers, errors", function()
  local pos, o = chat.parse {"dir", "--temperature=0.5", "--top_k", "3", "--raw", "--system=be brief", "--max-new-tokens=9"}
  equal(pos, {"dir"})
  equal({o.temperature, o.top_k, o.raw, o.system, o.max_new_tokens}, {0.5, 3, true, "be brief", 9})
  local bad, msg = chat.parse {"--top_k=x"}
  equal({bad, msg}, {nil, "--top_k expects a number, got 'x'"})
  equal(select(2, chat.parse {"--nope"}), "unknown option --nope")
  equal(select(2, chat.parse {"--prompt"}), "--prompt needs a value")
end)

test("stream: a stop string in several tokens ends the reply and is never shown", function()
  -- the reply spells "okxy..." and the template's end of turn is "xy"
  local model = automaton {["\n"] = "o", o = "k", k = "x", x = "y", y = "z", z = "z"}
  local t = templates.get(function(messages, opts)
    local segs = {}
    for _, m in ipairs(messages) do segs[#segs + 1] = {text = m.role .. ":" .. m.content .. "xy\n", role = m.role} end
    if opts.add_generation_prompt then segs[#segs + 1] = {text = "assistant:\n", role = "assistant"} end
    return segs
  end, {stop = "xy"})
  local s = {model = model, tok = tok, t = t, block = 64, stop_id = templates.stop_id(tok, t),
             gen = {temperature = 0, max_new_tokens = 20}}
  equal(s.stop_id, nil)
  local out = recorder()
  local prompt = templates.encode(tok, t, {{role = "user", content = "hi"}}, {add_generation_prompt = true})
  equal(chat.stream(s, prompt, out), "ok")
  equal(table.concat(out.parts), "ok")
  -- "o" went out as soon as it came; "k" too ("x" is held back until it is known not to be the stop)
  equal(out.parts[1], "o")
  -- with the stop as one token: the id stops it
  local model2 = automaton {["\n"] = "o", o = "k", k = "<|im_end|>", ["<|im_end|>"] = "z"}
  local t2 = templates.get("chatml")
  local s2 = {model = model2, tok = tok, t = t2, block = 64, stop_id = templates.stop_id(tok, t2),
              gen = {temperature = 0, max_new_tokens = 20}}
  local out2 = recorder()
  equal(chat.stream(s2, templates.encode(tok, t2, {{role = "user", content = "hi"}}, {add_generation_prompt = true}), out2), "ok")
  equal(out2.parts, {"o", "k"})
end)

test("fit: the oldest exchanges go first, the system message stays", function()
  local s = {tok = tok, t = templates.get("chatml"), block = 64, gen = {max_new_tokens = 16}}
  local h = {{role = "system", content = "sys"}}
  for i = 1, 5 do
    h[#h + 1] = {role = "user", content = "question " .. string.rep("q", i)}
    h[#h + 1] = {role = "assistant", content = "answer"}
  end
  h[#h + 1] = {role = "user", content = "last"}
  local ids = chat.fit(s, h)
  assert(#ids <= 64 - 16, "fits the room: " .. #ids)
  equal(h[1].content, "sys")
  equal(h[#h].content, "last")
  assert(#h < 12, "dropped some exchanges")
  equal(h[2].role, "user")
  equal(tok:decode(ids), templates.get("chatml"):text(h, {add_generation_prompt = true}))
end)

test("sft.eval: greedy replies and exact-match accuracy over single exchanges", function()
  local ev = require "lutra.sft.eval"
  local model = automaton {["\n"] = "o", o = "k", k = "<|im_end|>", ["<|im_end|>"] = "z"}
  equal(ev.reply(model, tok, "chatml", {{role = "user", content = "hi"}}), "ok")
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "ok"}]}\n')
  f:write('{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "b"}, {"role": "assistant", "content": "no"}]}\n')
  f:write('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "c"}, {"role": "assistant", "content": "ok"}]}\n')
  f:write('{"prompt": "d", "completion": "ok"}\n')
  f:close()
  equal({ev.exact_match(model, tok, "chatml", path)}, {2, 3})
  equal({ev.exact_match(model, tok, "chatml", path, {limit = 1})}, {1, 1})
  os.remove(path)
end)
