-- lutra.jinja.values — the values a template computes with, as Python (Jinja's host) has them:
-- None (json.null), booleans, numbers (a Lua number is a Python int when integral, else a float;
-- a float the template makes, 3 / 1 or a literal 1.0, is boxed by M.float so it prints "3.0"),
-- tuples (lists printed with parentheses),
-- strings (UTF-8: length, indexing and slicing count characters), lists, dicts (keys in
-- insertion order, as Python's), namespaces, callables, and Undefined (a name or attribute that
-- does not exist: prints as "", is false, iterates as empty; any other use is an error, as with
-- Jinja's default Undefined).
--
--   local V = require "lutra.jinja.values"
--   local v = V.from_lua(x)        -- a Lua value (json.decode's, or a table with V.ordered keys)
--   V.str(v), V.truthy(v), V.equal(a, b), V.repr(v), V.tojson(v, indent)
--
-- Errors are thrown as {jinja = message} tables: the renderer adds the template's name and line.
local json = require "lutra.json"

local M = {}

local NONE = json.null
M.NONE = NONE

local LIST = {__name = "list"}
local DICT = {__name = "dict"}
local NAMESPACE = {__name = "namespace"}
local CALLABLE = {__name = "callable"}
local UNDEF = {__name = "undefined"}
local FLOAT = {__name = "float"}
M.LIST, M.DICT, M.NAMESPACE, M.CALLABLE, M.UNDEF, M.FLOAT = LIST, DICT, NAMESPACE, CALLABLE, UNDEF, FLOAT

function M.fail(msg, ...)
  error({jinja = select("#", ...) > 0 and string.format(msg, ...) or msg}, 0)
end
local fail = M.fail

function M.list(t) return setmetatable(t or {}, LIST) end
local TUPLES = setmetatable({}, {__mode = "k"})
function M.tuple(t)
  t = M.list(t)
  TUPLES[t] = true
  return t
end
function M.float(x) return setmetatable({v = x}, FLOAT) end
function M.is_float(v) return getmetatable(v) == FLOAT or (type(v) == "number" and v ~= math.floor(v)) end
-- The number v holds (a Lua number, a boxed float, a boolean as 0/1), or nil.
function M.tonum(v)
  local tv = type(v)
  if tv == "number" then return v end
  if tv == "boolean" then return v and 1 or 0 end
  if getmetatable(v) == FLOAT then return v.v end
  return nil
end
-- A dict: keys (their order) and map.
function M.dict() return setmetatable({keys = {}, map = {}}, DICT) end
function M.dict_set(d, k, v)
  if d.map[k] == nil then d.keys[#d.keys + 1] = k end
  d.map[k] = v
end
function M.namespace() return setmetatable({keys = {}, map = {}}, NAMESPACE) end
-- fn(args, kwargs) -> value; name for errors.
function M.callable(name, fn) return setmetatable({name = name, fn = fn}, CALLABLE) end
-- hint: the message an error about it gives ("'x' is undefined").
function M.undefined(hint) return setmetatable({hint = hint}, UNDEF) end

function M.is_list(v) return getmetatable(v) == LIST end
function M.is_dict(v) return getmetatable(v) == DICT end
function M.is_undef(v) return getmetatable(v) == UNDEF end
function M.is_int(v) return type(v) == "number" and v == math.floor(v) and v > -2 ^ 53 and v < 2 ^ 53 end

-- Using an undefined value where a value is needed.
function M.check_defined(v)
  if getmetatable(v) == UNDEF then fail("%s", v.hint) end
  return v
end

-- ---- from Lua -------------------------------------------------------------------------------

-- Key order of a Lua table: json.decode's with {ordered = true} (json.key_order), or given with
-- M.ordered(t, keys); other tables' keys come sorted.
local ORDER = setmetatable({}, {__mode = "k"})
function M.ordered(t, keys)
  ORDER[t] = keys
  return t
end

local function lua_keys(t)
  local keys = ORDER[t] or json.key_order(t)
  if keys then return keys end
  keys = {}
  for k in pairs(t) do
    if type(k) == "string" then keys[#keys + 1] = k end
  end
  table.sort(keys)
  return keys
end

function M.from_lua(x)
  local tx = type(x)
  if tx == "string" or tx == "number" or tx == "boolean" then return x end
  if x == nil or x == NONE then return NONE end
  local mt = getmetatable(x)
  if mt == LIST or mt == DICT or mt == NAMESPACE or mt == CALLABLE or mt == UNDEF or mt == FLOAT then return x end
  if tx == "function" then
    return M.callable("function", function(args) return M.from_lua(x(unpack(args))) end)
  end
  if tx ~= "table" then fail("a %s cannot be a template value", tx) end
  if json.is_array(x) or (next(x) ~= nil and x[1] ~= nil) then
    local l = M.list()
    for i = 1, #x do l[i] = M.from_lua(x[i]) end
    return l
  end
  local d = M.dict()
  for _, k in ipairs(lua_keys(x)) do
    if x[k] ~= nil then M.dict_set(d, k, M.from_lua(x[k])) end
  end
  return d
end

-- ---- UTF-8 strings as characters -------------------------------------------------------------

-- The characters of s (a list of strings); s itself marks ASCII-only (no split needed).
function M.chars(s)
  local out, n = {}, 0
  for ch in s:gmatch("[%z\1-\127\192-\255][\128-\191]*") do
    n = n + 1
    out[n] = ch
  end
  return out
end
function M.is_ascii(s) return not s:find("[\128-\255]") end
function M.len(s) return M.is_ascii(s) and #s or #M.chars(s) end

-- ---- truth, text, equality ---------------------------------------------------------------------

function M.truthy(v)
  if v == nil or v == false or v == NONE or v == 0 or v == "" then return false end
  local mt = getmetatable(v)
  if mt == UNDEF then return false end
  if mt == FLOAT then return v.v ~= 0 end
  if mt == LIST then return #v > 0 end
  if mt == DICT then return #v.keys > 0 end
  return true
end

local function float_text(x)
  if x ~= x then return "nan" end
  if x == math.huge then return "inf" end
  if x == -math.huge then return "-inf" end
  local s
  for p = 1, 17 do
    s = string.format("%." .. p .. "g", x)
    if tonumber(s) == x then break end
  end
  local exp = tonumber(s:match("e([-+]%d+)$"))
  if exp and exp >= -4 and exp < 16 then -- Python writes these without an exponent
    for q = 0, 20 do
      s = string.format("%." .. q .. "f", x)
      if tonumber(s) == x then break end
    end
  end
  if not s:find("[e.n]") then s = s .. ".0" end
  return s
end

function M.number_text(x)
  if M.is_int(x) then return string.format("%d", x) end
  return float_text(x)
end

local function py_string_repr(s)
  local q = (s:find("'", 1, true) and not s:find('"', 1, true)) and '"' or "'"
  local body = s:gsub("[\\\n\r\t" .. q .. "%c]", function(c)
    if c == "\\" then return "\\\\" end
    if c == "\n" then return "\\n" end
    if c == "\r" then return "\\r" end
    if c == "\t" then return "\\t" end
    if c == q then return "\\" .. q end
    return string.format("\\x%02x", c:byte())
  end)
  return q .. body .. q
end

-- Python's repr (what str() gives inside a list or dict).
function M.repr(v)
  if type(v) == "string" then return py_string_repr(v) end
  if getmetatable(v) == LIST then
    local parts = {}
    for i, x in ipairs(v) do parts[i] = M.repr(x) end
    if TUPLES[v] then return "(" .. table.concat(parts, ", ") .. (#v == 1 and ",)" or ")") end
    return "[" .. table.concat(parts, ", ") .. "]"
  end
  if getmetatable(v) == DICT then
    local parts = {}
    for i, k in ipairs(v.keys) do parts[i] = M.repr(k) .. ": " .. M.repr(v.map[k]) end
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  return M.str(v)
end

-- Python's str(): what {{ v }} prints.
function M.str(v)
  local tv = type(v)
  if tv == "string" then return v end
  if tv == "number" then return M.number_text(v) end
  if tv == "boolean" then return v and "True" or "False" end
  if v == NONE then return "None" end
  local mt = getmetatable(v)
  if mt == UNDEF then return "" end
  if mt == FLOAT then return float_text(v.v) end
  if mt == LIST or mt == DICT then return M.repr(v) end
  if mt == NAMESPACE then return "<Namespace>" end
  if mt == CALLABLE then return "<function " .. v.name .. ">" end
  return tostring(v)
end

function M.equal(a, b)
  if a == b then return true end
  local na, nb = M.tonum(a), M.tonum(b)
  if na and nb then return na == nb end
  local ta, tb = type(a), type(b)
  if ta ~= "table" or tb ~= "table" then return false end
  local ma, mb = getmetatable(a), getmetatable(b)
  if ma ~= mb then return false end
  if ma == LIST then
    if #a ~= #b then return false end
    for i = 1, #a do
      if not M.equal(a[i], b[i]) then return false end
    end
    return true
  end
  if ma == DICT then
    if #a.keys ~= #b.keys then return false end
    for _, k in ipairs(a.keys) do
      if b.map[k] == nil or not M.equal(a.map[k], b.map[k]) then return false end
    end
    return true
  end
  return ma == UNDEF -- two undefined values are equal (Undefined.__eq__)
end

-- The type name Python gives in error messages.
function M.type_name(v)
  local tv = type(v)
  if tv == "string" then return "str" end
  if tv == "number" then return M.is_int(v) and "int" or "float" end
  if getmetatable(v) == FLOAT then return "float" end
  if tv == "boolean" then return "bool" end
  if v == NONE then return "NoneType" end
  local mt = getmetatable(v)
  return mt and mt.__name or tv
end

-- ---- tojson: Python's json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=False) ----

local function json_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    if c == '"' then return '\\"' end
    if c == "\\" then return "\\\\" end
    if c == "\n" then return "\\n" end
    if c == "\r" then return "\\r" end
    if c == "\t" then return "\\t" end
    if c == "\b" then return "\\b" end
    if c == "\f" then return "\\f" end
    if c:byte() == 127 then return c end
    return string.format("\\u%04x", c:byte())
  end) .. '"'
end

local function dumps(v, indent, level, out, sep_item, sep_key)
  local tv = type(v)
  if tv == "string" then
    out[#out + 1] = json_string(v)
  elseif tv == "number" then
    if v ~= v or v == math.huge or v == -math.huge then
      out[#out + 1] = v ~= v and "NaN" or (v > 0 and "Infinity" or "-Infinity")
    else
      out[#out + 1] = M.number_text(v)
    end
  elseif tv == "boolean" then
    out[#out + 1] = v and "true" or "false"
  elseif getmetatable(v) == FLOAT then
    out[#out + 1] = float_text(v.v)
  elseif v == NONE then
    out[#out + 1] = "null"
  else
    local mt = getmetatable(v)
    local is_list = mt == LIST
    if not is_list and mt ~= DICT then fail("Object of type %s is not JSON serializable", M.type_name(v)) end
    local n = is_list and #v or #v.keys
    if n == 0 then
      out[#out + 1] = is_list and "[]" or "{}"
      return
    end
    out[#out + 1] = is_list and "[" or "{"
    local pad_in, pad_out
    if indent then
      pad_in = "\n" .. string.rep(" ", indent * (level + 1))
      pad_out = "\n" .. string.rep(" ", indent * level)
    end
    for i = 1, n do
      if i > 1 then out[#out + 1] = sep_item end
      if pad_in then out[#out + 1] = pad_in end
      if is_list then
        dumps(v[i], indent, level + 1, out, sep_item, sep_key)
      else
        local k = v.keys[i]
        out[#out + 1] = type(k) == "string" and json_string(k) or json_string(M.str(k))
        out[#out + 1] = sep_key
        dumps(v.map[k], indent, level + 1, out, sep_item, sep_key)
      end
    end
    if pad_out then out[#out + 1] = pad_out end
    out[#out + 1] = is_list and "]" or "}"
  end
end

function M.tojson(v, indent, separators)
  local out = {}
  local sep_item, sep_key = indent and "," or ", ", ": "
  if separators then sep_item, sep_key = separators[1], separators[2] end
  dumps(v, indent, 0, out, sep_item, sep_key)
  return table.concat(out)
end

return M
