-- lutra.json — JSON (RFC 8259) for config.json, JSONL data and manifests.
--
--   local json = require "lutra.json"
--   local v = json.decode('{"a": [1, 2, null]}')   -- v.a[3] == json.null
--   json.encode(v)                                   -- '{"a":[1,2,null]}' (keys sorted)
--   json.encode(v, {indent = 2})                     -- pretty, as python's json.dumps(indent=2)
--   json.encode(json.array{})                        -- '[]' (a plain {} encodes as '{}')
--   json.read_file("config.json"); json.write_file("x.json", v, {indent = 2})
--   for line, rec in json.lines("data.jsonl") do ... end
--
-- Decoding is the C library's reader (lt_json_parse in lutra.h: strict, cJSON underneath),
-- walked through the FFI. Objects decode to tables, arrays to lists (marked, so that
-- json.is_array tells them apart and an empty one encodes back as []), null to the json.null
-- sentinel (lists keep no holes), strings with every escape (\uXXXX surrogate pairs included;
-- a lone surrogate is an error) to UTF-8; other bytes, invalid UTF-8 included, are kept as
-- they are. A repeated key: the last one wins, as in python's json. Errors read
-- "json: <what> at line L column C". Encoding is here, in Lua (and usable before the C
-- library loads): keys sorted, numbers in the shortest text that reads back, strings as
-- UTF-8 with quotes, backslashes and control characters escaped. What it writes is valid
-- JSON for any value it accepts: a string or key that is not valid UTF-8 (RFC 3629: no
-- overlong forms, surrogates or code points past U+10FFFF) is refused, not escaped (JSON
-- has no escape for a raw byte), with an error naming where it is inside the value:
-- "json: invalid UTF-8 (byte 0xff at offset 3) in the string at config.data" (Lua's
-- notation: keys after dots or in ["..."], list indices from 1). write_file writes through
-- lutra.atomic_file: a temporary beside the path, renamed over it.
local M = {}

local byte, char, sub, find, format = string.byte, string.char, string.sub, string.find, string.format
local concat, sort, floor, huge = table.concat, table.sort, math.floor, math.huge
local tonumber, type, pairs, next, setmetatable, getmetatable = tonumber, type, pairs, next, setmetatable, getmetatable

