-- lutra.tokenizer — byte-level BPE (as GPT-2's) and char-level tokenizers over the C core.
--
--   local tokenizer = require "lutra.tokenizer"
--   local tok = tokenizer.train_bpe("corpus.txt", {vocab = 4096, special_tokens = {"<|endoftext|>"}})
--   local ids = tok:encode("Hello world")      -- {15496, 995}: a Lua list of 0-based ids
--   print(tok:decode(ids), tok.vocab_size)
--   tok:save("tokenizer.json")                  -- Hugging Face's format; tokenizer.load reads it back
--   local chars = tokenizer.char(text)          -- vocab: the sorted characters of text
--   local tok = tokenizer.load_or_train("corpus.txt", {vocab = 8192})  -- trains once, then loads
--
-- Ids are 0-based (they index embedding rows). Decoding a byte-level tokenizer's ids gives back
-- the encoded bytes exactly, whatever they are (NUL, invalid UTF-8); one with decoders (a
-- sentencepiece-style tokenizer.json) decodes as Hugging Face's decode(ids). Special tokens in
-- the text are matched unless encode's opts say allow_special = false; they decode to their text.
-- A tokenizer.json's post-processor (TemplateProcessing: Llama 3's BOS) adds its special tokens
-- as Hugging Face's encode(text) does, unless opts say add_special_tokens = false.
--   local ids, starts, ends = tok:encode_offsets("Hello world")  -- and each id's byte range
--   tok:encode("question", {pair = "answer"})   -- a pair, with the pair template's specials
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local ffi, C = lt.ffi, lt.C

local M = {}
local raise, fail = errors.raise, errors.fail

local Tokenizer = {}
Tokenizer.__index = Tokenizer
M.Tokenizer = Tokenizer

local handle_out = ffi.new("lt_tokenizer *[1]")

local function wrap(rc)
  if rc ~= 0 then fail() end
  local h = ffi.gc(handle_out[0], C.lt_tokenizer_free)
  handle_out[0] = nil
  return setmetatable({handle = h, vocab_size = C.lt_tokenizer_vocab_size(h),
                       kind = ffi.string(C.lt_tokenizer_kind_name(h))}, Tokenizer)
end

