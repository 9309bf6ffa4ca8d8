-- tokenizer.json files of each kind the model families ship, written by Hugging Face's
-- `tokenizers` (tests/hf/gen_tokenizers.py), against what that library gives for >= 1000 strings
-- each: the ids of encode(text) with and without add_special_tokens, their offsets (in bytes)
-- and decode of the ids without the added specials (with special tokens in the text, and without). Every string must match on all four.
local tokenizer = require "lutra.tokenizer"
local json = require "lutra.json"
local T = require "lutra.testing"
local equal = T.assert_equal

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "tests/lua"
local dir = here .. "/../hf/fixtures/tokenizers"
local KINDS = json.read_file(dir .. "/kinds.json") -- kind -> {lead = the special ids put before the text}
local names = {}
for kind in pairs(KINDS) do names[#names + 1] = kind end
table.sort(names)
assert(#names >= 10, "kinds.json lists fewer kinds than gen_tokenizers.py writes")

local function show(s) return (string.format("%q", s):gsub("\\\n", "\\n")) end

local function same(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

local function sums(deltas) -- the fixture's offsets are differences: back to the values
  local out, v = {}, 0
  for i = 1, #deltas do
    v = v + deltas[i]
    out[i] = v
  end
  return out
end

local function tail(list, from) -- list without its first `from` items
  local out = {}
  for i = from + 1, #list do out[#out + 1] = list[i] end
  return out
end

local function check_kind(kind)
  local lead = KINDS[kind].lead
  local tok = tokenizer.load(dir .. "/" .. kind .. ".json")
  local n, ok = 0, {ids = 0, plain = 0, offsets = 0, decode = 0}
  local first_bad = {}
  local function bad(what, case, got, want)
    if not first_bad[what] then
      first_bad[what] = string.format("%s %s of %s: got %s, want %s", kind, what, show(case.t),
        type(got) == "table" and json.encode(got) or show(got), type(want) == "table" and json.encode(want) or show(want))
    end
  end
  for _, case in json.lines(dir .. "/" .. kind .. ".cases.jsonl") do
    n = n + 1
    local ids, starts, ends = tok:encode_offsets(case.t)
    if same(ids, case.a) then ok.ids = ok.ids + 1 else bad("ids", case, ids, case.a) end
    local flat = {}
    for i = 1, #starts do flat[2 * i - 1], flat[2 * i] = starts[i], ends[i] end
    local want_offsets = sums(case.o)
    if same(flat, want_offsets) then ok.offsets = ok.offsets + 1 else bad("offsets", case, flat, want_offsets) end
    local plain = tok:encode(case.t, {add_special_tokens = false})
    local want = case.b or tail(case.a, lead)
    if same(plain, want) then ok.plain = ok.plain + 1 else bad("plain", case, plain, want) end
    local text, skipped = tok:decode(plain), tok:decode(plain, {skip_special_tokens = true})
    local want_text = case.d or case.t
    if text == want_text and skipped == (case.s or want_text) then
      ok.decode = ok.decode + 1
    elseif text ~= want_text then
      bad("decode", case, text, want_text)
    else
      bad("decode without specials", case, skipped, case.s or want_text)
    end
    if same(ids, case.a) then -- encode agrees with encode_offsets
      equal(tok:encode(case.t), ids)
    end
  end
  print(string.format("  %-11s %4d strings: ids %4d, ids without specials %4d, offsets %4d, decode %4d", kind, n,
    ok.ids, ok.plain, ok.offsets, ok.decode))
  return n, ok, first_bad
end

for _, kind in ipairs(names) do
  test("Hugging Face " .. kind .. " tokenizer: ids, offsets and decode of every string", function()
    local n, ok, first_bad = check_kind(kind)
    assert(n >= 1000, kind .. ": fewer than 1000 strings in the fixture")
    local msgs = {}
    for _, what in ipairs({"ids", "plain", "offsets", "decode", "decode without specials"}) do
      if first_bad[what] then msgs[#msgs + 1] = first_bad[what] end
    end
    assert(#msgs == 0, table.concat(msgs, "\n"))
    equal({ok.ids, ok.plain, ok.offsets, ok.decode}, {n, n, n, n})
  end)
end

test("each kind saved by lutra and loaded again gives the same ids and decode", function()
  for _, kind in ipairs(names) do
    local tok = tokenizer.load(dir .. "/" .. kind .. ".json")
    local path = os.tmpname()
    tok:save(path)
    local back = tokenizer.load(path)
    os.remove(path)
    local n = 0
    for _, case in json.lines(dir .. "/" .. kind .. ".cases.jsonl") do
      n = n + 1
      if n > 300 then break end
      equal(back:encode(case.t), case.a)
      local plain = back:encode(case.t, {add_special_tokens = false})
      equal(back:decode(plain), case.d or case.t)
    end
  end
end)

test("encode_offsets on lutra's own tokenizers: each token's bytes are its range of the text", function()
  local text = ("the quick brown fox, the lazy dog! 12345\n\n  spaces\t"):rep(20)
  local tok = tokenizer.train_bpe(text, {vocab = 300, special_tokens = {"<|endoftext|>"}})
  local s = "the quick<|endoftext|> brown fox \u{1F642}!"
  local ids, starts, ends = tok:encode_offsets(s)
  equal(ids, tok:encode(s))
  for i = 1, #ids do
    local piece = s:sub(starts[i] + 1, ends[i])
    if piece:byte(1) < 0x80 then
      equal(tok:token(ids[i]), piece) -- ASCII: exactly the token's bytes
    else
      equal(piece, "\u{1F642}") -- a byte of the emoji: the whole character
    end
  end
  equal({starts[3], ends[3]}, {9, 22}) -- the special token
  local chars = tokenizer.char("abc\u{E9}d")
  ids, starts, ends = chars:encode_offsets("a\u{E9}d")
  equal(ids, {0, 4, 3})
  equal(starts, {0, 1, 3})
  equal(ends, {1, 3, 4})
end)

test("pairs (encode(text, pair)): ids and offsets of each pair as the pair template gives them", function()
  local kinds = 0
  for _, kind in ipairs(names) do
    local path = dir .. "/" .. kind .. ".pairs.jsonl"
    local f = io.open(path, "rb")
    if f then
      f:close()
      kinds = kinds + 1
      local tok = tokenizer.load(dir .. "/" .. kind .. ".json")
      local n = 0
      for _, case in json.lines(path) do
        n = n + 1
        local ids, starts, ends = tok:encode_offsets(case.t, {pair = case.u})
        local flat = {}
        for i = 1, #starts do flat[2 * i - 1], flat[2 * i] = starts[i], ends[i] end
        equal(ids, case.a, kind .. " pair ids of " .. show(case.t) .. ", " .. show(case.u))
        equal(flat, sums(case.o), kind .. " pair offsets of " .. show(case.t) .. ", " .. show(case.u))
        equal(tok:encode(case.t, {pair = case.u}), case.a)
      end
      print(string.format("  %-11s %4d pairs: ids and offsets equal", kind, n))
    end
  end
  assert(kinds >= 4, "fewer pair fixtures than gen_tokenizers.py writes")
end)

test("encode options: add_special_tokens, pair, and errors that name them", function()
  local tok = tokenizer.load(dir .. "/llama3.json")
  local bos = tok:token_id("<|begin_of_text|>")
  local ids = tok:encode("Hello")
  equal(ids[1], bos)
  equal(tok:encode("Hello", {add_special_tokens = false}), tail(ids, 1))
  local t = tok:encode_tensor("Hello", {add_special_tokens = false})
  equal(t:numel(), #ids - 1)
  local n_ids, n = tok:encode_ids("Hello")
  equal({n, n_ids[0]}, {#ids, bos})
  T.assert_error("opts.pair must be a string, got number", function() tok:encode("a", {pair = 5}) end)
  T.assert_error("unknown option 'pair'", function() tok:encode_tensor("a", {pair = "b"}) end)
  T.assert_error("unknown option 'special'", function() tok:encode_offsets("a", {special = false}) end)
end)

test("a special token added to a loaded tokenizer.json encodes and decodes", function()
  for _, kind in ipairs({"added", "llama2", "qwen2"}) do
    local tok = tokenizer.load(dir .. "/" .. kind .. ".json")
    local id = tok:add_special("<|tool|>")
    equal(id, tok.vocab_size - 1)
    local ids = tok:encode("x<|tool|>y", {add_special_tokens = false})
    local found = false
    for _, v in ipairs(ids) do found = found or v == id end
    assert(found, kind .. ": the new special token was not matched")
    assert(tok:decode(ids):find("<|tool|>", 1, true), kind .. ": decode lost the new special token")
    equal(tok:decode(ids, {skip_special_tokens = true}):find("<|tool|>", 1, true), nil)
  end
end)
