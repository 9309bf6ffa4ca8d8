-- lutra.json — JSON (RFC 8259) in plain Lua, for config.json, JSONL data and manifests.
--
--   local json = require "lutra.json"
--   local v = json.decode('{"a": [1, 2, null]}')   -- v.a[3] == json.null
--   json.encode(v)                                   -- '{"a":[1,2,null]}' (keys sorted)
--   json.encode(v, {indent = 2})                     -- pretty, as python's json.dumps(indent=2)
--   json.encode(json.array{})                        -- '[]' (a plain {} encodes as '{}')
--   json.read_file("config.json"); json.write_file("x.json", v, {indent = 2})
--   for line, rec in json.lines("data.jsonl") do ... end
--
-- Objects decode to tables, arrays to lists (marked, so that json.is_array tells them apart
-- and an empty one encodes back as []), null to the json.null sentinel (lists keep no holes),
-- strings with every escape (\uXXXX surrogate pairs included) to UTF-8. Errors read
-- "json: <what> at line L column C". Pure Lua: no FFI, usable before the C library loads.
local M = {}

local byte, char, sub, find, format = string.byte, string.char, string.sub, string.find, string.format
local concat, sort, floor, huge = table.concat, table.sort, math.floor, math.huge
local tonumber, type, pairs, next, setmetatable, getmetatable = tonumber, type, pairs, next, setmetatable, getmetatable

M.max_depth = 512 -- nesting bound for decode and encode (deeper input is an error, not a C stack overflow)

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

local ARRAY = {__jsontype = "array"}

-- Marks t (default a new table) as a JSON array, so that an empty one encodes as [].
function M.array(t) return setmetatable(t or {}, ARRAY) end
function M.is_array(t) return type(t) == "table" and getmetatable(t) == ARRAY end

-- ---- decoding ---------------------------------------------------------------------------

-- Line and column (1-based, columns in bytes) of position pos in s.
local function where(s, pos)
  local line, line_start = 1, 1
  local i = 1
  while true do
    local nl = find(s, "\n", i, true)
    if not nl or nl >= pos then break end
    line, line_start, i = line + 1, nl + 1, nl + 1
  end
  return line, pos - line_start + 1
end

local function fail(s, pos, what)
  local line, col = where(s, pos)
  error({json_error = format("%s at line %d column %d", what, line, col)}, 0)
end

local function show_char(s, pos)
  if pos > #s then return "end of input" end
  local c = sub(s, pos, pos)
  if byte(c) < 32 or byte(c) > 126 then return format("byte 0x%02x", byte(c)) end
  return "'" .. c .. "'"
end

local function skip(s, pos)
  return find(s, "[^ \t\r\n]", pos) or #s + 1
end