local function check_opts(op, opts, allowed)
  if opts == nil then return {} end
  if type(opts) ~= "table" then raise(op .. ": opts must be a table, got " .. type(opts)) end
  for k in pairs(opts) do
    if not allowed[k] then
      local names = {}
      for name in pairs(allowed) do names[#names + 1] = name end
      table.sort(names)
      raise(string.format("%s: unknown option '%s' (expected %s)", op, tostring(k), table.concat(names, ", ")))
    end
  end
  return opts
end

-- special_tokens list -> (const char *[n], n), kept alive by the returned table.
local function specials_arg(op, list)
  if list == nil then return nil, 0 end
  if type(list) ~= "table" then raise(op .. ": special_tokens must be a list of strings, got " .. type(list)) end
  local n = #list
  local arr = ffi.new("const char *[?]", n > 0 and n or 1)
  for i = 1, n do
    if type(list[i]) ~= "string" then raise(string.format("%s: special_tokens[%d] must be a string, got %s", op, i, type(list[i]))) end
    arr[i - 1] = list[i]
  end
  return arr, n, list
end

-- A string names a file when it is short, one line, and a file of that name opens.
local function is_path(s)
  if #s == 0 or #s > 4096 or s:find("[\n%z]") then return false end
  local f = io.open(s, "rb")
  if f then f:close() end
  return f ~= nil
end

-- ---- constructors ------------------------------------------------------------------------

-- Byte-level BPE trained on a text or a file. opts: vocab (total size, special tokens
-- included; default 4096), special_tokens (list of strings), is_text = true (never a path).
function M.train_bpe(text_or_path, opts)
  opts = check_opts("train_bpe", opts, {vocab = true, special_tokens = true, is_text = true})
  if type(text_or_path) ~= "string" then raise("train_bpe: expected a text or a path, got " .. type(text_or_path)) end
  local vocab = opts.vocab or 4096
  if type(vocab) ~= "number" or vocab ~= math.floor(vocab) then raise("train_bpe: vocab must be an integer, got " .. tostring(vocab)) end
  local sp, nsp, keep = specials_arg("train_bpe", opts.special_tokens)
  local rc
  if not opts.is_text and is_path(text_or_path) then
    rc = C.lt_tokenizer_train_bpe_file(handle_out, text_or_path, vocab, sp, nsp)
  else
    rc = C.lt_tokenizer_train_bpe(handle_out, text_or_path, #text_or_path, vocab, sp, nsp)
  end
  local _ = keep
  return wrap(rc)
end

-- Char-level: one token per distinct character of text, sorted by code point (as
-- Python's sorted(set(text))). opts: special_tokens (appended after the characters).
function M.char(text, opts)
  opts = check_opts("char", opts, {special_tokens = true})
  if type(text) ~= "string" then raise("char: expected a string, got " .. type(text)) end
  local sp, nsp, keep = specials_arg("char", opts.special_tokens)
  local rc = C.lt_tokenizer_new_char(handle_out, text, #text, sp, nsp)
  local _ = keep
  return wrap(rc)
end

-- A tokenizer.json (Hugging Face's: a BPE model with the normalizers, pre-tokenizers,
-- decoders and post-processors lutra.h lists) or a file saved by tok:save.
function M.load(path)
  if type(path) ~= "string" then raise("tokenizer.load: path must be a string, got " .. type(path)) end
  return wrap(C.lt_tokenizer_load(handle_out, path))
end

-- Size and modification time of a file (mtime 0 where the C helper is missing).
local file_stat = lt.fn("lt_file_stat")
local stat_size, stat_mtime = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
local function stat(path)
  local ok, rc = pcall(file_stat, path, stat_size, stat_mtime)
  if ok and rc == 0 then return tonumber(stat_size[0]), tonumber(stat_mtime[0]) end
  local f = io.open(path, "rb")
  if not f then return nil end
  local size = f:seek("end")
  f:close()
  return size, 0
end

local function fnv_hex(s) -- 64-bit FNV-1a, 8 hex digits of it, for cache file names
  local h = 0xcbf29ce484222325ULL
  for i = 1, #s do h = bit.bxor(h, s:byte(i)) * 0x100000001b3ULL end
  return bit.tohex(h):sub(1, 8)
end

-- Trains a tokenizer for the corpus at path once and caches it as JSON in opts.dir (default:
-- lutra.data.cache_dir(), never beside the corpus); later calls load the cache while the
-- corpus keeps its path, size and modification time. opts: kind = "bpe" (default) or "char",
-- vocab, special_tokens, dir, force = true (train again). Returns the tokenizer and the
-- cache's path (nil when it could not be written).
function M.load_or_train(path, opts)
  opts = check_opts("load_or_train", opts, {kind = true, vocab = true, special_tokens = true, dir = true, force = true})
  if type(path) ~= "string" then raise("load_or_train: path must be a string, got " .. type(path)) end
  local kind = opts.kind or "bpe"
  if kind ~= "bpe" and kind ~= "char" then raise("load_or_train: kind must be 'bpe' or 'char', got " .. tostring(kind)) end
  local size, mtime = stat(path)
  if not size then raise("load_or_train: cannot open the corpus '" .. path .. "'") end
  local specials = opts.special_tokens or {}
  local sp, nsp = specials_arg("load_or_train", specials)
  local vocab = opts.vocab or 4096
  if type(vocab) ~= "number" or vocab ~= math.floor(vocab) then
    raise("load_or_train: vocab must be an integer, got " .. tostring(vocab))
  end
  local data = require "lutra.data"
  local base = data.cache_name(path) -- the corpus's name and a hash of its absolute path
  local key = table.concat({kind, vocab, size, mtime, table.concat(specials, "\0"), base}, "\1")
  local dir, why = opts.dir, nil -- as given (not created): the save below warns when it cannot write there
  if dir == nil then
    local ok, default = pcall(data.cache_dir)
    dir, why = ok and default or nil, not ok and tostring(default) or nil
  end
  local name = kind == "bpe" and ("%s.bpe%d-%s.tokenizer.json"):format(base, vocab, fnv_hex(key))
    or ("%s.char-%s.tokenizer.json"):format(base, fnv_hex(key))
  local cache = dir and dir .. "/" .. name
  if cache and not opts.force then
    local ok, tok = pcall(M.load, cache)
    if ok then return tok, cache end
  end
  local tok
  if kind == "bpe" then
    tok = wrap(C.lt_tokenizer_train_bpe_file(handle_out, path, vocab, sp, nsp))
  else
    local f = io.open(path, "rb")
    if not f then raise("load_or_train: cannot open the corpus '" .. path .. "'") end
    local text = f:read("*a")
    f:close()
    tok = M.char(text, {special_tokens = specials})
  end
  if not cache or C.lt_tokenizer_save(tok.handle, cache) ~= 0 then -- a read-only place: work on, without a cache
    io.stderr:write("lutra.tokenizer: cannot cache the tokenizer (" .. (why or ffi.string(C.lt_last_error())) .. ")\n")
    return tok, nil
  end
  return tok, cache
end

-- ---- methods ---------------------------------------------------------------------------------

local ids_buf, ids_cap = nil, 0
local count = ffi.new("int64_t[1]")

-- The flags of lt_tokenizer_encode from opts: allow_special, add_special_tokens (both default
-- true); and opts.pair (a second sequence, as Hugging Face's encode(text, pair)) where allowed.
local function allow_of(op, opts, pair_ok)
  if opts == nil then return C.LT_TOK_ALLOW_SPECIAL end
  opts = check_opts(op, opts, {allow_special = true, add_special_tokens = true, pair = pair_ok})
  if opts.pair ~= nil and type(opts.pair) ~= "string" then
    raise(op .. ": opts.pair must be a string, got " .. type(opts.pair))
  end
  return (opts.allow_special == false and 0 or C.LT_TOK_ALLOW_SPECIAL)
    + (opts.add_special_tokens == false and C.LT_TOK_NO_ADD_SPECIAL or 0), opts.pair
end

local function check_self(op, tok)
  if getmetatable(tok) ~= Tokenizer then raise(op .. ": call it as tok:" .. op .. "(...)") end
  return tok.handle
end

-- Encodes s into buf (int32_t[cap]), or into a larger array when buf is too small (a prefix
-- space per word can give more ids than bytes); returns the array used and the count.
local function encode_into(op, tok, s, opts, buf, cap)
  local h = check_self(op, tok)
  if type(s) ~= "string" then raise(op .. ": expected a string, got " .. type(s)) end
  local allow, pair = allow_of(op, opts, true)
  local function call()
    if pair then return C.lt_tokenizer_encode_pair(h, s, #s, pair, #pair, allow, buf, nil, nil, cap, count) end
    return C.lt_tokenizer_encode(h, s, #s, allow, buf, cap, count)
  end
  if call() ~= 0 then
    local need = tonumber(count[0])
    if need <= cap then fail() end
    buf, cap = ffi.new("int32_t[?]", need), need
    if call() ~= 0 then fail() end
  end
  return buf, tonumber(count[0])
end

-- The ids of s as (int32_t[n] cdata, n); the array is fresh (GC-managed).
function Tokenizer.encode_ids(tok, s, opts)
  local cap = type(s) == "string" and #s + 1 or 1
  return encode_into("encode_ids", tok, s, opts, ffi.new("int32_t[?]", cap), cap)
end

-- The ids of s as a Lua list (1-based list of 0-based ids).
function Tokenizer.encode(tok, s, opts)
  if type(s) == "string" and #s + 1 > ids_cap then
    ids_cap = math.max(#s + 1, 2 * ids_cap, 4096)
    ids_buf = ffi.new("int32_t[?]", ids_cap)
  end
  local buf, n = encode_into("encode", tok, s, opts, ids_buf, ids_cap)
  local out = {}
  for i = 1, n do out[i] = buf[i - 1] end
  return out
end

-- The ids of s as a 1-d i32 tensor.
function Tokenizer.encode_tensor(tok, s, opts)
  local h = check_self("encode_tensor", tok)
  if type(s) ~= "string" then raise("encode_tensor: expected a string, got " .. type(s)) end
  require "lutra.tensor" -- the tensor metatype
  local t = require("lutra.memory").new()
  if C.lt_tokenizer_encode_tensor(t, h, s, #s, (allow_of("encode_tensor", opts))) ~= 0 then fail() end
  return t
end

-- The ids of s with their offsets: three Lua lists (1-based) of 0-based values, ids[i] coming
-- from the bytes [starts[i], ends[i]) of s (half-open, 0-based byte offsets, as Hugging Face's
-- encoding offsets in bytes). A token that covers part of a UTF-8 character (a byte-level piece
-- of an emoji, a <0xXX> byte fallback) gets the whole character; an added token in the text gets
-- its match (with the spaces its lstrip/rstrip took); a special token the post-processor adds
-- (BOS) gets 0, 0. opts as encode's; with opts.pair, the pair's ids index the pair's text.
function Tokenizer.encode_offsets(tok, s, opts)
  local h = check_self("encode_offsets", tok)
  if type(s) ~= "string" then raise("encode_offsets: expected a string, got " .. type(s)) end
  local flags, pair = allow_of("encode_offsets", opts, true)
  local cap = #s + (pair and #pair or 0) + 8
  for _ = 1, 2 do -- the first call says how many ids there are when cap is short
    local ids, st, en = ffi.new("int32_t[?]", cap), ffi.new("int64_t[?]", cap), ffi.new("int64_t[?]", cap)
    local rc = pair and C.lt_tokenizer_encode_pair(h, s, #s, pair, #pair, flags, ids, st, en, cap, count)
      or C.lt_tokenizer_encode_offsets(h, s, #s, flags, ids, st, en, cap, count)
    if rc == 0 then
      local n, out_ids, out_st, out_en = tonumber(count[0]), {}, {}, {}
      for i = 1, n do out_ids[i], out_st[i], out_en[i] = ids[i - 1], tonumber(st[i - 1]), tonumber(en[i - 1]) end
      return out_ids, out_st, out_en
    end
    if tonumber(count[0]) <= cap then fail() end
    cap = tonumber(count[0])
  end
  fail()
end

local decode_len = ffi.new("int64_t[1]")
local Tensor = ffi.typeof("lt_tensor")

-- ids: a Lua list of ids, a tensor of integers, or an int32_t cdata array with n. opts (last):
-- skip_special_tokens = true leaves the special tokens out (Hugging Face's default; lutra's is
-- to keep them).
function Tokenizer.decode(tok, ids, n, opts)
  local h = check_self("decode", tok)
  if type(n) == "table" then n, opts = nil, n end
  opts = check_opts("decode", opts, {skip_special_tokens = true})
  local flags = opts.skip_special_tokens and C.LT_TOK_SKIP_SPECIAL or 0
  local arr
  if type(ids) == "table" then
    n = #ids
    arr = ffi.new("int32_t[?]", n > 0 and n or 1)
    for i = 1, n do
      local v = ids[i]
      if type(v) ~= "number" or v ~= math.floor(v) then
        raise(string.format("decode: ids[%d] must be an integer, got %s", i, tostring(v)))
      end
      arr[i - 1] = v
    end
  elseif type(ids) == "cdata" and ffi.istype(Tensor, ids) then
    n = tonumber(C.lt_numel(ids))
    arr = ffi.new("int32_t[?]", n > 0 and n or 1)
    if n > 0 and C.lt_copy_to_buffer(ids, arr, C.LT_I32, n) ~= 0 then fail() end
  elseif type(ids) == "cdata" then
    if type(n) ~= "number" then raise("decode: with a cdata array of ids, pass their number n") end
    arr = ids
  else
    raise("decode: expected a list of ids or a tensor, got " .. type(ids))
  end
  if C.lt_tokenizer_decode_flags(h, arr, n, flags, nil, 0, decode_len) ~= 0 then fail() end
  local len = tonumber(decode_len[0])
  local buf = ffi.new("char[?]", len > 0 and len or 1)
  if C.lt_tokenizer_decode_flags(h, arr, n, flags, buf, len, decode_len) ~= 0 then fail() end
  return ffi.string(buf, len)
end

function Tokenizer.save(tok, path)
  local h = check_self("save", tok)
  if type(path) ~= "string" then raise("save: path must be a string, got " .. type(path)) end
  if C.lt_tokenizer_save(h, path) ~= 0 then fail() end
  return path
end

local bytes_out, len_out, id_out = ffi.new("const char *[1]"), ffi.new("int64_t[1]"), ffi.new("int32_t[1]")

-- The bytes of token id.
function Tokenizer.token(tok, id)
  local h = check_self("token", tok)
  if type(id) ~= "number" then raise("token: id must be a number, got " .. type(id)) end
  if C.lt_tokenizer_token(h, id, bytes_out, len_out) ~= 0 then fail() end
  return ffi.string(bytes_out[0], len_out[0])
end

-- The id of the token whose bytes are s (special tokens included), or nil.
function Tokenizer.token_id(tok, s)
  local h = check_self("token_id", tok)
  if type(s) ~= "string" then raise("token_id: expected a string, got " .. type(s)) end
  if C.lt_tokenizer_token_id(h, s, #s, id_out) ~= 0 then fail() end
  return id_out[0] >= 0 and id_out[0] or nil
end

-- tok:is_special(id): whether id is a special token (<|endoftext|>, ...).
function Tokenizer.is_special(tok, id) return C.lt_tokenizer_is_special(check_self("is_special", tok), id) ~= 0 end

-- Adds a special token (or finds the one with this text); returns its id.
function Tokenizer.add_special(tok, s)
  local h = check_self("add_special", tok)
  if type(s) ~= "string" then raise("add_special: expected a string, got " .. type(s)) end
  if C.lt_tokenizer_add_special(h, s, id_out) ~= 0 then fail() end
  tok.vocab_size = C.lt_tokenizer_vocab_size(h)
  return id_out[0]
end

-- {text = id} of the special tokens.
function Tokenizer.special_tokens(tok)
  local h = check_self("special_tokens", tok)
  local out = {}
  for id = 0, tok.vocab_size - 1 do
    if C.lt_tokenizer_is_special(h, id) ~= 0 then out[Tokenizer.token(tok, id)] = id end
  end
  return out
end

-- tok:num_merges(): the number of BPE merge rules.
function Tokenizer.num_merges(tok) return C.lt_tokenizer_num_merges(check_self("num_merges", tok)) end

local fp_out = ffi.new("uint64_t[1]")
-- 16 hex digits that change whenever the ids of some text would.
function Tokenizer.fingerprint(tok)
  if C.lt_tokenizer_fingerprint(check_self("fingerprint", tok), fp_out) ~= 0 then fail() end
  return bit.tohex(fp_out[0])
end

function Tokenizer.__tostring(tok)
  return string.format("Tokenizer(%s, vocab_size=%d, merges=%d)", tok.kind, tok.vocab_size,
    C.lt_tokenizer_num_merges(tok.handle))
end

return M
