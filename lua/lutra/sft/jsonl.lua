-- lutra.sft.jsonl — reading the JSONL files of fine-tuning (SFT chats, DPO pairs), with every
-- error naming the file, the line and the field:
--
--   local jsonl = require "lutra.sft.jsonl"
--   for _, rec in ipairs(jsonl.read(path, "sft")) do ... rec.line, rec.value ... end
--   -- errors: "sft: data/train.jsonl:17: messages[2].role: unknown role "robot" (expected ...)"
--
-- What a file may hold (the same for SFT and DPO):
-- - one JSON object per line (RFC 8259, UTF-8); a line that is not valid JSON or not an object
--   is an error, and so is a file without any record (empty, or blank lines only);
-- - blank lines (spaces and tabs only) are skipped; CRLF line ends (Windows) are accepted: the
--   \r before each \n is dropped;
-- - a UTF-8 byte order mark at the start is an error that says so (JSON forbids it; strip it);
-- - keys the reader does not know are ignored (a dataset's "id", "source", ...).
-- Field paths in errors count list items from 0, as the JSON does: messages[0] is the first
-- message. The text checks (which characters a tokenizer can encode) are the callers', through
-- cannot_encode.
local json = require "lutra.json"
local errors = require "lutra.errors"

local raise = errors.raise

local M = {}

local BOM = "\239\187\191"

-- What a decoded JSON value is, for messages: "a string", "null", "an array", ...
function M.kind(v)
  if v == json.null then return "null" end
  local t = type(v)
  if t == "table" then return json.is_array(v) and "an array" or "an object" end
  if t == "string" then return "a string" end
  if t == "number" then return "a number" end
  if t == "boolean" then return "a boolean" end
  return "a Lua " .. t
end

-- A JSON object (a table that is not a list nor null), or a Lua table with string keys.
function M.is_object(v) return type(v) == "table" and v ~= json.null and not json.is_array(v) end

-- A list: a JSON array, or a Lua table whose keys are exactly 1..n (n >= 0; {} counts).
function M.is_list(v)
  if type(v) ~= "table" or v == json.null then return false end
  if json.is_array(v) then return true end
  local n = 0
  for _ in pairs(v) do n = n + 1 end
  return n == #v
end

-- s shown in a message: quoted, at most 40 bytes, control and non-ASCII bytes escaped.
function M.shown(s)
  if type(s) ~= "string" then return tostring(s) end
  local cut = #s > 40
  local body = s:sub(1, 40):gsub('[%c"\\\128-\255]', function(c)
    local named = {["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t", ['"'] = '\\"', ["\\"] = "\\\\"}
    return named[c] or string.format("\\x%02x", c:byte())
  end)
  return '"' .. body .. (cut and '..."' or '"')
end

-- The sorted keys of an object, for "the object has keys ...".
function M.keys(obj)
  local names = {}
  for k in pairs(obj) do
    if type(k) == "string" and k ~= "__line" then names[#names + 1] = M.shown(k) end
  end
  table.sort(names)
  if #names == 0 then return "no keys" end
  if #names > 6 then names = {names[1], names[2], names[3], names[4], names[5], names[6], "..."} end
  return "keys " .. table.concat(names, ", ")
end

-- Calls fn(value, line) for each record of a JSONL file, in order, until fn returns true (see
-- the top of this file); who prefixes every error ("sft", "dpo"). Returns the records seen.
function M.each(path, who, fn)
  who = who or "jsonl"
  if type(path) ~= "string" then raise(who .. ": the data path must be a string, got " .. type(path)) end
  local f, err = io.open(path, "rb")
  if not f then raise(string.format("%s: cannot open %s", who, tostring(err))) end
  local function fail_at(msg)
    f:close()
    raise(msg)
  end
  local n, seen = 0, 0
  while true do
    local line, read_err = f:read("*l")
    if not line then
      if read_err then fail_at(string.format("%s: %s: cannot read: %s", who, path, tostring(read_err))) end
      break
    end
    n = n + 1
    local at = string.format("%s: %s:%d: ", who, path, n)
    if n == 1 and line:sub(1, 3) == BOM then
      fail_at(at .. "the file starts with a UTF-8 byte order mark (BOM), which JSON does not allow: save it as "
        .. "UTF-8 without a BOM")
    end
    if line:sub(-1) == "\r" then line = line:sub(1, -2) end -- CRLF line ends
    if line:find("[^ \t]") then
      local v, jerr = json.try_decode(line, {ordered = true}) -- key order: a Jinja template's tojson shows it
      if v == nil then
        fail_at(at .. "invalid JSON: " .. tostring(jerr):gsub("^json: ", ""):gsub(" at line 1 column", " at column"))
      end
      if not M.is_object(v) then fail_at(at .. "expected a JSON object, got " .. M.kind(v)) end
      seen = seen + 1
      local ok, stop = pcall(fn, v, n)
      if not ok then
        f:close()
        error(stop, 0) -- fn's own error, as it raised it
      end
      if stop then break end
    end
  end
  f:close()
  if seen == 0 then
    raise(string.format("%s: %s: no records: the file is empty%s", who, path,
      n > 0 and string.format(" (%d blank line%s)", n, n == 1 and "" or "s") or ""))
  end
  return seen
end

-- The records of a JSONL file: a list of {line =, value =}.
function M.read(path, who)
  local records = {}
  M.each(path, who, function(v, line) records[#records + 1] = {line = line, value = v} end)
  return records
end

local ROLES = {system = true, user = true, assistant = true}
local ROLE_LIST = '"system", "user" or "assistant"'

-- Checks one message (at: the error prefix, name: its path, "messages[2]").
function M.check_message(at, name, m)
  if not M.is_object(m) then
    raise(string.format('%s%s: expected an object {"role", "content"}, got %s', at, name, M.kind(m)))
  end
  if m.role == nil then raise(string.format("%s%s.role: missing (expected %s)", at, name, ROLE_LIST)) end
  if type(m.role) ~= "string" then
    raise(string.format("%s%s.role: expected a string, got %s", at, name, M.kind(m.role)))
  end
  if not ROLES[m.role] then
    raise(string.format("%s%s.role: unknown role %s (expected %s)", at, name, M.shown(m.role), ROLE_LIST))
  end
  if m.content == nil then raise(string.format("%s%s.content: missing (expected a string)", at, name)) end
  if type(m.content) ~= "string" then
    raise(string.format("%s%s.content: expected a string, got %s", at, name, M.kind(m.content)))
  end
end

-- Checks a conversation: a non-empty list of messages (field: its name, "messages").
function M.check_messages(at, field, msgs, base)
  base = base or 0
  if not M.is_list(msgs) then
    raise(string.format('%s%s: expected a list of {"role", "content"} messages, got %s', at, field, M.kind(msgs)))
  end
  if #msgs == 0 then raise(string.format("%s%s: the conversation is empty (no messages)", at, field)) end
  for i, m in ipairs(msgs) do M.check_message(at, string.format("%s[%d]", field, i - 1 + base), m) end
end

-- Strips the Lua position ("file.lua:12: ") from an error message.
local function message_of(err) return (tostring(err):gsub("^[^\n]-:%d+: ", "")) end

-- When tok cannot encode text: the reason (with the character itself when the tokenizer names
-- its byte offset), else nil.
function M.cannot_encode(tok, text)
  local ok, err = pcall(tok.encode, tok, text)
  if ok then return nil end
  local why = message_of(err):gsub("^encode: ", "")
  local off = tonumber(why:match("at byte offset (%d+)"))
  local c = off and text:match("^[\194-\244][\128-\191]+", off + 1)
  if c then why = why .. string.format(" (the character %s)", c) end
  return why
end

-- Raises at the first of fields ({{name =, text =}, ...}) that tok cannot encode, else with the
-- encoder's own message err (a template's own text, say).
function M.raise_unencodable(at, tok, fields, err)
  for _, f in ipairs(fields) do
    local why = type(f.text) == "string" and M.cannot_encode(tok, f.text)
    if why then raise(string.format("%s%s: the tokenizer cannot encode it: %s", at, f.name, why)) end
  end
  raise(at .. "the text cannot be encoded: " .. message_of(err))
end

return M