local function utf8(cp)
  if cp < 0x80 then return char(cp) end
  if cp < 0x800 then return char(0xC0 + floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then return char(0xE0 + floor(cp / 4096), 0x80 + floor(cp / 64) % 64, 0x80 + cp % 64) end
  return char(0xF0 + floor(cp / 262144), 0x80 + floor(cp / 4096) % 64, 0x80 + floor(cp / 64) % 64, 0x80 + cp % 64)
end

local ESCAPES = {[34] = '"', [92] = "\\", [47] = "/", [98] = "\b", [102] = "\f", [110] = "\n", [114] = "\r", [116] = "\t"}

local function hex4(s, pos)
  local h = sub(s, pos, pos + 3)
  if not find(h, "^%x%x%x%x$") then fail(s, pos, "bad \\u escape (four hex digits expected)") end
  return tonumber(h, 16)
end

-- s[pos] is the opening quote; returns the string and the position after the closing one.
local function decode_string(s, pos)
  local parts, n, i = {}, 0, pos + 1
  while true do
    local j = find(s, '["\\%z\1-\31]', i)
    if not j then fail(s, pos, "unterminated string") end
    if j > i then n = n + 1; parts[n] = sub(s, i, j - 1) end
    local c = byte(s, j)
    if c == 34 then return concat(parts), j + 1 end
    if c ~= 92 then fail(s, j, format("control character 0x%02x in string (escape it)", c)) end
    local e = byte(s, j + 1)
    if e == 117 then -- \uXXXX, maybe a surrogate pair
      local cp = hex4(s, j + 2)
      i = j + 6
      if cp >= 0xD800 and cp <= 0xDBFF then
        if sub(s, i, i + 1) ~= "\\u" then fail(s, j, format("lone high surrogate \\u%04X", cp)) end
        local lo = hex4(s, i + 2)
        if lo < 0xDC00 or lo > 0xDFFF then fail(s, i, format("\\u%04X does not follow high surrogate \\u%04X", lo, cp)) end
        cp = 0x10000 + (cp - 0xD800) * 1024 + (lo - 0xDC00)
        i = i + 6
      elseif cp >= 0xDC00 and cp <= 0xDFFF then
        fail(s, j, format("lone low surrogate \\u%04X", cp))
      end
      n = n + 1; parts[n] = utf8(cp)
    else
      local r = e and ESCAPES[e]
      if not r then fail(s, j, "bad escape \\" .. (e and char(e) or "")) end
      n = n + 1; parts[n] = r
      i = j + 2
    end
  end
end

local decode_value

local function decode_number(s, pos)
  local a, b = find(s, "^-?%d+", pos)
  if not a then fail(s, pos, "unexpected " .. show_char(s, pos)) end
  if b - a >= 1 and find(s, "^-?0%d", pos) then fail(s, pos, "leading zero in number") end
  local e = b
  local f1, f2 = find(s, "^%.%d+", e + 1)
  if f1 then e = f2 elseif byte(s, e + 1) == 46 then fail(s, e + 1, "digit expected after '.'") end
  local x1, x2 = find(s, "^[eE][-+]?%d+", e + 1)
  if x1 then e = x2 elseif find(s, "^[eE]", e + 1) then fail(s, e + 1, "digits expected in exponent") end
  local x = tonumber(sub(s, pos, e))
  if x == nil or x == huge or x == -huge then fail(s, pos, "number " .. sub(s, pos, e) .. " is out of range") end
  return x, e + 1
end

local function decode_array(s, pos, depth)
  local list, n = setmetatable({}, ARRAY), 0
  pos = skip(s, pos + 1)
  if byte(s, pos) == 93 then return list, pos + 1 end
  while true do
    local v
    v, pos = decode_value(s, pos, depth)
    n = n + 1; list[n] = v
    pos = skip(s, pos)
    local c = byte(s, pos)
    if c == 93 then return list, pos + 1 end
    if c ~= 44 then fail(s, pos, "',' or ']' expected, got " .. show_char(s, pos)) end
    pos = skip(s, pos + 1)
  end
end

local function decode_object(s, pos, depth)
  local obj = {}
  pos = skip(s, pos + 1)
  if byte(s, pos) == 125 then return obj, pos + 1 end
  while true do
    if byte(s, pos) ~= 34 then fail(s, pos, "string key expected, got " .. show_char(s, pos)) end
    local key
    key, pos = decode_string(s, pos)
    pos = skip(s, pos)
    if byte(s, pos) ~= 58 then fail(s, pos, "':' expected, got " .. show_char(s, pos)) end
    local v
    v, pos = decode_value(s, skip(s, pos + 1), depth)
    obj[key] = v -- a repeated key: the last wins, as in python's json
    pos = skip(s, pos)
    local c = byte(s, pos)
    if c == 125 then return obj, pos + 1 end
    if c ~= 44 then fail(s, pos, "',' or '}' expected, got " .. show_char(s, pos)) end
    pos = skip(s, pos + 1)
  end
end

decode_value = function(s, pos, depth)
  local c = byte(s, pos)
  if c == 123 or c == 91 then
    if depth >= M.max_depth then fail(s, pos, format("nesting deeper than %d", M.max_depth)) end
    if c == 123 then return decode_object(s, pos, depth + 1) end
    return decode_array(s, pos, depth + 1)
  elseif c == 34 then
    return decode_string(s, pos)
  elseif c == 116 and sub(s, pos, pos + 3) == "true" then
    return true, pos + 4
  elseif c == 102 and sub(s, pos, pos + 4) == "false" then
    return false, pos + 5
  elseif c == 110 and sub(s, pos, pos + 3) == "null" then
    return M.null, pos + 4
  elseif c == nil then
    fail(s, pos, "unexpected end of input")
  end
  return decode_number(s, pos)
end

-- Decodes one JSON text (surrounding whitespace allowed, nothing else after it).
local function decode(s)
  if type(s) ~= "string" then error({json_error = "decode expects a string, got " .. type(s)}, 0) end
  if sub(s, 1, 3) == "\239\187\191" then s = sub(s, 4) end -- a UTF-8 byte order mark
  local pos = skip(s, 1)
  local v
  v, pos = decode_value(s, pos, 0)
  pos = skip(s, pos)
  if pos <= #s then fail(s, pos, "extra data after the value: " .. show_char(s, pos)) end
  return v
end

local function protected(fn, ...)
  local ok, v = pcall(fn, ...)
  if ok then return true, v end
  if type(v) == "table" and v.json_error then return false, v.json_error end
  error(v, 0) -- not ours (out of memory, ...): pass it on
end

function M.decode(s)
  local ok, v = protected(decode, s)
  if not ok then raise("json: " .. v) end
  return v
end

-- Like decode but returns nil, message on bad input.
function M.try_decode(s)
  local ok, v = protected(decode, s)
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

function M.read_file(path)
  local ok, v = protected(decode, slurp(path))
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

local function encode_string(s) return '"' .. s:gsub('[%c"\\]', ESC) .. '"' end
M.encode_string = encode_string

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

local function encode_value(v, out, indent, depth, seen)
  local t = type(v)
  if t == "string" then
    out[#out + 1] = encode_string(v)
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
    if kind == "array" then
      if n == 0 then
        out[#out + 1] = "[]"
      else
        out[#out + 1] = "["
        for i = 1, n do
          if i > 1 then out[#out + 1] = "," end
          out[#out + 1] = nl
          encode_value(v[i], out, indent, depth + 1, seen)
        end
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
          out[#out + 1] = nl .. encode_string(k) .. (indent and ": " or ":")
          encode_value(v[k], out, indent, depth + 1, seen)
        end
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
  encode_value(v, out, indent, 0, {})
  return concat(out)
end

-- Encodes v: compact by default, with opts.indent spaces per level otherwise. Object keys
-- are sorted; strings are written as UTF-8 with quotes, backslashes and control characters escaped.
function M.encode(v, opts)
  local ok, s = protected(encode, v, opts)
  if not ok then raise("json: " .. s) end
  return s
end

-- Writes encode(v, opts) and a newline to path.
function M.write_file(path, v, opts)
  local ok, s = protected(encode, v, opts)
  if not ok then raise("json: " .. path .. ": " .. s) end
  local f, err = io.open(path, "wb")
  if not f then raise("json: cannot write " .. tostring(err)) end
  f:write(s, "\n")
  f:close()
end

return M
