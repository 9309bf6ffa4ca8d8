-- lutra.jinja.filters — Jinja's filters (|trim, |tojson, |join, |selectattr, ...) and tests
-- (is defined, is string, ...) as Jinja 3.1 defines them, with transformers' tojson (no HTML
-- escaping, keys in their order, ensure_ascii off, indent/separators/sort_keys).
--
--   F.filter(r, "trim", value, args, kwargs)    -- r: the renderer (attribute lookups, line)
--   F.test(r, "defined", value, args, kwargs)
--   F.iterate(value)                            -- the items a for loop walks (a Lua list)
--
-- A filter or test Jinja has and chat templates do not use is an error naming it.
local V = require "lutra.jinja.values"
local methods = require "lutra.jinja.methods"

local M = {}

local fail, NONE, UNDEF, LIST, DICT = V.fail, V.NONE, V.UNDEF, V.LIST, V.DICT

function M.iterate(v)
  local mt = getmetatable(v)
  if mt == LIST then return v end
  if mt == DICT then return v.keys end
  if mt == UNDEF then return {} end
  if type(v) == "string" then return V.chars(v) end
  fail("'%s' object is not iterable", V.type_name(v))
end

local function need_string(v, what)
  if getmetatable(v) == UNDEF then fail("%s", v.hint) end
  if type(v) ~= "string" then fail("%s expects a string, got %s", what, V.type_name(v)) end
  return v
end

-- value's attribute (dotted: "a.b", digits index lists), as Jinja's make_attrgetter.
local function attr_of(r, v, path)
  if type(path) ~= "string" then return r:getitem(v, path) end
  for part in path:gmatch("[^.]+") do
    local k = part:match("^%d+$") and tonumber(part) or part
    v = r:getitem(v, k)
  end
  return v
end

local function sort_key_compare(a, b)
  if type(a) == "string" and type(b) == "string" then return a < b end
  local x, y = V.tonum(a), V.tonum(b)
  if x and y then return x < y end
  fail("'<' not supported between instances of '%s' and '%s'", V.type_name(a), V.type_name(b))
end