M.max_depth = 512 -- nesting bound for decode (at most 1000, the reader's own) and encode: deeper is an error

-- Errors point at the first caller outside lutra's own files (as lutra.errors does).
local library_prefix = debug.getinfo(1, "S").source:match("^(@.*[/\\])[^/\\]+$") or "@lutra/"
local function raise(msg)
  local level = 3 -- 1 is raise, 2 the library function that called it
  while true do
    local info = debug.getinfo(level, "S")
    if not info then
      level = 2 -- all library code: the innermost caller
      break
    end
    if info.what ~= "C" and sub(info.source, 1, #library_prefix) ~= library_prefix then break end
    level = level + 1
  end
  error(msg, level)
end

M.null = setmetatable({}, {
  __tostring = function() return "json.null" end,
  __newindex = function() error("json.null is read-only", 2) end,
  __metatable = "json.null",
})

-- Whether a decoded value is absent: missing (nil) or JSON null.
function M.is_null(v) return v == nil or v == M.null end

-- A value as an error message shows it: its JSON, cut to `limit` characters (default 120).
function M.show(v, limit)
  limit = limit or 120
  local ok, s = pcall(M.encode, v)
  s = ok and s or tostring(v)
  return #s > limit and s:sub(1, limit - 3) .. "..." or s
end

local ARRAY = {__jsontype = "array"}

-- Marks t (default a new table) as a JSON array, so that an empty one encodes as [].
function M.array(t) return setmetatable(t or {}, ARRAY) end
function M.is_array(t) return type(t) == "table" and getmetatable(t) == ARRAY end

-- ---- decoding: the C reader, walked ----------------------------------------------------

local api -- {C =, ffi =, len =}: the C library, loaded on the first decode
local function c_api()
  if not api then
    local lt = require "lutra.ffi"
    api = {C = lt.C, ffi = lt.ffi, len = lt.ffi.new("int64_t[1]")}
  end
  return api
end

-- The order of an object's keys as the text gave them, for objects decoded with {ordered = true}:
-- weak, so it costs nothing once t is gone.
local KEY_ORDER = setmetatable({}, {__mode = "k"})
-- json.key_order(t) -> the list of t's keys in the text's order, or nil (decoded with {ordered = true}).
function M.key_order(t) return KEY_ORDER[t] end

local T_NULL, T_FALSE, T_TRUE, T_NUMBER, T_STRING, T_ARRAY = 0, 1, 2, 3, 4, 5

-- The Lua value of v, a value of doc.
local function to_lua(a, doc, v)
  local C = a.C
  local t = C.lt_json_type(v)
  if t == T_NUMBER then return C.lt_json_number(v) end
  if t == T_STRING then
    local p = C.lt_json_string(doc, v, a.len)
    return a.ffi.string(p, a.len[0])
  end
  if t == T_TRUE then return true end
  if t == T_FALSE then return false end
  if t == T_NULL then return M.null end
  local item = C.lt_json_first(v)
  if t == T_ARRAY then
    local list, n = setmetatable({}, ARRAY), 0
    while item ~= nil do
      n = n + 1
      list[n] = to_lua(a, doc, item)
      item = C.lt_json_next(item)
    end
    return list
  end
  local obj, keys = {}, a.ordered and {} or nil
  while item ~= nil do
    local key = a.ffi.string(C.lt_json_key(doc, item, a.len), a.len[0])
    if keys and obj[key] == nil then keys[#keys + 1] = key end
    obj[key] = to_lua(a, doc, item) -- a repeated key: the last wins
    item = C.lt_json_next(item)
  end
  if keys then KEY_ORDER[obj] = keys end
  return obj
end

-- Decodes one JSON text (surrounding whitespace allowed, nothing else after it).
local function decode(s, ordered)
  if type(s) ~= "string" then error({json_error = "decode expects a string, got " .. type(s)}, 0) end
  local a = c_api()
  local out = a.ffi.new("lt_json_doc*[1]")
  if a.C.lt_json_parse(out, s, #s, M.max_depth) ~= 0 then
    error({json_error = a.ffi.string(a.C.lt_last_error())}, 0)
  end
  local doc = out[0]
  a.ordered = ordered
  local ok, v = pcall(to_lua, a, doc, a.C.lt_json_root(doc))
  a.ordered = nil
  a.C.lt_json_free(doc)
  if not ok then error(v, 0) end
  return v
end

local function protected(fn, ...)
  local ok, v = pcall(fn, ...)
  if ok then return true, v end
  if type(v) == "table" and v.json_error then return false, v.json_error end
  error(v, 0) -- not ours (out of memory, ...): pass it on
end

-- opts.ordered: remember each object's key order (json.key_order).
function M.decode(s, opts)
  local ok, v = protected(decode, s, opts and opts.ordered)
  if not ok then raise("json: " .. v) end
  return v
end

-- Like decode but returns nil, message on bad input.
function M.try_decode(s, opts)
  local ok, v = protected(decode, s, opts and opts.ordered)
  if ok then return v end
  return nil, "json: " .. v
end

local function slurp(path)
  local f, err = io.open(path, "rb")
  if not f then raise("json: cannot open " .. tostring(err)) end
  local s = f:read("*a")
  f:close()
  return s
end

function M.read_file(path, opts)
  local ok, v = protected(decode, slurp(path), opts and opts.ordered)
  if not ok then raise("json: " .. path .. ": " .. v) end
  return v
end

-- Iterates over a JSONL file: for line_number, value in json.lines(path). Blank lines are
-- skipped; a bad line raises "json: PATH:LINE: <what> at column C".
function M.lines(path)
  local f, err = io.open(path, "rb")
  if not f then raise("json: cannot open " .. tostring(err)) end
  local n = 0
  return function()
    while true do
      local line = f:read("*l")
      if not line then
        f:close()
        return nil
      end
      n = n + 1
      if find(line, "[^ \t\r\n]") then
        local ok, v = protected(decode, line)
        if not ok then
          f:close()
          raise(format("json: %s:%d: %s", path, n, (v:gsub(" at line 1 column", " at column"))))
        end
        return n, v
      end
    end
  end
end

-- ---- encoding ---------------------------------------------------------------------------

local ESC = {['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t"}
for i = 0, 31 do
  local c = char(i)
  ESC[c] = ESC[c] or format("\\u%04x", i)
end
ESC["\127"] = "\\u007f"

-- The offset of the first byte of s that does not begin a valid UTF-8 sequence, or nil.
local function invalid_utf8_at(s)
  local i = find(s, "[\128-\255]")
  while i do
    local c, b1 = byte(s, i, i + 1)
    local len = (c >= 0xC2 and c <= 0xDF and 2) or (c >= 0xE0 and c <= 0xEF and 3) or (c >= 0xF0 and c <= 0xF4 and 4)
    if not len or not b1 or b1 < 0x80 or b1 > 0xBF then return i end
    if (c == 0xE0 and b1 < 0xA0) or (c == 0xED and b1 > 0x9F) or (c == 0xF0 and b1 < 0x90) or (c == 0xF4 and b1 > 0x8F) then
      return i -- overlong, a surrogate, past U+10FFFF
    end
    for k = 2, len - 1 do
      local b = byte(s, i + k)
      if not b or b < 0x80 or b > 0xBF then return i end
    end
    i = find(s, "[\128-\255]", i + len)
  end
end
M.invalid_utf8_at = invalid_utf8_at

-- Where a value sits inside the one being encoded, in Lua's notation: config.model.name,
-- files[2], ["a key"].x; "the top level" for the value itself.
local function path_text(path)
  local out = {}
  for i, k in ipairs(path) do
    if type(k) == "number" then
      out[#out + 1] = format("[%d]", k)
    elseif find(k, "^[%a_][%w_]*$") then
      out[#out + 1] = (i > 1 and "." or "") .. k
    else
      out[#out + 1] = format("[%q]", k)
    end
  end
  return #out > 0 and concat(out) or "the top level"
end

-- s as a JSON string; path (a list of keys) names where s is, for the error on invalid UTF-8.
local function encode_string(s, path, what)
  local bad = invalid_utf8_at(s)
  if bad then
    error({json_error = format("invalid UTF-8 (byte 0x%02x at offset %d) in %s at %s", byte(s, bad), bad,
      what or "the string", path_text(path or {}))}, 0)
  end
  return '"' .. s:gsub('[%c"\\]', ESC) .. '"'
end

-- One string as JSON text (for texts built by hand, as the checkpoint manifest's); raises
-- "json: invalid UTF-8 ..." as encode does.
function M.encode_string(s)
  local ok, v = pcall(encode_string, s)
  if ok then return v end
  if type(v) == "table" and v.json_error then raise("json: " .. v.json_error) end
  error(v, 0)
end

-- The shortest of %.14g .. %.17g that reads back as x (integers without a fraction).
local function encode_number(x)
  if x ~= x or x == huge or x == -huge then
    error({json_error = "cannot encode a non-finite number (" .. tostring(x) .. ")"}, 0)
  end
  if x == floor(x) and x > -2 ^ 53 and x < 2 ^ 53 then return format("%d", x) end
  for digits = 14, 17 do
    local s = format("%." .. digits .. "g", x)
    if tonumber(s) == x then return s end
  end
  return format("%.17g", x)
end

-- kind of a table: "array" (a marked or non-empty sequence 1..n), "object" (string keys), or an error.
local function table_kind(t)
  if getmetatable(t) == ARRAY then return "array", #t end
  local n, max = 0, 0
  local strings = false
  for k in pairs(t) do
    n = n + 1
    if type(k) == "number" and k >= 1 and k == floor(k) then
      if k > max then max = k end
    elseif type(k) == "string" then
      strings = true
    else
      error({json_error = "cannot encode a table with a " .. type(k) .. " key (" .. tostring(k) .. ")"}, 0)
    end
  end
  if n == 0 then return "object" end
  if strings then
    if max > 0 then error({json_error = "cannot encode a table with both list and string keys"}, 0) end
    return "object"
  end
  if max ~= n then error({json_error = format("cannot encode a list with holes (%d values, last index %d; use json.null)", n, max)}, 0) end
  return "array", n
end

-- path: the keys from the top down to v (pushed and popped on the way), for messages.
local function encode_value(v, out, indent, depth, seen, path)
  local t = type(v)
  if t == "string" then
    out[#out + 1] = encode_string(v, path)
  elseif t == "number" then
    out[#out + 1] = encode_number(v)
  elseif t == "boolean" then
    out[#out + 1] = v and "true" or "false"
  elseif v == nil or v == M.null then
    out[#out + 1] = "null"
  elseif t == "table" then
    if seen[v] then error({json_error = "cannot encode a table that contains itself"}, 0) end
    if depth >= M.max_depth then error({json_error = format("nesting deeper than %d", M.max_depth)}, 0) end
    seen[v] = true
    local kind, n = table_kind(v)
    local nl = indent and ("\n" .. (" "):rep(indent * (depth + 1))) or ""
    local close_nl = indent and ("\n" .. (" "):rep(indent * depth)) or ""
    local level = #path + 1
    if kind == "array" then
      if n == 0 then
        out[#out + 1] = "[]"
      else
        out[#out + 1] = "["
        for i = 1, n do
          if i > 1 then out[#out + 1] = "," end
          out[#out + 1] = nl
          path[level] = i
          encode_value(v[i], out, indent, depth + 1, seen, path)
        end
        path[level] = nil
        out[#out + 1] = close_nl .. "]"
      end
    else
      local keys = {}
      for k in pairs(v) do keys[#keys + 1] = k end
      sort(keys)
      if #keys == 0 then
        out[#out + 1] = "{}"
      else
        out[#out + 1] = "{"
        for i, k in ipairs(keys) do
          if i > 1 then out[#out + 1] = "," end
          out[#out + 1] = nl .. encode_string(k, path, "a key") .. (indent and ": " or ":")
          path[level] = k
          encode_value(v[k], out, indent, depth + 1, seen, path)
        end
        path[level] = nil
        out[#out + 1] = close_nl .. "}"
      end
    end
    seen[v] = nil
  else
    error({json_error = "cannot encode a " .. t}, 0)
  end
end

local function encode(v, opts)
  local indent = opts and opts.indent
  if indent ~= nil and (type(indent) ~= "number" or indent < 0) then
    error({json_error = "indent must be a non-negative number"}, 0)
  end
  local out = {}
  encode_value(v, out, indent, 0, {}, {})
  return concat(out)
end

-- Encodes v: compact by default, with opts.indent spaces per level otherwise. Object keys
-- are sorted; strings are written as UTF-8 with quotes, backslashes and control characters
-- escaped, and a string or key that is not valid UTF-8 is an error naming where it is.
function M.encode(v, opts)
  local ok, s = protected(encode, v, opts)
  if not ok then raise("json: " .. s) end
  return s
end

-- Writes encode(v, opts) and a newline to path (lutra.atomic_file: a temporary beside it,
-- fsync'ed and renamed over it; a link planted at path is replaced, never written through).
function M.write_file(path, v, opts)
  local ok, s = protected(encode, v, opts)
  if not ok then raise("json: " .. tostring(path) .. ": " .. s) end
  local done, err = require("lutra.atomic_file").write(path, s .. "\n")
  if not done then raise("json: " .. err) end
end

return M
