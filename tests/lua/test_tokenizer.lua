-- lutra.tokenizer: training, encode/decode round trips of any bytes, special tokens, the
-- char tokenizer against Python's sorted(set(text)) rule, Hugging Face fixtures, save/load,
-- load_or_train's cache, and errors that name what is wrong.
local tokenizer = require "lutra.tokenizer"
local T = require "lutra.testing"
local equal, fails = T.assert_equal, T.assert_error

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "tests/lua"
local data_dir = here .. "/../data"

local function tmpname(suffix)
  local p = os.tmpname()
  os.remove(p)
  return p .. (suffix or "")
end

local function corpus(n, alphabet, seed)
  T.seed(seed or 1)
  local parts = {}
  for i = 1, n do
    local k = T.randint(1, #alphabet + 1)
    parts[i] = alphabet:sub(k, k)
  end
  return table.concat(parts)
end

local function random_bytes(n)
  local b = {}
  for i = 1, n do b[i] = string.char(T.randint(0, 256)) end
  return table.concat(b)
end

local TEXT = ("the quick brown fox jumps over the lazy dog. It's the dog's day!\n"):rep(40)
  .. "caf\195\169 na\195\175ve \228\184\173\230\150\135 12345\n"

test("train_bpe: vocab size, compression and exact round trips", function()
  local tok = tokenizer.train_bpe(TEXT, {vocab = 300, special_tokens = {"<|endoftext|>"}})
  equal(tok.vocab_size, 300)
  equal(tok.kind, "bpe")
  equal(tok:num_merges(), 300 - 256 - 1)
  local ids = tok:encode(TEXT)
  assert(#ids < #TEXT / 2, "merges should compress the training text: " .. #ids)
  equal(tok:decode(ids), TEXT)
  for rep = 1, 20 do
    local s = random_bytes(T.randint(0, 400)) .. "\0\255\192\128" .. TEXT:sub(1, rep * 10)
    equal(tok:decode(tok:encode(s)), s)
  end
  equal(tok:encode(""), {})
  equal(tok:decode({}), "")
  assert(tostring(tok):find("Tokenizer%(bpe, vocab_size=300"), tostring(tok))
end)

test("special tokens: matched when allowed, never merged, decode to their text", function()
  local text = ("hello world<|endoftext|>"):rep(50)
  local tok = tokenizer.train_bpe(text, {vocab = 280, special_tokens = {"<|endoftext|>", "<|pad|>"}})
  local eot, pad = tok:token_id("<|endoftext|>"), tok:token_id("<|pad|>")
  equal({eot, pad}, {tok.vocab_size - 2, tok.vocab_size - 1})
  assert(tok:is_special(eot) and not tok:is_special(0))
  equal(tok:special_tokens(), {["<|endoftext|>"] = eot, ["<|pad|>"] = pad})
  equal(tok:token_id("<|nope|>"), nil)
  local ids = tok:encode("hi<|endoftext|><|pad|>")
  equal({ids[#ids - 1], ids[#ids]}, {eot, pad})
  equal(tok:decode(ids), "hi<|endoftext|><|pad|>")
  local plain = tok:encode("hi<|endoftext|>", {allow_special = false})
  for _, id in ipairs(plain) do assert(not tok:is_special(id), "a special id in plain text") end
  equal(tok:decode(plain), "hi<|endoftext|>")
  for id = 256, tok.vocab_size - 3 do assert(not tok:token(id):find("|", 1, true), "a merge crossed a special token") end
  local V = tok.vocab_size -- the corpus ran out of pairs before 280
  assert(V > 260 and V < 280, V)
  local id = tok:add_special("<|im_start|>")
  equal(id, V)
  equal(tok.vocab_size, V + 1)
  equal(tok:encode("<|im_start|>"), {V})
end)

test("train_bpe from a path equals training on the text", function()
  local path = tmpname(".txt")
  local f = assert(io.open(path, "wb"))
  f:write(TEXT)
  f:close()
  local a = tokenizer.train_bpe(path, {vocab = 320})
  local b = tokenizer.train_bpe(TEXT, {vocab = 320})
  local c = tokenizer.train_bpe(path, {vocab = 320, is_text = true}) -- the path's own characters
  os.remove(path)
  equal(a:fingerprint(), b:fingerprint())
  assert(a:fingerprint() ~= c:fingerprint())
  equal(#a:fingerprint(), 16)
end)

test("char: the sorted characters of the text, as the PyTorch peer builds its vocab", function()
  local text = "hello w\195\182rld\n\228\184\173!"
  local tok = tokenizer.char(text)
  equal(tok.kind, "char")
  -- sorted(set(text)) by code point; UTF-8 byte order is code point order
  local set, chars = {}, {}
  for ch in text:gmatch("[%z\1-\127\194-\244][\128-\191]*") do
    if not set[ch] then set[ch], chars[#chars + 1] = true, ch end
  end
  table.sort(chars)
  equal(tok.vocab_size, #chars)
  for i, ch in ipairs(chars) do equal(tok:token(i - 1), ch) end
  local ids = tok:encode("world!")
  equal(tok:decode(ids), "world!")
  equal(ids[1], tok:token_id("w"))
  fails("character U+0078", function() tok:encode("x") end)
  local with = tokenizer.char(text .. "\255", {special_tokens = {"<eot>"}})
  equal(with:decode(with:encode("h<eot>\255")), "h<eot>\255")
  equal(with:token_id("<eot>"), with.vocab_size - 1)
end)

test("Hugging Face fixtures: the ids the tokenizers library gave", function()
  local f = assert(io.open(data_dir .. "/tokenizer_hf_expected.txt", "rb"))
  local toks, cases = {}, 0
  for line in f:lines() do
    local file, hex, list = line:match("^(%S+) (%S+) (%S+)$")
    if file then
      toks[file] = toks[file] or tokenizer.load(data_dir .. "/" .. file)
      local text = hex == "-" and "" or hex:gsub("%x%x", function(h) return string.char(tonumber(h, 16)) end)
      local want = {}
      if list ~= "-" then for id in list:gmatch("%d+") do want[#want + 1] = tonumber(id) end end
      equal(toks[file]:encode(text), want, file .. " '" .. text .. "'")
      cases = cases + 1
    end
  end
  f:close()
  assert(cases >= 40, "fixture cases: " .. cases)
  -- a prefix space before every word: more ids than bytes, encode retries with a larger buffer
  local qwen = toks["tokenizer_hf_qwen2_prefix.json"]
  local ids = qwen:encode("7")
  equal(#ids, 2)
  equal(qwen:decode(ids), " 7")
  local arr, n = qwen:encode_ids("0987654321")
  assert(n > 11, n)
  equal(qwen:decode(arr, n), " 0 9 8 7 6 5 4 3 2 1")
end)

test("save and load: the same tokenizer, and the same file again", function()
  local tok = tokenizer.train_bpe(TEXT, {vocab = 290, special_tokens = {"<|endoftext|>"}})
  local p1, p2 = tmpname(".json"), tmpname(".json")
  equal(tok:save(p1), p1)
  local back = tokenizer.load(p1)
  equal(back.vocab_size, tok.vocab_size)
  equal(back:fingerprint(), tok:fingerprint())
  equal(back:encode(TEXT .. "<|endoftext|>"), tok:encode(TEXT .. "<|endoftext|>"))
  back:save(p2)
  local a, b = io.open(p1, "rb"), io.open(p2, "rb")
  equal(a:read("*a") == b:read("*a"), true)
  a:close()
  b:close()
  local chars = tokenizer.char(TEXT)
  chars:save(p2)
  local cback = tokenizer.load(p2)
  equal(cback.kind, "char")
  equal(cback:encode(TEXT), chars:encode(TEXT))
  os.remove(p1)
  os.remove(p2)
end)

test("encode_tensor and decode of tensors and cdata arrays", function()
  local lt = require "lutra"
  local tok = tokenizer.train_bpe(TEXT, {vocab = 300})
  local ids = tok:encode(TEXT)
  local t = tok:encode_tensor(TEXT)
  equal(t.dtype, "i32")
  equal(t.shape, {#ids})
  equal(t:tolist(), ids)
  equal(tok:decode(t), TEXT)
  equal(tok:decode(t:to("i64")), TEXT)
  local arr, n = tok:encode_ids(TEXT)
  equal(n, #ids)
  equal(tok:decode(arr, n), TEXT)
  equal(tok:encode_tensor("").shape, {0})
  local _ = lt
end)

test("load_or_train: trains once, then loads the cache; a changed corpus trains again", function()
  local dir = tmpname("")
  os.execute("mkdir -p " .. dir)
  local path = dir .. "/corpus.txt"
  local f = assert(io.open(path, "wb"))
  f:write(TEXT)
  f:close()
  -- the default cache directory (lutra.data.cache_dir): never beside the corpus
  local ffi = require "ffi"
  pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
  ffi.C.setenv("LUTRA_CACHE_DIR", dir .. "/cache", 1)
  local tok, cache = tokenizer.load_or_train(path, {vocab = 280})
  assert(cache:find(dir .. "/cache/corpus.txt-", 1, true) == 1 and cache:find(".bpe280-", 1, true), cache)
  equal(io.popen("ls '" .. dir .. "'"):read("*a"), "cache\ncorpus.txt\n")
  assert(io.open(cache, "rb"), "no cache file at " .. cache)
  local again, cache2 = tokenizer.load_or_train(path, {vocab = 280})
  equal(cache2, cache)
  equal(again:fingerprint(), tok:fingerprint())
  local chars, ccache = tokenizer.load_or_train(path, {kind = "char", dir = dir})
  equal(chars.kind, "char")
  assert(ccache:find(".char-", 1, true), ccache)
  f = assert(io.open(path, "ab"))
  f:write("more text zzz")
  f:close()
  local changed, cache3 = tokenizer.load_or_train(path, {vocab = 280})
  assert(cache3 ~= cache, "the cache name must follow the corpus")
  equal(changed:decode(changed:encode("zzz")), "zzz")
  local nocache, where = tokenizer.load_or_train(path, {vocab = 270, dir = "/nonexistent/dir"}) -- warns, works
  equal(where, nil)
  equal(nocache.vocab_size, 270)
  os.execute("rm -rf " .. dir)
end)

test("errors name the call and what is wrong", function()
  local tok = tokenizer.train_bpe(TEXT, {vocab = 280})
  fails("train_bpe: expected a text or a path, got number", function() tokenizer.train_bpe(5) end)
  fails("vocab_size 100 out of range", function() tokenizer.train_bpe(TEXT, {vocab = 100}) end)
  fails("unknown option 'vocab_size'", function() tokenizer.train_bpe(TEXT, {vocab_size = 300}) end)
  fails("special_tokens[1] must be a string", function() tokenizer.train_bpe(TEXT, {special_tokens = {5}}) end)
  fails("decode: ids[2] must be an integer", function() tok:decode({1, 1.5}) end)
  fails("id 9999 at position 0 is out of range", function() tok:decode({9999}) end)
  fails("encode: expected a string, got table", function() tok:encode({}) end)
  fails("call it as tok:encode", function() tok.encode("abc") end)
  fails("unknown option 'special'", function() tok:encode("abc", {special = false}) end)
  fails("cannot open", function() tokenizer.load("/nonexistent/tokenizer.json") end)
  fails("cannot open the corpus", function() tokenizer.load_or_train("/nonexistent/corpus.txt") end)
  fails("kind must be 'bpe' or 'char'", function() tokenizer.load_or_train("x", {kind = "wordpiece"}) end)
  local bad = tmpname(".json")
  local f = assert(io.open(bad, "wb"))
  f:write('{"model": {"type": "Unigram", "vocab": {}}, "pre_tokenizer": {"type": "ByteLevel"}}')
  f:close()
  fails("model.type 'Unigram' is not supported", function() tokenizer.load(bad) end)
  f = assert(io.open(bad, "wb"))
  f:write('{"model": {"type": "BPE", "vocab": {"a": 0')
  f:close()
  fails("not valid JSON", function() tokenizer.load(bad) end)
  os.remove(bad)
  -- the message points at the caller's line
  local line = debug.getinfo(1, "l").currentline + 1
  local ok, msg = pcall(function() tok:decode({-1}) end)
  assert(not ok and msg:find("test_tokenizer.lua:" .. line, 1, true), msg)
end)
