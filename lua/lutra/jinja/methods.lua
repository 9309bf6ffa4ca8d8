-- lutra.jinja.methods — the Python methods a template may call on its values: str's (strip,
-- split, startswith, replace, format, ...), dict's (items, keys, values, get) and list's (index,
-- count). Methods that change a value (list.append, dict.update, ...) are refused, as transformers'
-- immutable sandbox refuses them.
--
--   local m = methods.lookup(value, "startswith")   -- a callable bound to value, or nil
local V = require "lutra.jinja.values"

local M = {}

local fail, NONE = V.fail, V.NONE

-- ---- whitespace as Python's str.isspace --------------------------------------------------------

local SPACE = {[" "] = true, ["\t"] = true, ["\n"] = true, ["\v"] = true, ["\f"] = true, ["\r"] = true,
               ["\28"] = true, ["\29"] = true, ["\30"] = true, ["\31"] = true, ["\194\133"] = true,
               ["\194\160"] = true, ["\225\154\128"] = true, ["\226\128\168"] = true, ["\226\128\169"] = true,
               ["\226\128\175"] = true, ["\226\129\159"] = true, ["\227\128\128"] = true}
for cp = 0x2000, 0x200A do SPACE["\226\128" .. string.char(0x80 + cp - 0x2000)] = true end
M.SPACE = SPACE

-- s without leading (left) and/or trailing (right) characters in set (a string of characters;
-- nil: whitespace).
function M.strip(s, chars, left, right)
  local set = SPACE
  if chars ~= nil and chars ~= NONE then
    if type(chars) ~= "string" then fail("strip arg must be None or str") end
    set = {}
    for _, c in ipairs(V.chars(chars)) do set[c] = true end
  end
  local cs = V.chars(s)
  local i, j = 1, #cs
  if left then while i <= j and set[cs[i]] do i = i + 1 end end
  if right then while j >= i and set[cs[j]] do j = j - 1 end end
  return table.concat(cs, "", i, j)
end