local FILTERS
FILTERS = {
  trim = function(_, v, a) return methods.strip(need_string(V.str(v), "trim"), a[1], true, true) end,
  length = function(_, v)
    if type(v) == "string" then return V.len(v) end
    local mt = getmetatable(v)
    if mt == LIST then return #v end
    if mt == DICT then return #v.keys end
    if mt == UNDEF then return 0 end
    fail("object of type '%s' has no len()", V.type_name(v))
  end,
  tojson = function(_, v, a, kw)
    local indent = kw.indent or a[1]
    if indent == NONE then indent = nil end
    if indent ~= nil and not V.is_int(indent) then fail("tojson: indent must be an integer") end
    if kw.sort_keys ~= nil and V.truthy(kw.sort_keys) then fail("tojson: sort_keys is not supported") end
    if kw.ensure_ascii ~= nil and V.truthy(kw.ensure_ascii) then fail("tojson: ensure_ascii is not supported") end
    local seps = kw.separators
    if seps ~= nil and seps ~= NONE then
      if not V.is_list(seps) or #seps ~= 2 then fail("tojson: separators must be a pair of strings") end
    else
      seps = nil
    end
    return V.tojson(v, indent, seps)
  end,
  string = function(_, v) return V.str(v) end,
  join = function(r, v, a, kw)
    local sep = a[1] or kw.d or ""
    local attribute = a[2] or kw.attribute
    local parts = {}
    for i, x in ipairs(M.iterate(v)) do
      if attribute ~= nil then x = attr_of(r, x, attribute) end
      parts[i] = V.str(x)
    end
    return table.concat(parts, V.str(sep))
  end,
  upper = function(_, v) return methods.upper(V.str(v)) end,
  lower = function(_, v) return methods.lower(V.str(v)) end,
  capitalize = function(_, v) return methods.capitalize(V.str(v)) end,
  title = function(_, v) return methods.title(V.str(v)) end,
  default = function(_, v, a, kw)
    local dflt = a[1] or kw.default_value or ""
    local boolean = a[2] or kw.boolean
    if getmetatable(v) == UNDEF or (boolean and V.truthy(boolean) and not V.truthy(v)) then return dflt end
    return v
  end,
  first = function(_, v)
    local items = M.iterate(v)
    return items[1] or V.undefined("No first item, sequence was empty.")
  end,
  last = function(_, v)
    local items = M.iterate(v)
    return items[#items] or V.undefined("No last item, sequence was empty.")
  end,
  items = function(_, v)
    if getmetatable(v) == UNDEF then return V.list() end
    if getmetatable(v) ~= DICT then fail("Can only get item pairs from a mapping.") end
    local out = V.list()
    for i, k in ipairs(v.keys) do out[i] = V.tuple {k, v.map[k]} end
    return out
  end,
  list = function(_, v)
    local out = V.list()
    for i, x in ipairs(M.iterate(v)) do out[i] = x end
    return out
  end,
  replace = function(_, v, a) return methods.replace(V.str(v), a[1], a[2], a[3]) end,
  int = function(_, v, a)
    local n = V.tonum(v)
    if n then return n >= 0 and math.floor(n) or math.ceil(n) end
    local n = type(v) == "string" and tonumber((v:gsub("_", ""))) or nil
    if n == nil then return a[1] or 0 end
    return n >= 0 and math.floor(n) or math.ceil(n)
  end,
  float = function(_, v, a)
    local n = V.tonum(v) or (type(v) == "string" and tonumber(v)) or nil
    if n then return V.float(n) end
    return a[1] or V.float(0)
  end,
  abs = function(_, v)
    local n = V.tonum(v)
    if not n then fail("bad operand type for abs(): '%s'", V.type_name(v)) end
    return V.is_float(v) and V.float(math.abs(n)) or math.abs(n)
  end,
  safe = function(_, v) return v end,
  escape = function(_, v)
    return (V.str(v):gsub("[&<>\"']", {["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&#34;",
                                        ["'"] = "&#39;"}))
  end,
  reverse = function(_, v)
    if type(v) == "string" then
      local cs = V.chars(v)
      local out = {}
      for i = #cs, 1, -1 do out[#out + 1] = cs[i] end
      return table.concat(out)
    end
    local items, out = M.iterate(v), V.list()
    for i = #items, 1, -1 do out[#out + 1] = items[i] end
    return out
  end,
  unique = function(_, v)
    local out = V.list()
    for _, x in ipairs(M.iterate(v)) do
      local seen = false
      for _, y in ipairs(out) do seen = seen or V.equal(x, y) end
      if not seen then out[#out + 1] = x end
    end
    return out
  end,
  sort = function(r, v, a, kw)
    local reverse = V.truthy(a[1] or kw.reverse or false)
    local attribute = kw.attribute or a[3]
    local out = V.list()
    for i, x in ipairs(M.iterate(v)) do out[i] = x end
    local keyed = {}
    for i, x in ipairs(out) do keyed[i] = {k = attribute and attr_of(r, x, attribute) or x, i = i, v = x} end
    table.sort(keyed, function(p, q)
      if V.equal(p.k, q.k) then return p.i < q.i end
      if reverse then return sort_key_compare(q.k, p.k) end
      return sort_key_compare(p.k, q.k)
    end)
    for i, p in ipairs(keyed) do out[i] = p.v end
    return out
  end,
  sum = function(r, v, a, kw)
    local total = kw.start or 0
    for _, x in ipairs(M.iterate(v)) do
      if kw.attribute or a[1] then x = attr_of(r, x, kw.attribute or a[1]) end
      total = total + (V.tonum(x) or fail("unsupported operand type(s) for +: 'int' and '%s'", V.type_name(x)))
    end
    return total
  end,
  indent = function(_, v, a, kw)
    local width = a[1] or kw.width or 4
    local pad = type(width) == "string" and width or string.rep(" ", width)
    local s = V.str(v)
    local first = V.truthy(a[2] or kw.first or false)
    local out = s:gsub("\n([^\n])", "\n" .. pad .. "%1")
    if first then out = pad .. out end
    return out
  end,
  wordcount = function(_, v)
    local n = 0
    for _ in V.str(v):gmatch("[%w_]+") do n = n + 1 end
    return n
  end,
}
FILTERS.dictsort = function(_, v, a, kw)
  if getmetatable(v) ~= DICT then fail("dictsort: expected a mapping, got %s", V.type_name(v)) end
  local case_sensitive = V.truthy(a[1] or kw.case_sensitive or false)
  local by_value = (a[2] or kw.by or "key") == "value"
  local reverse = V.truthy(a[3] or kw.reverse or false)
  local items = {}
  for i, k in ipairs(v.keys) do items[i] = V.tuple {k, v.map[k]} end
  local function key(item)
    local x = item[by_value and 2 or 1]
    if type(x) == "string" and not case_sensitive then return methods.lower(x) end
    return x
  end
  table.sort(items, function(p, q)
    if reverse then return sort_key_compare(key(q), key(p)) end
    return sort_key_compare(key(p), key(q))
  end)
  return V.list(items)
end
FILTERS.round = function(_, v, a, kw)
  local precision = a[1] or kw.precision or 0
  local method = a[2] or kw.method or "common"
  local x, m = V.tonum(v) or fail("round: expected a number"), 10 ^ precision
  local r
  if method == "ceil" then
    r = math.ceil(x * m) / m
  elseif method == "floor" then
    r = math.floor(x * m) / m
  else -- Python's round: halves to even
    local y = x * m
    local f = math.floor(y)
    local d = y - f
    if d > 0.5 or (d == 0.5 and f % 2 == 1) then f = f + 1 end
    r = f / m
  end
  if V.is_int(v) and method == "common" then return r end -- round(int) stays an int
  return V.float(r)
end
FILTERS.format = function(_, v, a)
  local i = 0
  return (V.str(v):gsub("%%([%%sdr])", function(c)
    if c == "%" then return "%" end
    i = i + 1
    local x = a[i]
    if x == nil then fail("format: not enough arguments for format string") end
    if c == "d" then return string.format("%d", V.tonum(x) or fail("format: %%d needs a number")) end
    if c == "r" then return V.repr(x) end
    return V.str(x)
  end))
end
local function extreme(pick)
  return function(_, v, _, kw)
    local best
    for _, x in ipairs(M.iterate(v)) do
      local k = x
      if type(k) == "string" and not V.truthy(kw.case_sensitive or false) then k = methods.lower(k) end
      if best == nil or pick(sort_key_compare(k, best.k)) then best = {k = k, v = x} end
    end
    return best and best.v or V.undefined("No aggregated item, sequence was empty.")
  end
end
FILTERS.min = extreme(function(less) return less end)
FILTERS.max = extreme(function(less) return not less end)
FILTERS.count = FILTERS.length
FILTERS.d = FILTERS.default
FILTERS.e = FILTERS.escape

-- select/reject/selectattr/rejectattr/map
local function test_pred(r, name, args)
  return function(x) return M.test(r, name, x, args, {}) end
end

local function select(r, v, a, by_attr, keep)
  local attribute, name, rest
  if by_attr then
    attribute, name = a[1], a[2]
    rest = {unpack(a, 3)}
  else
    name = a[1]
    rest = {unpack(a, 2)}
  end
  local out = V.list()
  for _, x in ipairs(M.iterate(v)) do
    local subject = by_attr and attr_of(r, x, attribute) or x
    local ok = name == nil and V.truthy(subject) or (name ~= nil and test_pred(r, name, rest)(subject))
    if ok == keep then out[#out + 1] = x end
  end
  return out
end

FILTERS.select = function(r, v, a) return select(r, v, a, false, true) end
FILTERS.reject = function(r, v, a) return select(r, v, a, false, false) end
FILTERS.selectattr = function(r, v, a) return select(r, v, a, true, true) end
FILTERS.rejectattr = function(r, v, a) return select(r, v, a, true, false) end
FILTERS.map = function(r, v, a, kw)
  local out = V.list()
  for i, x in ipairs(M.iterate(v)) do
    if kw.attribute ~= nil then
      local y = attr_of(r, x, kw.attribute)
      if getmetatable(y) == UNDEF and kw.default ~= nil then y = kw.default end
      out[i] = y
    else
      if type(a[1]) ~= "string" then fail("map: give a filter name or attribute=") end
      out[i] = M.filter(r, a[1], x, {unpack(a, 2)}, {})
    end
  end
  return out
end

-- Filters that need a defined value; the others read an undefined one as Jinja does (the string
-- filters as "", length as 0, iteration as empty).
local NEEDS_DEFINED = {abs = true, round = true, sum = true, dictsort = true, sort = true, unique = true, min = true,
                       max = true, tojson = true, reverse = true}

function M.filter(r, name, value, args, kwargs)
  local f = FILTERS[name]
  if not f then fail("no filter named '%s'", name) end
  if NEEDS_DEFINED[name] then V.check_defined(value) end
  return f(r, value, args, kwargs)
end

-- ---- tests ----------------------------------------------------------------------------------------

local function is_number(v) return type(v) == "number" or getmetatable(v) == V.FLOAT end

local TESTS
TESTS = {
  defined = function(v) return getmetatable(v) ~= UNDEF end,
  undefined = function(v) return getmetatable(v) == UNDEF end,
  none = function(v) return v == NONE end,
  string = function(v) return type(v) == "string" end,
  mapping = function(v) return getmetatable(v) == DICT or getmetatable(v) == V.NAMESPACE end,
  iterable = function(v)
    local mt = getmetatable(v)
    return type(v) == "string" or mt == LIST or mt == DICT or mt == UNDEF
  end,
  sequence = function(v)
    local mt = getmetatable(v)
    return type(v) == "string" or mt == LIST or mt == DICT
  end,
  number = is_number,
  integer = function(v) return V.is_int(v) end,
  float = function(v) return V.is_float(v) end,
  boolean = function(v) return type(v) == "boolean" end,
  ["true"] = function(v) return v == true end,
  ["false"] = function(v) return v == false end,
  callable = function(v) return getmetatable(v) == V.CALLABLE end,
  equalto = function(v, a) return V.equal(v, a[1]) end,
  ne = function(v, a) return not V.equal(v, a[1]) end,
  lt = function(v, a) return (V.tonum(v) or v) < (V.tonum(a[1]) or a[1]) end,
  le = function(v, a) return (V.tonum(v) or v) <= (V.tonum(a[1]) or a[1]) end,
  gt = function(v, a) return (V.tonum(v) or v) > (V.tonum(a[1]) or a[1]) end,
  ge = function(v, a) return (V.tonum(v) or v) >= (V.tonum(a[1]) or a[1]) end,
  odd = function(v) return (V.tonum(V.check_defined(v)) or fail("odd: not a number")) % 2 == 1 end,
  even = function(v) return (V.tonum(V.check_defined(v)) or fail("even: not a number")) % 2 == 0 end,
  divisibleby = function(v, a) return (V.tonum(V.check_defined(v)) or 0) % (V.tonum(a[1]) or 0) == 0 end,
  lower = function(v) return V.str(v) == methods.lower(V.str(v)) end,
  upper = function(v) return V.str(v) == methods.upper(V.str(v)) end,
  sameas = function(v, a) return rawequal(v, a[1]) end,
}
TESTS.eq, TESTS["=="], TESTS["!="] = TESTS.equalto, TESTS.equalto, TESTS.ne
TESTS.lessthan, TESTS.greaterthan = TESTS.lt, TESTS.gt

function M.test(r, name, value, args, kwargs)
  if name == "in" then return r:contains(args[1], value) end
  local t = TESTS[name]
  if not t then fail("no test named '%s'", name) end
  return t(value, args, kwargs)
end

return M
