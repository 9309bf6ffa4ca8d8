-- lutra.data — a corpus tokenized once into a token file, and loaders of (B, T) batches.
--
--   local data = require "lutra.data"
--   local train = data.text("corpus.txt", tok, {seq_len = 64, batch = 12, seed = 1337})
--   local val = train:with{split = "val"}
--   local x, y = train:next()           -- (B, T) i64: inputs and next-token targets
--   local st = train:state()            -- {seed=, step=, epoch=}: save it in a checkpoint
--   train:set_state(st)                 -- resumes exactly
--
-- Token files (host/io/tokfile.c, layout in lutra.h): a 128-byte header ("LUTRATOK",
-- version, u16/u32 width, count, vocab size, tokenizer fingerprint, FNV-1a hash of the
-- tokens, size, mtime and FNV-1a hash of the text) then the tokens, memory-mapped when read.
-- A token file is read once in full before use (TokenFile:verify, one pass: 2.4 ms per MB
-- measured on a busy 2-core machine, a tenth of tokenizing tiny Shakespeare by chars): every id
-- must be below the vocabulary (the header's, or the model's when opts.vocab_size says it) and
-- the tokens must match the header's hash, so a damaged file is an error naming it and the
-- offset of the first bad id, never an index error deep inside the model. A damaged cache is
-- tokenized again, saying why on stderr; a stale one (another text or tokenizer) silently.
--
-- Where caches go: never beside the text (whose folder may be read-only, or someone
-- else's). tokenize_file writes to the path it is given, else under opts.cache_dir, else under
-- M.cache_dir(): $LUTRA_CACHE_DIR, else $XDG_CACHE_HOME/lutra, else ~/.cache/lutra. The
-- recipes give their run directory's cache/ folder (--cache_dir changes it).
--
-- Split: as ../shared/peers/torch_charlm.py, the first floor((1 - val_fraction) * N)
-- tokens are train and the rest val (default val_fraction 0.1: n = int(0.9 * N)).
--
-- Sampling (shuffle = true, the default): random windows, as the peer's get_batch. Row
-- r of step s starts at lo + u with u uniform in [0, len - T - 1) (the peer's range:
-- torch.randint(len - T - 1)), drawn by lt_rand_int (Philox4x32-10) under key
-- seed (+ 0x9E3779B97F4A7C15 for the val split) at counter s * B + r. A batch depends only
-- on (seed, split, step), so a loader resumes exactly from its state, and the global batch
-- is the same for any data-parallel size: rank k of dp_size takes rows
-- [k * B / dp_size, (k + 1) * B / dp_size) of it (B is the global batch).
-- shuffle = false: consecutive windows lo + ((s * B + r) mod W) * T, W = floor((len - 1) / T),
-- which covers the split in order (for evaluation over all of it).
-- epoch in the state is informational: windows drawn * T / len (shuffled) or passes
-- over the W windows (sequential).
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local dtype = require "lutra.dtype"
local files = require "lutra.ckpt.files"
local model_size = require "lutra.models.size"
require "lutra.tensor" -- the tensor metatype, for the batches this returns
local ffi, C = lt.ffi, lt.C

local M = {}

local raise, fail, new = errors.raise, errors.fail, memory.new
local floor = math.floor

local FNV_BASIS = 0xcbf29ce484222325ULL
local VAL_SALT = 0x9E3779B97F4A7C15ULL

local function hash_string(s, h)
  local out = ffi.new("uint64_t[1]", h or FNV_BASIS)
  if C.lt_hash64(s, #s, out) ~= 0 then fail() end
  return out[0]
end

local function hex(u) return bit.tohex(u, 16) end

local function stat(path)
  local size, mtime = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  if C.lt_file_stat(path, size, mtime) ~= 0 then return nil, ffi.string(C.lt_last_error()) end
  return tonumber(size[0]), mtime[0]
end

pcall(ffi.cdef, "char *realpath(const char *path, char *resolved); void free(void *p);")
pcall(ffi.cdef, "int mkdir(const char *path, unsigned int mode);")

-- The absolute path of an existing file, links resolved (path itself when that fails).
local function real_path(path)
  local p = ffi.C.realpath(path, nil)
  if p == nil then return path end
  local full = ffi.string(p)
  ffi.C.free(p)
  return full
end

local function info_table(c)
  return {version = c.version, token_bytes = c.token_bytes, count = tonumber(c.count),
          vocab_size = tonumber(c.vocab_size), tokenizer_hash = hex(c.tokenizer_hash),
          tokens_hash = hex(c.tokens_hash), source_bytes = tonumber(c.source_bytes),
          source_hash = hex(c.source_hash), source_mtime_ns = c.source_mtime_ns}
end

-- ---- token files ------------------------------------------------------------------------

local TokenFile = {}
TokenFile.__index = TokenFile

local function open_file(path) -- the TokenFile, or nil and the C error
  local p = ffi.new("lt_tokfile *[1]")
  if C.lt_tokfile_open(p, path) ~= 0 then return nil, ffi.string(C.lt_last_error()) end
  local handle = ffi.gc(p[0], C.lt_tokfile_close)
  local c = ffi.new("lt_tokfile_info")
  C.lt_tokfile_get_info(handle, c)
  local info = info_table(c)
  return setmetatable({path = path, handle = handle, info = info, count = info.count,
                       vocab_size = info.vocab_size, token_bytes = info.token_bytes}, TokenFile)
end

-- Opens (maps) a token file. Fields: path, count, vocab_size, token_bytes, info (the header),
-- verified (whether verify passed). The header is checked here; the tokens by verify.
function M.open(path)
  if type(path) ~= "string" then raise("data.open: path must be a string, got " .. type(path)) end
  local file = open_file(path)
  if not file then fail() end
  return file
end

-- The header of a token file, validated, without mapping it (nil, message when invalid).
function M.read_header(path)
  local c = ffi.new("lt_tokfile_info")
  if C.lt_tokfile_read_header(path, c) ~= 0 then return nil, ffi.string(C.lt_last_error()) end
  return info_table(c)
end

-- tokens [start, start + count) as a 1-d tensor (i64, or dtype "i32").
function TokenFile:tokens(start, count, dt)
  local out = new()
  if dt then
    if C.lt_empty(out, 1, ffi.new("int64_t[1]", count), dtype.id(dt), dtype.CPU) ~= 0 then fail() end
  end
  if C.lt_tokfile_tokens(out, self.handle, start, count) ~= 0 then fail() end
  return out
end

-- x, y (B, T) for a list of B 0-based start offsets: x = tokens[s, s + T), y = x shifted by one.
function TokenFile:batch(starts, seq_len)
  if type(starts) ~= "table" or #starts == 0 then raise("batch: starts must be a non-empty list of offsets") end
  local buf = ffi.new("int64_t[?]", #starts)
  for i = 1, #starts do buf[i - 1] = errors.int_arg("batch", starts[i], "a start") end
  local x, y = new(), new()
  seq_len = errors.int_arg("batch", seq_len, "seq_len")
  if C.lt_tokfile_batch(x, y, self.handle, buf, #starts, seq_len) ~= 0 then fail() end
  return x, y
end

-- Reads every token once: each id must be below vocab_size (default: the header's) and the
-- tokens must match the header's hash; an error names the file and the first bad id's offset.
function TokenFile:verify(vocab_size)
  local ok = self:check(vocab_size)
  if not ok then fail() end
  return true
end

-- As verify, but nil, message instead of an error. Sets verified, and verified_vocab: the
-- vocabulary every id was found below.
function TokenFile:check(vocab_size)
  if C.lt_tokfile_verify_ids(self.handle, vocab_size or 0) ~= 0 then return nil, ffi.string(C.lt_last_error()) end
  local limit = math.min(vocab_size and vocab_size > 0 and vocab_size or self.vocab_size, self.vocab_size)
  self.verified, self.verified_vocab = true, math.min(limit, self.verified_vocab or limit)
  return true
end

-- Closes the file (unmaps it); closing again does nothing.
function TokenFile:close()
  if self.handle ~= nil then C.lt_tokfile_close(ffi.gc(self.handle, nil)) end
  self.handle = nil
end

-- ---- tokenizing a corpus -----------------------------------------------------------------

-- A text that exercises spaces, newlines, digits, punctuation and multi-byte UTF-8.
local PROBE = "Hello, World! It's 2024: 3.14159 x=y+1;\n\n  indented\ttab  ünïcödé 日本語 🙂 <|endoftext|>"

-- A tokenizer's fingerprint (uint64): a hash of tok:fingerprint() when it has that method,
-- else of vocab_size, decode({id}) for every id, and the encoding of a probe text.
local function fingerprint(tok)
  local ok_index, fn = pcall(function() return tok.fingerprint end)
  if ok_index and type(fn) == "function" then return hash_string("fp:" .. tostring(tok:fingerprint())) end
  local V = tok.vocab_size
  if type(V) ~= "number" then raise("data: the tokenizer has no numeric vocab_size") end
  local h = hash_string("lutra-tokenizer-fingerprint-1;" .. V .. ";")
  for id = 0, V - 1 do
    local ok, s = pcall(tok.decode, tok, {id})
    s = ok and tostring(s) or "<error>"
    h = hash_string(#s .. ":" .. s, h)
  end
  local ok, ids = pcall(tok.encode, tok, PROBE)
  return hash_string(ok and type(ids) == "table" and table.concat(ids, ",") or "<error>", h)
end

-- The fingerprint as 16 hex digits (as token file headers show it).
function M.fingerprint(tok)
  local ok = pcall(function() return tok.encode end)
  if not ok or tok == nil then raise("data.fingerprint: expected a tokenizer, got " .. type(tok)) end
  return hex(fingerprint(tok))
end

-- Where a cut keeps the tokens of a whole-text encoding: after a newline that a
-- non-space follows (pre-tokenizers of the GPT-2 family never join across it).
local function cut_point(buf)
  local from = #buf > 65536 and #buf - 65536 or 1
  while true do
    local last, pos = nil, from
    while true do
      local i = buf:find("\n[^%s]", pos)
      if not i then break end
      last, pos = i, i + 1
    end
    if last then return last end
    if from == 1 then return nil end
    from = 1
  end
end

-- Where the next piece of buf ends: a cut point, or with none in 4 chunks' worth of text
-- the last whole UTF-8 character; nil to read more first.
local function piece_end(buf, chunk_bytes)
  local cut = cut_point(buf)
  if not cut and #buf >= 4 * chunk_bytes then -- no safe cut: end at a UTF-8 character boundary
    cut = #buf
    while cut > 1 and floor(buf:byte(cut) / 64) == 2 do cut = cut - 1 end
    cut = cut - 1
  end
  return cut
end

-- A function that encodes one piece of text and appends its ids to job.writer, adding the
-- piece to job.source_hash and job.done (the progress shows on job.show, when set).
local function piece_encoder(job)
  local tok, writer = job.tok, job.writer
  local ids32, cap = nil, 0
  local encode_ids = type(tok.encode_ids) == "function" and tok.encode_ids -- (int32_t[n], n): no Lua list
  local plain = {add_special_tokens = false} -- a corpus piece is no sequence of its own: no BOS per piece
  return function(piece)
    local arr, n = nil, nil
    if encode_ids then
      arr, n = encode_ids(tok, piece, plain)
    else
      local ids = tok:encode(piece)
      n = #ids
      if n > cap then ids32, cap = ffi.new("int32_t[?]", n), n end
      for i = 1, n do ids32[i - 1] = ids[i] end
      arr = ids32
    end
    if C.lt_tokwriter_append(writer, arr, dtype.I32, n) ~= 0 then error(ffi.string(C.lt_last_error()), 0) end
    job.source_hash = hash_string(piece, job.source_hash)
    job.done = job.done + #piece
    if job.show then
      job.show:write(string.format("\rtokenizing %s: %d%%", job.text_path, floor(100 * job.done / job.size)))
    end
  end
end

-- Reads the text f in chunks of chunk_bytes and encodes it piece by piece (see piece_end).
local function encode_text(job, f, chunk_bytes)
  local encode = piece_encoder(job)
  local buf = ""
  while true do
    local chunk = f:read(chunk_bytes)
    if not chunk then break end
    buf = buf .. chunk
    local cut = piece_end(buf, chunk_bytes)
    if cut then
      encode(buf:sub(1, cut))
      buf = buf:sub(cut + 1)
    end
  end
  if #buf > 0 then encode(buf) end
end

-- Writes the tokens of text_path (size bytes, modified at mtime) to out_path; on an error
-- the partial token file is dropped.
local function write_token_file(text_path, tok, out_path, fp_u64, size, mtime, opts)
  local V = tok.vocab_size
  if type(V) ~= "number" then raise("data.tokenize_file: the tokenizer has no numeric vocab_size") end
  local f, err = io.open(text_path, "rb")
  if not f then raise("data.tokenize_file: cannot read the text: " .. tostring(err)) end
  local w = ffi.new("lt_tokwriter *[1]")
  if C.lt_tokwriter_open(w, out_path, V, fp_u64) ~= 0 then
    f:close()
    fail()
  end
  local job = {tok = tok, writer = w[0], text_path = text_path, size = size, source_hash = FNV_BASIS, done = 0,
               show = not opts.quiet and size > 64 * 1024 * 1024 and io.stderr}
  local ok, msg = pcall(encode_text, job, f, opts.chunk_bytes or 4 * 1024 * 1024)
  f:close()
  if job.show then job.show:write("\n") end
  if not ok then
    C.lt_tokwriter_abort(job.writer)
    raise("data.tokenize_file: " .. text_path .. ": " .. tostring(msg))
  end
  if C.lt_tokwriter_finish(job.writer, job.done, job.source_hash, mtime) ~= 0 then fail() end
end

-- The directory for caches (created when missing): dir when given, else $LUTRA_CACHE_DIR,
-- $XDG_CACHE_HOME/lutra or ~/.cache/lutra. An error names it when it cannot be made.
function M.cache_dir(dir)
  if dir ~= nil and type(dir) ~= "string" then raise("data.cache_dir: expected a path, got " .. type(dir)) end
  if dir == nil or dir == "" then
    local env, xdg, home = os.getenv("LUTRA_CACHE_DIR"), os.getenv("XDG_CACHE_HOME"), os.getenv("HOME")
    dir = env ~= "" and env or xdg and xdg ~= "" and xdg .. "/lutra" or home and home ~= "" and home .. "/.cache/lutra"
    if not dir then raise("data.cache_dir: no cache directory: set LUTRA_CACHE_DIR or give one (cache_dir)") end
  end
  local ok, err = pcall(files.mkdir_p, dir)
  if not ok then -- name the cache, then the part of its path that cannot be made and why
    raise(string.format("data: cannot create the cache directory '%s': %s", dir,
                        tostring(err):gsub("^[^:]*:%d+: ", ""):gsub("^cannot create the directory ", "")))
  end
  return (dir:gsub("(.)/+$", "%1"))
end

-- A cache file's name for a source file: its base name and a hash of its absolute path (two
-- texts of the same name in different folders do not share a cache).
function M.cache_name(path)
  local base = path:match("([^/]+)/*$") or "text"
  return base .. "-" .. hex(hash_string(real_path(path))):sub(1, 8)
end

-- Whether out_path holds the tokens of text_path (size bytes, modified at mtime) by tok: the
-- header matches and the tokens verify. Returns the header table and the open TokenFile, or
-- nil and what is damaged (nil when there is no file, or one made from another text or by
-- another tokenizer: a cache that is simply stale).
local function reusable(out_path, fp, V, size, mtime)
  local info, err = M.read_header(out_path)
  if not info then return nil, stat(out_path) and err or nil end
  local _, out_mtime = stat(out_path)
  if info.tokenizer_hash ~= fp or info.source_bytes ~= size or info.source_mtime_ns ~= mtime or out_mtime < mtime then
    return nil
  end
  if info.vocab_size ~= V then -- the same tokenizer, another vocabulary: the header was edited
    return nil, string.format("'%s': the header's vocab_size %d is not the tokenizer's %d", out_path,
                              info.vocab_size, V)
  end
  local file, open_err = open_file(out_path)
  if not file then return nil, open_err end
  local good, why = file:check(V)
  if not good then
    file:close()
    return nil, why
  end
  return info, file
end

-- Tokenizes text_path once into a token file (out_path, default: opts.cache_dir, else
-- M.cache_dir(), .. "/<cache_name>.tok-<fp8>.bin"; never beside the text), and reuses that
-- file while its header says it was made by the same tokenizer from a text of the same size
-- and modification time (and it is not older than the text) and its tokens verify (one pass;
-- a file that fails is tokenized again, saying why on stderr).
-- opts: force = true (tokenize again), chunk_bytes (text read per encode call, default 4 MiB),
-- quiet = true. Uses tok:encode_ids(s) -> (int32_t[n], n) when the tokenizer has it, else
-- tok:encode(s) -> list. Returns out_path, the header table (with .reused) and the open,
-- verified TokenFile.
function M.tokenize_file(text_path, tok, out_path, opts)
  if type(out_path) == "table" and opts == nil then out_path, opts = nil, out_path end
  opts = opts or {}
  if type(text_path) ~= "string" then
    raise("data.tokenize_file: text_path must be a string, got " .. type(text_path))
  end
  local ok_index, encode_fn = pcall(function() return tok.encode end)
  if not ok_index or type(encode_fn) ~= "function" then
    raise("data.tokenize_file: expected a tokenizer with :encode(), got " .. type(tok))
  end
  local size, mtime = stat(text_path)
  if not size then raise("data.tokenize_file: cannot read the text: " .. mtime) end
  local fp_u64 = fingerprint(tok)
  local fp = hex(fp_u64)
  if out_path ~= nil and type(out_path) ~= "string" then
    raise("data.tokenize_file: out_path must be a string, got " .. type(out_path))
  end
  out_path = out_path or (M.cache_dir(opts.cache_dir) .. "/" .. M.cache_name(text_path) .. ".tok-" .. fp:sub(1, 8)
                          .. ".bin")
  if not opts.force then
    local info, file = reusable(out_path, fp, tok.vocab_size, size, mtime)
    if info then
      info.reused = true
      return out_path, info, file
    end
    if file then io.stderr:write(string.format("data: %s; tokenizing %s again\n", file, text_path)) end
  end
  write_token_file(text_path, tok, out_path, fp_u64, size, mtime, opts)
  local file = M.open(out_path)
  file.verified, file.verified_vocab = true, file.vocab_size -- its ids were checked and hashed as they were written
  local info = file.info
  info.reused = false
  return out_path, info, file
end

-- ---- the split ------------------------------------------------------------------------

-- Token ranges [lo, hi) of the train and val splits of n tokens.
function M.split(n, val_fraction)
  val_fraction = val_fraction or 0.1
  if type(val_fraction) ~= "number" or val_fraction < 0 or val_fraction >= 1 then
    raise("data.split: val_fraction must be in [0, 1), got " .. tostring(val_fraction))
  end
  local n_train = floor((1 - val_fraction) * n)
  return {train = {0, n_train}, val = {n_train, n}, all = {0, n}}
end

-- ---- loaders ------------------------------------------------------------------------------

local Loader = {}
Loader.__index = Loader

local function int_opt(opts, key, default, min)
  local v = opts[key]
  if v == nil then v = default end
  if type(v) ~= "number" or v ~= floor(v) or v < min then
    raise(string.format("data: %s must be an integer >= %d, got %s", key, min, tostring(v)))
  end
  return v
end

-- A field of a mesh that is a number or a method.
local function mesh_value(obj, key)
  local v = obj and obj[key]
  if type(v) == "function" then v = v(obj) end
  return v
end

-- A loader over an existing token file (a path or an open TokenFile; see the top of this
-- file for opts). The file is verified first unless it was (opts.verify = false skips it);
-- opts.vocab_size (the model's) makes an id at or above it an error naming the file.
function M.tokens(path, opts)
  opts = opts or {}
  local file = type(path) == "table" and getmetatable(path) == TokenFile and path or M.open(path)
  if opts.vocab_size ~= nil then
    int_opt(opts, "vocab_size", nil, 1)
    if (file.verified_vocab or file.vocab_size) > opts.vocab_size then file:verify(opts.vocab_size) end
  end
  if not file.verified and opts.verify ~= false then file:verify() end
  local T = int_opt(opts, "seq_len", nil, 1)
  local B = int_opt(opts, "batch", nil, 1)
  local seed = int_opt(opts, "seed", 1337, 0)
  local split = opts.split or "train"
  if split ~= "train" and split ~= "val" and split ~= "all" then
    raise("data: split must be \"train\", \"val\" or \"all\", got " .. tostring(split))
  end
  local rank, size = opts.dp_rank, opts.dp_size
  if opts.mesh then
    local dp = opts.mesh.dp
    rank = rank or mesh_value(opts.mesh, "dp_rank") or mesh_value(dp, "rank")
    size = size or mesh_value(opts.mesh, "dp_size") or mesh_value(dp, "size")
  end
  local ranks = {dp_rank = rank or 0, dp_size = size or 1}
  local dp_size, dp_rank = int_opt(ranks, "dp_size", 1, 1), int_opt(ranks, "dp_rank", 0, 0)
  if dp_rank >= dp_size then raise(string.format("data: dp_rank %d is not below dp_size %d", dp_rank, dp_size)) end
  if B % dp_size ~= 0 then
    raise(string.format("data: the global batch %d does not divide among %d data-parallel ranks", B, dp_size))
  end
  local range = M.split(file.count, opts.val_fraction)[split]
  local lo, hi = range[1], range[2]
  local shuffle = opts.shuffle ~= false
  local need = shuffle and T + 2 or T + 1
  if hi - lo < need then
    raise(string.format("data: the %s split of '%s' has %d tokens, fewer than the %d that seq_len %d needs", split,
      file.path, hi - lo, need, T))
  end
  local out_dtype = dtype.id(opts.dtype or "i64")
  if out_dtype ~= dtype.I64 and out_dtype ~= dtype.I32 then raise("data: dtype must be i64 or i32") end
  local local_batch = B / dp_size
  -- x and y of a batch, checked before anything is allocated so that the error names the options
  local batch_bytes, memory_bytes = 2 * local_batch * T * dtype.sizes[out_dtype], model_size.device_bytes("cpu")
  if memory_bytes and batch_bytes > memory_bytes then
    raise(string.format("data: batch = %d (%d per data-parallel rank) of seq_len = %d tokens would need %s per batch, "
      .. "more than the %s of memory", B, local_batch, T, model_size.human(batch_bytes), model_size.human(memory_bytes)))
  end
  local p = C.lt_tensor_new() -- the start offsets, outside any tidy scope
  local starts = ffi.gc(p[0], C.lt_release)
  if C.lt_empty(starts, 1, ffi.new("int64_t[1]", local_batch), dtype.I64, dtype.CPU) ~= 0 then fail() end
  local self = setmetatable({
    file = file, path = file.path, seq_len = T, batch = B, local_batch = local_batch, seed = seed, step = 0,
    split = split, shuffle = shuffle, dp_rank = dp_rank, dp_size = dp_size, lo = lo, hi = hi, ntokens = hi - lo,
    vocab_size = file.vocab_size, tokens_per_step = B * T, windows = floor((hi - lo - 1) / T),
    opts = opts, dtype = out_dtype, starts = starts, starts_ptr = ffi.cast("int64_t *", C.lt_data_ptr(starts)),
  }, Loader)
  return self
end

-- Tokenizes (or reuses) the text's token file, then a loader over it. opts as M.tokens,
-- plus cache = the token file path (or cache_dir = its folder) and force/chunk_bytes/quiet
-- for tokenize_file.
function M.text(path, tok, opts)
  opts = opts or {}
  local _, _, file = M.tokenize_file(path, tok, opts.cache, opts)
  local loader = M.tokens(file, opts)
  loader.text_path = path
  return loader
end

-- Fills self.starts with the start offsets of this rank's rows of the batch of step s.
local function fill_starts(self, s)
  local Bl, T = self.local_batch, self.seq_len
  local first = s * self.batch + self.dp_rank * Bl -- this rank's first row of the global batch
  if self.shuffle then
    local key = ffi.new("uint64_t", self.seed) + (self.split == "val" and VAL_SALT or 0ULL)
    if C.lt_rand_int(self.starts, key, first, self.lo, self.hi - T - 1) ~= 0 then fail() end
  else
    local ptr, W = self.starts_ptr, self.windows
    for r = 0, Bl - 1 do ptr[r] = self.lo + ((first + r) % W) * T end
  end
end

-- The next batch: x, y (local_batch, seq_len).
function Loader:next()
  local Bl, T = self.local_batch, self.seq_len
  fill_starts(self, self.step)
  local x, y = new(), new()
  if self.dtype ~= dtype.I64 then
    local shape = ffi.new("int64_t[2]", Bl, T)
    if C.lt_empty(x, 2, shape, self.dtype, dtype.CPU) ~= 0 or C.lt_empty(y, 2, shape, self.dtype, dtype.CPU) ~= 0 then
      fail()
    end
  end
  if C.lt_tokfile_batch(x, y, self.file.handle, self.starts_ptr, Bl, T) ~= 0 then fail() end
  self.step = self.step + 1
  return x, y
end

-- The 0-based start offsets (in the token file) of the rows the next call returns, or of step s.
function Loader:peek_starts(s)
  fill_starts(self, s or self.step)
  local out = {}
  for r = 0, self.local_batch - 1 do out[r + 1] = tonumber(self.starts_ptr[r]) end
  return out
end

-- The number of whole passes over the data the steps so far have drawn.
function Loader:epoch()
  local drawn = self.step * self.batch
  if self.shuffle then return floor(drawn * self.seq_len / self.ntokens) end
  return floor(drawn / self.windows)
end

function Loader:state() return {seed = self.seed, step = self.step, epoch = self:epoch()} end

function Loader:set_state(st)
  if type(st) ~= "table" then raise("set_state: expected a table {seed=, step=}, got " .. type(st)) end
  local step = st.step
  if type(step) ~= "number" or step < 0 or step ~= floor(step) then
    raise("set_state: step must be a non-negative integer, got " .. tostring(step))
  end
  if st.seed ~= nil then self.seed = int_opt(st, "seed", nil, 0) end
  self.step = step
  return self
end

-- Back to step 0 (the first batch again); returns the loader.
function Loader:reset()
  self.step = 0
  return self
end

-- A loader over the same token file with some options changed: loader:with{split = "val"}.
function Loader:with(overrides)
  local opts = {}
  for k, v in pairs(self.opts) do opts[k] = v end
  opts.seed = self.seed
  for k, v in pairs(overrides or {}) do opts[k] = v end
  local loader = M.tokens(self.file, opts)
  loader.text_path = self.text_path
  return loader
end

-- for x, y in loader:batches(n) do ... end
function Loader:batches(n)
  local i = 0
  return function()
    if n and i >= n then return nil end
    i = i + 1
    return self:next()
  end
end

function Loader:__tostring()
  return string.format("lutra.data loader: %s, %s split (%d tokens), batch %d x %d, %s, seed %d, step %d%s",
    self.path, self.split, self.ntokens, self.batch, self.seq_len, self.shuffle and "random windows" or "in order",
    self.seed, self.step, self.dp_size > 1 and string.format(", dp rank %d of %d", self.dp_rank, self.dp_size) or "")
end

M.Loader, M.TokenFile = Loader, TokenFile
return M
