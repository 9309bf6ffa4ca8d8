-- lutra.ckpt.safetensors — reading and writing .safetensors files (Hugging Face's format:
-- an 8-byte little-endian header length, a JSON header, then raw little-endian data).
-- The C side (host/safetensors*.c) parses and validates the header before any data is
-- trusted and reads each tensor straight into its storage.
--
--   local st = require "lutra.ckpt.safetensors"
--   local tensors, metadata = st.load("model.safetensors")        -- {name = CPU tensor}, {key = value}
--   local some = st.load("model.safetensors", {names = {"a", "b"}}) -- only these (an error names a missing one)
--   st.save("out.safetensors", {["wte.weight"] = w}, {format = "pt"})
--   local h = st.read_header("model.safetensors")
--   -- h.names (sorted), h.tensors[name] = {dtype = "f32", shape = {..}, begin =, ["end"] =},
--   -- h.metadata, h.data_offset, h.file_size
--   local r = st.open("model.safetensors"); r:load("w", param); r:close()  -- one tensor at a time
--
-- Names and metadata are UTF-8 without NUL, read and written (host/io/names.h): a header
-- string "a\u0000b" is an error, not the name "a". Loads check nothing about the values: a
-- weight's dtype against its parameter's and NaN/inf are lutra.ckpt.weight_checks', where
-- weights meet a model.
-- Tensors load on the CPU in their stored dtype (F32 F64 BF16 F16 I32 I64 U8 BOOL). save
-- takes tensors on any device and in any layout (copied to contiguous CPU memory first),
-- writes names in sorted order and metadata as strings, to a temporary file renamed into place.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local dtype = require "lutra.dtype"
local ops = require "lutra.ops"
local ffi, C = lt.ffi, lt.C

local M = {}

local fail, raise = errors.fail, errors.raise

local function open(path)
  if type(path) ~= "string" then raise("safetensors: path must be a string, got " .. type(path)) end
  local hp = ffi.new("lt_st_header*[1]")
  if C.lt_st_open(hp, path) ~= 0 then fail() end
  return ffi.gc(hp[0], C.lt_st_close)
end

local function close(h)
  ffi.gc(h, nil)
  C.lt_st_close(h)
end

local function count(h)
  local n = ffi.new("int64_t[1]")
  if C.lt_st_count(h, n) ~= 0 then fail() end
  return tonumber(n[0])
end

local function info_of(h, i, info)
  if C.lt_st_tensor(h, i, info) ~= 0 then fail() end
  local shape = {}
  for d = 0, info.ndim - 1 do shape[d + 1] = tonumber(info.shape[d]) end
  return ffi.string(info.name), {dtype = dtype.name(info.dtype), shape = shape, begin = tonumber(info.begin),
    ["end"] = tonumber(info["end"])}
end

local function metadata_of(h)
  local n, key, value = ffi.new("int64_t[1]"), ffi.new("const char*[1]"), ffi.new("const char*[1]")
  if C.lt_st_metadata_count(h, n) ~= 0 then fail() end
  local meta = {}
  for i = 0, tonumber(n[0]) - 1 do
    if C.lt_st_metadata(h, i, key, value) ~= 0 then fail() end
    meta[ffi.string(key[0])] = ffi.string(value[0])
  end
  return meta
end

