-- lutra.sft.templates: ChatML and Llama-3 renderings spelled out, the loss flags of each
-- segment, the tokens that carry loss (decoded back: exactly the assistant turns and their
-- end-of-turn markers), a template given as a function, and errors.
local lt = require "lutra"
local templates = require "lutra.sft.templates"
local T = require "lutra.testing"
local equal, fails = T.assert_equal, T.assert_error

local CHAT = {
  {role = "system", content = "Be brief."},
  {role = "user", content = "2+3?"},
  {role = "assistant", content = "5"},
  {role = "user", content = "and 4+4?"},
  {role = "assistant", content = "8, surely."},
}

local function char_tok(specials)
  return lt.tokenizer.char("abcdefghijklmnopqrstuvwxyzB0123456789+?.,: \n", {special_tokens = specials})
end

test("chatml: the text, spelled out", function()
  local t = templates.get("chatml")
  equal(t.name, "chatml")
  equal(t.stop, "<|im_end|>")
  equal(t:text(CHAT), "<|im_start|>system\nBe brief.<|im_end|>\n" .. "<|im_start|>user\n2+3?<|im_end|>\n"
    .. "<|im_start|>assistant\n5<|im_end|>\n" .. "<|im_start|>user\nand 4+4?<|im_end|>\n"
    .. "<|im_start|>assistant\n8, surely.<|im_end|>\n")
  equal(t:text({CHAT[2]}, {add_generation_prompt = true}),
    "<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n")
  assert(templates.get() .name == "chatml", "chatml is the default")
end)

test("llama3: the text, spelled out (content trimmed)", function()
  local t = templates.get("llama3")
  equal(t.stop, "<|eot_id|>")
  local chat = {{role = "user", content = "  hi \n"}, {role = "assistant", content = "hello"}}
  equal(t:text(chat), "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
    .. "<|start_header_id|>assistant<|end_header_id|>\n\nhello<|eot_id|>")
  equal(t:text({chat[1]}, {add_generation_prompt = true}), "<|begin_of_text|><|start_header_id|>user<|end_header_id|>"
    .. "\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
end)

test("segments: train exactly on assistant content + end-of-turn", function()
  for _, name in ipairs {"chatml", "llama3"} do
    local t = templates.get(name)
    local trained = {}
    for _, s in ipairs(t:render(CHAT)) do
      if s.train then trained[#trained + 1] = s.text end
      assert(s.train == (s.role == "assistant" and s.text:find(t.stop, 1, true) ~= nil),
        name .. ": flag of " .. s.text)
    end
    equal(trained, {"5" .. t.stop, "8, surely." .. t.stop})
  end
end)

test("encode: ids and mask; the masked tokens decode to the assistant turns", function()
  local tok = char_tok {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
  local t = templates.get("chatml")
  local ids, mask = templates.encode(tok, t, CHAT)
  equal(#ids, #mask)
  equal(tok:decode(ids), t:text(CHAT))
  local kept = {}
  for i = 1, #ids do
    if mask[i] == 1 then kept[#kept + 1] = ids[i] end
  end
  equal(tok:decode(kept), "5<|im_end|>8, surely.<|im_end|>")
  -- the special tokens are one id each: 2 + 10 characters + 2 markers carry loss
  equal(#kept, 1 + 1 + 10 + 1)
  equal(templates.stop_id(tok, t), tok:token_id("<|im_end|>"))
  -- without the special tokens, the markers are plain characters (and no stop id)
  local plain = lt.tokenizer.char("abcdefghijklmnopqrstuvwxyzB0123456789+?., \n<|>_")
  local ids2, mask2 = templates.encode(plain, t, CHAT)
  equal(plain:decode(ids2), t:text(CHAT))
  local n = 0
  for i = 1, #mask2 do n = n + mask2[i] end
  equal(n, 1 + 10 + 2 * #"<|im_end|>")
  equal(templates.stop_id(plain, t), nil)
end)

test("a template given as a function", function()
  local fn = function(messages, opts)
    local segs = {}
    for _, m in ipairs(messages) do
      segs[#segs + 1] = {text = m.role:sub(1, 1) .. ": ", role = m.role, train = false}
      segs[#segs + 1] = {text = m.content .. "\n", role = m.role, train = m.role == "assistant"}
    end
    if opts.add_generation_prompt then segs[#segs + 1] = {text = "a: ", role = "assistant"} end
    return segs
  end
  local t = templates.get(fn, {stop = "\n", name = "plain"})
  equal({t.name, t.stop}, {"plain", "\n"})
  equal(t:text({CHAT[2], CHAT[3]}, {add_generation_prompt = true}), "u: 2+3?\na: 5\na: ")
  local tok = char_tok()
  local ids, mask = templates.encode(tok, fn, {CHAT[2], CHAT[3]})
  equal(tok:decode(ids), "u: 2+3?\na: 5\n")
  equal(table.concat(mask), "00000000" .. "000" .. "11")
end)

test("errors: unknown template, bad messages, bad function results", function()
  fails("unknown template 'chatml2' (expected chatml, llama3, or a function)", function() templates.get("chatml2") end)
  fails("expected a template name or a function", function() templates.get(42) end)
  local t = templates.get("chatml")
  fails("messages[1].role must be \"system\", \"user\" or \"assistant\", got tool",
    function() t:render {{role = "tool", content = "x"}} end)
  fails("messages[2].content must be a string, got nil", function() t:render {CHAT[1], {role = "user"}} end)
  fails("the function must return a list of segments", function() templates.get(function() return 1 end):render {} end)
  fails("segment 1 must be {text = string", function() templates.get(function() return {{}} end):render {} end)
  fails("expected a tokenizer first", function() templates.encode(nil, t, CHAT) end)
end)
