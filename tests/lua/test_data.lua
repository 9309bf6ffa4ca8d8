-- lutra.data: tokenizing into token files (chunked = whole-text encoding, reuse and its
-- invalidation), header errors, the peer's train/val split, deterministic random windows,
-- exact resume from the state table, sequential windows, data-parallel sharding.
local lt = require "lutra"
local data = require "lutra.data"
local T = require "lutra.testing"
local ffi = require "ffi"
local equal, fails = T.assert_equal, T.assert_error
local files = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "file_helpers.lua")
local read, write = files.read, files.write

local dir = files.temp_dir()
-- the default cache directory of this process (lutra.data.cache_dir reads it): inside dir
ffi.cdef "int setenv(const char *name, const char *value, int overwrite);"
local cache = dir .. "/cache"
ffi.C.setenv("LUTRA_CACHE_DIR", cache, 1)

-- A char-level tokenizer as the peer's: ids are the positions of the sorted distinct characters.
local function char_tokenizer(text, reverse)
  local set, chars = {}, {}
  for c in text:gmatch(".") do set[c] = true end
  for c in pairs(set) do chars[#chars + 1] = c end
  table.sort(chars, reverse and function(a, b) return a > b end or nil)
  local stoi = {}
  for i, c in ipairs(chars) do stoi[c] = i - 1 end
  return {
    vocab_size = #chars,
    encode = function(_, s)
      local ids = {}
      for i = 1, #s do ids[i] = stoi[s:sub(i, i)] or error("unknown character " .. s:sub(i, i)) end
      return ids
    end,
    decode = function(_, ids)
      local out = {}
      for i, id in ipairs(ids) do out[i] = chars[id + 1] end
      return table.concat(out)
    end,
  }
end

-- Deterministic text: words, spaces, newlines, blank lines.
local function make_text(nbytes, seed)
  T.seed(seed or 1)
  local words = {"to", "be", "or", "not", "that", "is", "the", "question", "Whether", "'tis", "nobler", "mind,"}
  local out, n = {}, 0
  while n < nbytes do
    local w = words[T.randint(1, #words + 1)]
    local r = T.uniform()
    local sep = r < 0.08 and "\n" or (r < 0.1 and "\n\n" or " ")
    out[#out + 1] = w .. sep
    n = n + #w + #sep
  end
  return table.concat(out)
end

local function list_tmp_files(d)
  local p = io.popen("ls -a '" .. d .. "'")
  local names = {}
  for name in p:lines() do
    if name:find("%.tmp%.") then names[#names + 1] = name end
  end
  p:close()
  return names
end

local function fnv(s)
  local h = ffi.new("uint64_t[1]", 0xcbf29ce484222325ULL)
  lt.C.lt_hash64(s, #s, h)
  return bit.tohex(h[0], 16)
end

test("tokenize_file: chunked encoding equals the whole text's, header fields", function()
  local text = make_text(30000, 1)
  local path = dir .. "/corpus.txt"
  write(path, text)
  local tok = char_tokenizer(text)
  local bin, info = data.tokenize_file(path, tok, {chunk_bytes = 1000, quiet = true})
  -- in the cache directory, never beside the text (whose folder may be read-only)
  local real = io.popen("realpath '" .. path .. "'"):read("*l")
  equal(bin, cache .. "/corpus.txt-" .. fnv(real):sub(1, 8) .. ".tok-" .. data.fingerprint(tok):sub(1, 8) .. ".bin")
  equal(io.popen("ls '" .. dir .. "' | grep -c '^corpus.txt'"):read("*l"), "1")
  equal(info.reused, false)
  equal(info.count, #text)
  equal(info.vocab_size, tok.vocab_size)
  equal(info.token_bytes, 2)
  equal(info.source_bytes, #text)
  equal(info.source_hash, fnv(text))
  equal(info.tokenizer_hash, data.fingerprint(tok))
  local f = data.open(bin)
  f:verify()
  equal(f:tokens(0, f.count):tolist(), tok:encode(text))
  equal(#read(bin), 128 + 2 * #text)
  equal(read(bin):sub(1, 8), "LUTRATOK")
  equal(f:tokens(5, 3, "i32").dtype, "i32")
  equal(f:tokens(5, 3, "i32"):tolist(), {unpack(tok:encode(text:sub(6, 8)))})
  -- a text with no newline at all is cut at character boundaries and still round-trips
  local line = ("abc def "):rep(2000)
  write(dir .. "/line.txt", line)
  local t2 = char_tokenizer(line)
  local b2 = data.tokenize_file(dir .. "/line.txt", t2, {chunk_bytes = 500})
  equal(data.open(b2):tokens(0, #line):tolist(), t2:encode(line))
  -- tokenizers with encode_ids (an int32_t array and its length) skip the Lua list
  local fast, calls = char_tokenizer(text), 0
  fast.encode_ids = function(self, s)
    calls = calls + 1
    local ids = self:encode(s)
    return ffi.new("int32_t[?]", #ids + 1, ids), #ids -- a table without [0] fills from ids[1]
  end
  local b3 = data.tokenize_file(path, fast, dir .. "/fast.bin", {chunk_bytes = 4000})
  equal(data.open(b3):tokens(0, #text):tolist(), tok:encode(text))
  assert(calls > 1, "encode_ids was used")
  equal(list_tmp_files(dir), {})
end)

test("tokenize_file: reuse, and what invalidates the token file", function()
  local text = make_text(5000, 2)
  local path = dir .. "/reuse.txt"
  local bin = dir .. "/reuse.bin"
  write(path, text)
  local tok = char_tokenizer(text)
  equal(select(2, data.tokenize_file(path, tok, bin)).reused, false)
  equal(select(2, data.tokenize_file(path, tok, bin)).reused, true)
  equal(select(2, data.tokenize_file(path, tok, bin, {force = true})).reused, false)
  -- another tokenizer (same vocabulary, other ids): tokenized again, with its ids
  local other = char_tokenizer(text, true)
  local _, info = data.tokenize_file(path, other, bin)
  equal(info.reused, false)
  equal(data.open(bin):tokens(0, 50):tolist(), {unpack(other:encode(text:sub(1, 50)))})
  equal(select(2, data.tokenize_file(path, other, bin)).reused, true)
  -- the text changes size
  write(path, text .. "to be")
  _, info = data.tokenize_file(path, other, bin)
  equal(info.reused, false)
  equal(info.count, #text + 5)
  -- same size, another modification time
  assert(os.execute("touch -m -d @1000000000 '" .. path .. "'"))
  equal(select(2, data.tokenize_file(path, other, bin)).reused, false)
  equal(select(2, data.tokenize_file(path, other, bin)).reused, true)
  -- a corrupt cache is rebuilt
  write(bin, "garbage")
  equal(select(2, data.tokenize_file(path, other, bin)).reused, false)
  -- a tokenizer's own fingerprint() is used when it has one
  local a, b = char_tokenizer(text), char_tokenizer(text)
  a.fingerprint = function() return "v1" end
  b.fingerprint = function() return "v2" end
  assert(data.fingerprint(a) ~= data.fingerprint(b), "fingerprints should differ")
  equal(data.fingerprint(char_tokenizer(text)), data.fingerprint(char_tokenizer(text)))
  assert(data.fingerprint(tok) ~= data.fingerprint(other), "order of ids must matter")
end)

test("tokenize_file and open: errors name the file, leave nothing behind", function()
  local text = make_text(3000, 3)
  local path = dir .. "/bad.txt"
  write(path, text)
  local tok = char_tokenizer(text)
  local liar = char_tokenizer(text)
  liar.vocab_size = 3 -- emits ids it does not count
  fails("out of range [0, 3)", function() data.tokenize_file(path, liar, dir .. "/liar.bin") end)
  equal(io.open(dir .. "/liar.bin") == nil, true)
  equal(list_tmp_files(dir), {})
  fails("unknown character", function() data.tokenize_file(path, char_tokenizer("xyz"), dir .. "/u.bin") end)
  equal(list_tmp_files(dir), {})
  fails("cannot read the text", function() data.tokenize_file(dir .. "/nope.txt", tok) end)
  fails("expected a tokenizer", function() data.tokenize_file(path, 42) end)
  write(dir .. "/junk.bin", ("x"):rep(300))
  fails("junk.bin': not a lutra token file", function() data.open(dir .. "/junk.bin") end)
  local bin = data.tokenize_file(path, tok, dir .. "/ok.bin")
  local bytes = read(bin)
  write(dir .. "/short.bin", bytes:sub(1, #bytes - 1))
  fails("short.bin': truncated", function() data.open(dir .. "/short.bin") end)
  write(dir .. "/v9.bin", bytes:sub(1, 8) .. "\9" .. bytes:sub(10))
  fails("format version 9", function() data.open(dir .. "/v9.bin") end)
  fails("cannot open", function() data.open(dir .. "/none.bin") end)
  local hdr, msg = data.read_header(dir .. "/v9.bin")
  equal(hdr, nil)
  assert(msg:find("v9.bin", 1, true), msg)
end)

-- bytes with the tokens hash of the header (offset 40) recomputed: a file consistent in itself
local function rehash(bytes)
  local h = ffi.new("uint64_t[1]", 0xcbf29ce484222325ULL)
  lt.C.lt_hash64(bytes:sub(129), #bytes - 128, h)
  local le = ffi.new("uint64_t[1]", h[0])
  return bytes:sub(1, 40) .. ffi.string(ffi.cast("char *", le), 8) .. bytes:sub(49)
end

local function u16(v) return string.char(v % 256, math.floor(v / 256)) end

test("verify: damaged tokens are an error naming the file and offset; a damaged cache is tokenized again", function()
  local text = make_text(4000, 6)
  local path = dir .. "/verify.txt"
  write(path, text)
  local tok = char_tokenizer(text)
  local V = tok.vocab_size
  local bin, _, file = data.tokenize_file(path, tok, {cache_dir = dir .. "/vcache"})
  equal(bin:find(dir .. "/vcache/verify.txt-", 1, true), 1)
  equal(file.verified, true)
  local good = read(bin)
  local want = data.open(bin):tokens(0, #text):tolist()
  local mtime = io.popen("stat -c %Y '" .. bin .. "'"):read("*l")
  local function damage(bytes) -- same size, same header, same modification time
    write(bin, bytes)
    assert(os.execute("touch -m -d @" .. mtime .. " '" .. bin .. "'"))
  end
  -- the data zeroed: the checksum differs; reused no more, tokenized again
  damage(good:sub(1, 128) .. ("\0"):rep(#good - 128))
  fails("checksum is", function() data.open(bin):verify() end)
  fails("verify.txt-", function() data.tokens(bin, {seq_len = 8, batch = 2}) end)
  local _, info = data.tokenize_file(path, tok, {cache_dir = dir .. "/vcache"})
  equal(info.reused, false)
  equal(data.open(bin):tokens(0, #text):tolist(), want)
  equal(select(2, data.tokenize_file(path, tok, {cache_dir = dir .. "/vcache"})).reused, true)
  -- an id out of the vocabulary (65535) with a consistent hash: the index and byte offset named
  damage(rehash(good:sub(1, 128 + 2 * 5) .. u16(65535) .. good:sub(128 + 2 * 6 + 1)))
  fails("token 5 (byte offset 138) is 65535, outside the vocabulary [0, " .. V .. ") of the header",
    function() data.tokens(bin, {seq_len = 8, batch = 2}) end)
  fails("verify.txt-", function() data.open(bin):verify() end)
  equal(data.tokens(bin, {seq_len = 8, batch = 2, verify = false}).batch, 2) -- asked not to look
  equal(select(2, data.tokenize_file(path, tok, {cache_dir = dir .. "/vcache"})).reused, false)
  equal(data.open(bin):tokens(0, #text):tolist(), want)
  -- a file made for a larger vocabulary (valid by its own header) against the model's
  local wide = good:sub(1, 24) .. ffi.string(ffi.new("uint64_t[1]", 65536), 8) .. good:sub(33)
  write(dir .. "/wide.bin", rehash(wide:sub(1, 128 + 2 * 7) .. u16(65535) .. wide:sub(128 + 2 * 8 + 1)))
  equal(data.tokens(dir .. "/wide.bin", {seq_len = 8, batch = 2}).vocab_size, 65536)
  fails("wide.bin': token 7 (byte offset 142) is 65535, outside the vocabulary [0, " .. V .. ") of the tokenizer",
    function() data.tokens(dir .. "/wide.bin", {seq_len = 8, batch = 2, vocab_size = V}) end)
  -- reserved header bytes must be zero
  write(dir .. "/reserved.bin", good:sub(1, 100) .. "\1" .. good:sub(102))
  fails("reserved.bin': corrupt header: byte 100 is 1", function() data.open(dir .. "/reserved.bin") end)
  -- the header's vocab_size edited (same tokenizer fingerprint): not reused
  write(bin, good:sub(1, 24) .. ffi.string(ffi.new("uint64_t[1]", V + 1), 8) .. good:sub(33))
  assert(os.execute("touch -m -d @" .. mtime .. " '" .. bin .. "'"))
  equal(select(2, data.tokenize_file(path, tok, {cache_dir = dir .. "/vcache"})).reused, false)
end)

test("split: the peer's first 90% / last 10%", function()
  for _, n in ipairs {0, 1, 9, 10, 11, 99, 1000, 12345, 1115394, 987654321} do
    local s = data.split(n)
    local n_train = math.floor(0.9 * n) -- torch_charlm.py: n = int(0.9 * len(data))
    equal(s.train, {0, n_train})
    equal(s.val, {n_train, n})
  end
  equal(data.split(1115394).train[2], 1003854) -- tiny Shakespeare, char-level
  equal(data.split(1000, 0.25).val, {750, 1000})
  equal(data.split(1000, 0).val, {1000, 1000})
  fails("val_fraction must be in [0, 1)", function() data.split(10, 1) end)
end)

local shared_bin
local function corpus()
  if not shared_bin then
    local text = make_text(20000, 4)
    write(dir .. "/shared.txt", text)
    shared_bin = data.tokenize_file(dir .. "/shared.txt", char_tokenizer(text))
  end
  return shared_bin
end

test("loader: batches are windows of the file, y is x shifted, within the split", function()
  local bin = corpus()
  local f = data.open(bin)
  local all = f:tokens(0, f.count):tolist()
  for _, split in ipairs {"train", "val"} do
    local L = data.tokens(bin, {seq_len = 16, batch = 5, split = split, seed = 3})
    local s = data.split(f.count)[split]
    equal({L.lo, L.hi}, s)
    for _ = 1, 20 do
      local starts = L:peek_starts()
      local x, y = L:next()
      equal(x.shape, {5, 16})
      equal(x.dtype, "i64")
      local xl, yl = x:tolist(), y:tolist()
      for r = 1, 5 do
        local st = starts[r]
        assert(st >= s[1] and st < s[2] - 16 - 1, "start " .. st .. " outside " .. split)
        for t = 1, 16 do
          equal(xl[r][t], all[st + t])
          equal(yl[r][t], all[st + t + 1])
        end
      end
    end
  end
  local x = data.tokens(bin, {seq_len = 4, batch = 2, dtype = "i32"}):next()
  equal(x.dtype, "i32")
end)

test("loader: deterministic from the seed, uniform over the peer's range", function()
  local bin = corpus()
  local a = data.tokens(bin, {seq_len = 8, batch = 4, seed = 7})
  local b = data.tokens(bin, {seq_len = 8, batch = 4, seed = 7})
  local c = data.tokens(bin, {seq_len = 8, batch = 4, seed = 8})
  local v = a:with{split = "val"}
  local differ = 0
  for _ = 1, 5 do
    local xa, xb, xc = a:next(), b:next(), c:next()
    equal(xa:tolist(), xb:tolist())
    if not T.equal(xa:tolist(), xc:tolist()) then differ = differ + 1 end
    equal(v:next().shape, {4, 8})
  end
  equal(differ, 5)
  equal(v.split, "val")
  equal(v.seed, 7)
  -- a small split: every start in [lo, hi - T - 1), and both ends reached
  local text = make_text(110, 5)
  write(dir .. "/small.txt", text)
  local small = data.tokenize_file(dir .. "/small.txt", char_tokenizer(text), dir .. "/small.bin")
  local L = data.tokens(small, {seq_len = 10, batch = 8, split = "all"})
  local n, seen, count = L.ntokens, {}, 0
  for _ = 1, 200 do
    for _, st in ipairs(L:peek_starts()) do
      assert(st >= 0 and st < n - 11, "start " .. st)
      if not seen[st] then seen[st], count = true, count + 1 end
    end
    L:next()
  end
  equal(count, n - 11)
end)

test("loader: state after k batches resumes exactly; reset", function()
  local bin = corpus()
  for _, shuffle in ipairs {true, false} do
    local opts = {seq_len = 12, batch = 6, seed = 11, shuffle = shuffle}
    local a = data.tokens(bin, opts)
    local first = a:next():tolist()
    for _ = 1, 4 do a:next() end
    local st = a:state()
    equal(st, {seed = 11, step = 5, epoch = a:state().epoch})
    for k in pairs(st) do assert(k == "seed" or k == "step" or k == "epoch", k) end
    local expect = {}
    for i = 1, 3 do expect[i] = {a:next():tolist()} end
    local b = data.tokens(bin, {seq_len = 12, batch = 6, seed = 99, shuffle = shuffle})
    b:set_state(st)
    equal(b.seed, 11)
    for i = 1, 3 do equal({b:next():tolist()}, expect[i]) end
    b:reset()
    equal(b:next():tolist(), first)
  end
  local a = data.tokens(bin, {seq_len = 4, batch = 2})
  fails("step must be a non-negative integer", function() a:set_state{step = -1} end)
  fails("expected a table", function() a:set_state(3) end)
  -- batches made inside tidy scopes do not take the loader's buffers with them
  lt.tidy(function() a:next() end)
  equal(a:next().shape, {2, 4})
end)

test("loader: sequential windows cover the split in order; epochs", function()
  local bin = corpus()
  local L = data.tokens(bin, {seq_len = 100, batch = 7, shuffle = false, split = "val"})
  local W = math.floor((L.ntokens - 1) / 100)
  equal(L.windows, W)
  local f = data.open(bin)
  local all = f:tokens(0, f.count):tolist()
  local k = 0
  for s = 0, math.ceil(W / 7) + 1 do
    local starts = L:peek_starts()
    local x = L:next():tolist()
    for r = 1, 7 do
      equal(starts[r], L.lo + (k % W) * 100)
      equal(x[r][1], all[starts[r] + 1])
      k = k + 1
    end
    equal(L:state().epoch, math.floor((s + 1) * 7 / W))
  end
end)

test("loader: data-parallel ranks split the global batch; union = single process", function()
  local bin = corpus()
  for _, shuffle in ipairs {true, false} do
    for _, dp in ipairs {2, 4} do
      local single = data.tokens(bin, {seq_len = 9, batch = 8, seed = 5, shuffle = shuffle})
      local ranks = {}
      for r = 0, dp - 1 do
        ranks[r + 1] = data.tokens(bin, {seq_len = 9, batch = 8, seed = 5, shuffle = shuffle, dp_rank = r,
                                         dp_size = dp})
      end
      for _ = 1, 3 do
        local x, y = single:next()
        local xs, ys = {}, {}
        for r = 1, dp do
          local xr, yr = ranks[r]:next()
          equal(xr.shape, {8 / dp, 9})
          for _, row in ipairs(xr:tolist()) do xs[#xs + 1] = row end
          for _, row in ipairs(yr:tolist()) do ys[#ys + 1] = row end
        end
        equal(xs, x:tolist())
        equal(ys, y:tolist())
      end
    end
  end
  local m = data.tokens(bin, {seq_len = 9, batch = 8, mesh = {dp_rank = 1, dp_size = 2}})
  equal({m.dp_rank, m.dp_size, m.local_batch}, {1, 2, 4})
  m = data.tokens(bin, {seq_len = 9, batch = 8, mesh = {dp = {rank = function() return 3 end, size = 4}}})
  equal({m.dp_rank, m.dp_size, m.local_batch}, {3, 4, 2})
  fails("does not divide among 3", function() data.tokens(bin, {seq_len = 9, batch = 8, dp_size = 3}) end)
  fails("dp_rank 2 is not below dp_size 2",
    function() data.tokens(bin, {seq_len = 9, batch = 8, dp_size = 2, dp_rank = 2}) end)
end)

test("loader: option errors", function()
  local bin = corpus()
  fails("seq_len must be an integer >= 1", function() data.tokens(bin, {batch = 2}) end)
  fails("batch must be an integer >= 1", function() data.tokens(bin, {seq_len = 2, batch = 0}) end)
  fails("split must be", function() data.tokens(bin, {seq_len = 2, batch = 1, split = "test"}) end)
  fails("the val split of", function() data.tokens(bin, {seq_len = 1e6, batch = 1, split = "val"}) end)
  fails("has 0 tokens", function() data.tokens(bin, {seq_len = 4, batch = 1, split = "val", val_fraction = 0}) end)
  fails("dtype must be i64 or i32", function() data.tokens(bin, {seq_len = 4, batch = 1, dtype = "f32"}) end)
  local s = tostring(data.tokens(bin, {seq_len = 4, batch = 2, dp_size = 2, dp_rank = 1}))
  assert(s:find("train split", 1, true) and s:find("dp rank 1 of 2", 1, true), s)
end)

test("text: tokenizes once, then loads", function()
  local text = make_text(8000, 6)
  local path = dir .. "/text.txt"
  write(path, text)
  local tok = char_tokenizer(text)
  local L = data.text(path, tok, {seq_len = 32, batch = 4, cache = dir .. "/text.bin"})
  equal(L.vocab_size, tok.vocab_size)
  equal(L.text_path, path)
  local x, y = L:next()
  local row = x:tolist()[1]
  equal(tok:decode(row), text:sub(L:peek_starts(0)[1] + 1, L:peek_starts(0)[1] + 32))
  equal(y:tolist()[1][31], row[32])
  os.execute("rm -rf '" .. dir .. "'")
end)