-- The validated header: {names = sorted list, tensors = {name = {dtype, shape, begin, end}},
-- metadata = {key = value}, data_offset = 8 + N, file_size = bytes}.
function M.read_header(path)
  local h = open(path)
  local info = ffi.new("lt_st_info")
  local out = {names = {}, tensors = {}, metadata = metadata_of(h)}
  for i = 0, count(h) - 1 do
    local name, entry = info_of(h, i, info)
    out.names[#out.names + 1] = name
    out.tensors[name] = entry
  end
  local off = ffi.new("int64_t[1]")
  if C.lt_st_data_offset(h, off) ~= 0 then fail() end
  out.data_offset = tonumber(off[0])
  close(h)
  local size, mtime = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  if C.lt_file_stat(path, size, mtime) ~= 0 then fail() end
  out.file_size = tonumber(size[0])
  return out
end

-- A reader that keeps the file open: r.names, r.tensors (as read_header's), r.metadata;
-- r:load(name, out) reads one tensor (into out when given: same shape and dtype, contiguous,
-- on the CPU; written in place), r:close().
local Reader = {}
Reader.__index = Reader

function M.open(path)
  local h = open(path)
  local info = ffi.new("lt_st_info")
  local r = setmetatable({path = path, h = h, names = {}, tensors = {}, index = {}, metadata = metadata_of(h)}, Reader)
  for i = 0, count(h) - 1 do
    local name, entry = info_of(h, i, info)
    r.names[#r.names + 1] = name
    r.tensors[name] = entry
    r.index[name] = i
  end
  return r
end

function Reader:load(name, out)
  if self.h == nil then raise("safetensors: " .. self.path .. " is closed") end
  local i = self.index[name]
  if i == nil then raise("safetensors: " .. self.path .. ": no tensor named '" .. tostring(name) .. "'") end
  local t = out
  if t == nil then
    t = memory.new()
  else
    errors.tensor_arg("safetensors load", t, "out")
    errors.check_alive(t, "safetensors load")
  end
  if C.lt_st_load(t, self.h, i) ~= 0 then fail() end
  return t
end

function Reader:close()
  if self.h ~= nil then close(self.h) end
  self.h = nil
end

-- load(path, {names = list}) -> {name = tensor}, metadata
function M.load(path, opts)
  opts = opts or {}
  local h = open(path)
  local tensors = {}
  local function load_index(i)
    local t = memory.new()
    if C.lt_st_load(t, h, i) ~= 0 then fail() end
    return t
  end
  if opts.names then
    local idx = ffi.new("int64_t[1]")
    for _, name in ipairs(opts.names) do
      if C.lt_st_find(h, name, idx) ~= 0 then fail() end
      if idx[0] < 0 then
        close(h)
        raise("safetensors: " .. path .. ": no tensor named '" .. tostring(name) .. "'")
      end
      tensors[name] = load_index(idx[0])
    end
  else
    local info = ffi.new("lt_st_info")
    for i = 0, count(h) - 1 do
      if C.lt_st_tensor(h, i, info) ~= 0 then fail() end
      tensors[ffi.string(info.name)] = load_index(i)
    end
  end
  local meta = metadata_of(h)
  close(h)
  return tensors, meta
end

-- save(path, {name = tensor}, metadata): metadata values must be strings (numbers and
-- booleans are written with tostring).
function M.save(path, named, metadata)
  if type(path) ~= "string" then raise("safetensors.save: path must be a string, got " .. type(path)) end
  if type(named) ~= "table" then raise("safetensors.save: tensors must be a table {name = tensor}, got " .. type(named)) end
  local names = {}
  for name, t in pairs(named) do
    if type(name) ~= "string" then raise("safetensors.save: tensor names must be strings, got " .. type(name)) end
    if name:find("\0", 1, true) then raise(string.format("safetensors.save: tensor name %q holds a NUL byte", name)) end
    if not ops.is_tensor(t) then raise("safetensors.save: '" .. name .. "' is a " .. type(t) .. ", not a tensor") end
    names[#names + 1] = name
  end
  table.sort(names)
  local n = #names
  local cnames = ffi.new("const char*[?]", math.max(n, 1))
  local ctensors = ffi.new("const lt_tensor*[?]", math.max(n, 1))
  local keep = {} -- the contiguous CPU copies (and the name strings) stay alive during the call
  for i, name in ipairs(names) do
    local t = named[name]
    errors.check_alive(t, "safetensors.save '" .. name .. "'")
    local c = t:to("cpu"):contiguous()
    keep[#keep + 1], keep[#keep + 2] = c, name
    cnames[i - 1], ctensors[i - 1] = name, c
  end
  local keys = {}
  for k, v in pairs(metadata or {}) do
    if type(k) ~= "string" then raise("safetensors.save: metadata keys must be strings, got " .. type(k)) end
    if type(v) ~= "string" and type(v) ~= "number" and type(v) ~= "boolean" then
      raise("safetensors.save: metadata '" .. k .. "' must be a string, got " .. type(v))
    end
    if (k .. tostring(v)):find("\0", 1, true) then raise(string.format("safetensors.save: metadata %q holds a NUL byte", k)) end
    keys[#keys + 1] = k
  end
  table.sort(keys)
  local ckeys = ffi.new("const char*[?]", math.max(#keys, 1))
  local cvalues = ffi.new("const char*[?]", math.max(#keys, 1))
  for i, k in ipairs(keys) do
    local v = tostring(metadata[k])
    keep[#keep + 1] = v
    ckeys[i - 1], cvalues[i - 1] = k, v
  end
  if C.lt_st_save(path, n, cnames, ctensors, #keys, ckeys, cvalues) ~= 0 then fail() end
  return path
end

return M