local function split(s, sep, maxsplit)
  maxsplit = (maxsplit == nil or maxsplit == NONE) and -1 or maxsplit
  local out = V.list()
  if sep == nil or sep == NONE then
    local cs = V.chars(s)
    local i, n = 1, #cs
    while true do
      while i <= n and SPACE[cs[i]] do i = i + 1 end
      if i > n then break end
      if maxsplit >= 0 and #out >= maxsplit then
        local j = n
        while SPACE[cs[j]] do j = j - 1 end
        out[#out + 1] = table.concat(cs, "", i, j)
        break
      end
      local j = i
      while j <= n and not SPACE[cs[j]] do j = j + 1 end
      out[#out + 1] = table.concat(cs, "", i, j - 1)
      i = j
    end
    return out
  end
  if type(sep) ~= "string" then fail("must be str or None, not %s", V.type_name(sep)) end
  if sep == "" then fail("empty separator") end
  local pos = 1
  while maxsplit < 0 or #out < maxsplit do
    local a, b = s:find(sep, pos, true)
    if not a then break end
    out[#out + 1] = s:sub(pos, a - 1)
    pos = b + 1
  end
  out[#out + 1] = s:sub(pos)
  return out
end

local function prefixes(arg, what)
  if type(arg) == "string" then return {arg} end
  if V.is_list(arg) then return arg end
  fail("%s first arg must be str or a tuple of str, not %s", what, V.type_name(arg))
end

local function replace(s, old, new, count)
  if type(old) ~= "string" or type(new) ~= "string" then fail("replace arguments must be str") end
  count = (count == nil or count == NONE) and -1 or count
  if old == "" then
    local cs, out = V.chars(s), {}
    for i, c in ipairs(cs) do
      if count < 0 or i <= count then out[#out + 1] = new end
      out[#out + 1] = c
    end
    if count < 0 or #cs + 1 <= count then out[#out + 1] = new end
    return table.concat(out)
  end
  local out, pos, done = {}, 1, 0
  while count < 0 or done < count do
    local a, b = s:find(old, pos, true)
    if not a then break end
    out[#out + 1] = s:sub(pos, a - 1)
    out[#out + 1] = new
    pos, done = b + 1, done + 1
  end
  out[#out + 1] = s:sub(pos)
  return table.concat(out)
end
M.replace = replace

-- ---- letter case: ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (what chat templates meet) ----

local UPPER, LOWER = {}, {}
local function utf8_char(cp)
  if cp < 0x80 then return string.char(cp) end
  return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) -- (all the pairs below are < U+0800)
end
local function pair(up, low)
  UPPER[utf8_char(low)], LOWER[utf8_char(up)] = utf8_char(up), utf8_char(low)
end
for cp = 0xC0, 0xDE do
  if cp ~= 0xD7 then pair(cp, cp + 0x20) end
end
for cp = 0x100, 0x17F, 2 do
  if cp ~= 0x130 and cp ~= 0x138 and not (cp >= 0x139 and cp <= 0x148) and not (cp >= 0x179 and cp <= 0x17E) then
    pair(cp, cp + 1)
  end
end
for cp = 0x139, 0x147, 2 do pair(cp, cp + 1) end
for cp = 0x179, 0x17D, 2 do pair(cp, cp + 1) end
for cp = 0x391, 0x3A9 do
  if cp ~= 0x3A2 then pair(cp, cp + 0x20) end
end
for cp = 0x410, 0x42F do pair(cp, cp + 0x20) end
for cp = 0x400, 0x40F do pair(cp, cp + 0x50) end

local function map_case(s, tbl, ascii)
  if M.is_ascii_only(s) then return ascii(s) end
  return (s:gsub("[%z\1-\127\192-\255][\128-\191]*", function(c)
    if #c == 1 then return ascii(c) end
    return tbl[c] or c
  end))
end
function M.is_ascii_only(s) return not s:find("[\128-\255]") end
function M.upper(s) return map_case(s, UPPER, string.upper) end
function M.lower(s) return map_case(s, LOWER, string.lower) end
local function cased(c) return c:match("^%a$") ~= nil or UPPER[c] ~= nil or LOWER[c] ~= nil end

function M.capitalize(s)
  local cs = V.chars(s)
  if #cs == 0 then return s end
  return M.upper(cs[1]) .. M.lower(table.concat(cs, "", 2))
end
function M.title(s)
  local out, prev_cased = {}, false
  for i, c in ipairs(V.chars(s)) do
    out[i] = prev_cased and M.lower(c) or M.upper(c)
    prev_cased = cased(c)
  end
  return table.concat(out)
end

-- str.format with {} / {0} / {name} fields (no format specs).
local function format(s, args, kwargs)
  local auto = 0
  local out = s:gsub("{{", "\1"):gsub("}}", "\2"):gsub("{([^{}]*)}", function(field)
    if field:find("[:!]") then fail("format specs in str.format are not supported") end
    local v
    if field == "" then
      auto = auto + 1
      v = args[auto]
    elseif field:match("^%d+$") then
      v = args[tonumber(field) + 1]
    else
      v = kwargs[field]
    end
    if v == nil then fail("str.format: no argument for {%s}", field) end
    return V.str(v)
  end)
  return (out:gsub("\1", "{"):gsub("\2", "}"))
end

local STR = {
  startswith = function(s, a)
    for _, p in ipairs(prefixes(a[1], "startswith")) do
      if s:sub(1, #p) == p then return true end
    end
    return false
  end,
  endswith = function(s, a)
    for _, p in ipairs(prefixes(a[1], "endswith")) do
      if p == "" or s:sub(-#p) == p then return true end
    end
    return false
  end,
  strip = function(s, a) return M.strip(s, a[1], true, true) end,
  lstrip = function(s, a) return M.strip(s, a[1], true, false) end,
  rstrip = function(s, a) return M.strip(s, a[1], false, true) end,
  split = function(s, a, kw) return split(s, a[1] or kw.sep, a[2] or kw.maxsplit) end,
  upper = function(s) return M.upper(s) end,
  lower = function(s) return M.lower(s) end,
  rsplit = function(s, a, kw)
    local sep, maxsplit = a[1] or kw.sep, a[2] or kw.maxsplit
    if sep == NONE then sep = nil end
    if maxsplit == nil or maxsplit == NONE or maxsplit < 0 then return split(s, sep, nil) end
    if sep == nil then fail("str.rsplit with maxsplit and no separator is not supported") end
    local parts = split(s, sep, nil)
    local keep = #parts - maxsplit -- the leftmost pieces stay joined
    if keep <= 1 then return parts end
    local out = V.list {table.concat(parts, sep, 1, keep)}
    for i = keep + 1, #parts do out[#out + 1] = parts[i] end
    return out
  end,
  title = function(s) return M.title(s) end,
  capitalize = function(s) return M.capitalize(s) end,
  replace = function(s, a) return replace(s, a[1], a[2], a[3]) end,
  format = function(s, a, kw) return format(s, a, kw) end,
  join = function(s, a)
    local parts = {}
    local items = a[1]
    if type(items) == "string" then
      items = V.chars(items)
    elseif V.is_dict(items) then
      items = items.keys
    elseif not V.is_list(items) then
      fail("can only join an iterable")
    end
    for i, x in ipairs(items) do
      if type(x) ~= "string" then fail("sequence item %d: expected str instance, %s found", i - 1, V.type_name(x)) end
      parts[i] = x
    end
    return table.concat(parts, s)
  end,
  find = function(s, a)
    local at = s:find(a[1], 1, true)
    return at and V.len(s:sub(1, at - 1)) or -1
  end,
  count = function(s, a)
    local n, pos = 0, 1
    while true do
      local x, y = s:find(a[1], pos, true)
      if not x then return n end
      n, pos = n + 1, math.max(y + 1, x + 1)
    end
  end,
  splitlines = function(s)
    local out = V.list()
    for line in (s .. "\n"):gmatch("(.-)\r?\n") do out[#out + 1] = line end
    if s == "" or s:sub(-1) == "\n" then out[#out] = nil end
    return out
  end,
  isdigit = function(s) return s ~= "" and not s:find("%D") end,
  isalpha = function(s) return s ~= "" and not s:find("%A") end,
  isspace = function(s) return s ~= "" and M.strip(s, nil, true, true) == "" end,
}

local DICT = {
  items = function(d)
    local out = V.list()
    for i, k in ipairs(d.keys) do out[i] = V.tuple {k, d.map[k]} end
    return out
  end,
  keys = function(d)
    local out = V.list()
    for i, k in ipairs(d.keys) do out[i] = k end
    return out
  end,
  values = function(d)
    local out = V.list()
    for i, k in ipairs(d.keys) do out[i] = d.map[k] end
    return out
  end,
  get = function(d, a)
    local v = d.map[a[1]]
    if v == nil then return a[2] == nil and NONE or a[2] end
    return v
  end,
}

local LISTM = {
  index = function(l, a)
    for i, x in ipairs(l) do
      if V.equal(x, a[1]) then return i - 1 end
    end
    fail("%s is not in list", V.repr(a[1]))
  end,
  count = function(l, a)
    local n = 0
    for _, x in ipairs(l) do
      if V.equal(x, a[1]) then n = n + 1 end
    end
    return n
  end,
}

local MUTATING = {append = true, extend = true, insert = true, pop = true, remove = true, clear = true, sort = true,
                  reverse = true, update = true, setdefault = true, popitem = true}

-- A callable bound to v for the method name, or nil when v has no such method.
function M.lookup(v, name)
  local tbl
  if type(v) == "string" then
    tbl = STR
  elseif V.is_dict(v) then
    tbl = DICT
  elseif V.is_list(v) then
    tbl = LISTM
  else
    return nil
  end
  local fn = tbl[name]
  if fn then
    return V.callable(V.type_name(v) .. "." .. name, function(args, kwargs) return fn(v, args, kwargs or {}) end)
  end
  if MUTATING[name] and type(v) ~= "string" then
    return V.callable(name, function()
      fail("access to attribute '%s' of '%s' object is unsafe (templates cannot change their values)", name,
        V.type_name(v))
    end)
  end
  return nil
end

return M
