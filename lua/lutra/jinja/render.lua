-- lutra.jinja.render — runs a parsed template over a context: the text, and the byte spans
-- its {% generation %} blocks wrote.
--
--   local text, spans = require("lutra.jinja.render").run(tree, vars, globals)
--   -- spans: {{start, stop}, ...} 0-based byte offsets into text, stop exclusive
--
-- Scopes follow Jinja: a for loop's body and a macro's body have their own variables (a set inside
-- them does not change the outside; namespace() objects are how templates carry values out);
-- if blocks share their surroundings'. Nothing here reaches Lua's globals, the filesystem or
-- code: a template sees its context, the globals it is given, and the filters, tests and
-- methods of lutra.jinja.filters and lutra.jinja.methods.
local V = require "lutra.jinja.values"
local F = require "lutra.jinja.filters"
local methods = require "lutra.jinja.methods"

local M = {}

-- Bounds that keep a hostile template from hanging or exhausting memory (real ones stay far below).
M.MAX_ITERATIONS = 1000000 -- loop iterations in one render
M.MAX_DEPTH = 100           -- macro calls inside macro calls
M.MAX_TEXT = 256 * 1024 * 1024 -- bytes of one string made by *

local fail, NONE = V.fail, V.NONE
local LIST, DICT, NAMESPACE, CALLABLE, UNDEF = V.LIST, V.DICT, V.NAMESPACE, V.CALLABLE, V.UNDEF

local R = {}
R.__index = R

local function type_repr(v)
  if v == NONE then return "'None'" end
  return "'" .. V.type_name(v) .. " object'"
end

local function missing(obj, name)
  return V.undefined(string.format("%s has no attribute %s", type_repr(obj), V.repr(name)))
end

-- obj.name, as Jinja's sandboxed getattr: an attribute (a method) first, then an item.
function R:getattr(obj, name)
  local mt = getmetatable(obj)
  if mt == UNDEF then fail("%s", obj.hint) end
  local m = methods.lookup(obj, name)
  if m then return m end
  if mt == DICT or mt == NAMESPACE then
    local v = obj.map[name]
    if v ~= nil then return v end
  end
  return missing(obj, name)
end

local function index_of(n, i)
  if not V.is_int(i) then return nil end
  if i < 0 then i = i + n end
  if i < 0 or i >= n then return nil end
  return i + 1
end

-- obj[key], as Jinja's getitem: an item first, then an attribute.
function R:getitem(obj, key)
  local mt = getmetatable(obj)
  if mt == UNDEF then fail("%s", obj.hint) end
  if mt == LIST then
    local i = index_of(#obj, key == true and 1 or key == false and 0 or key)
    if i then return obj[i] end
  elseif mt == DICT or mt == NAMESPACE then
    local v = obj.map[key]
    if v ~= nil then return v end
  elseif type(obj) == "string" and V.is_int(key) then
    local chars = V.chars(obj)
    local i = index_of(#chars, key)
    if i then return chars[i] end
  end
  if type(key) == "string" then return self:getattr(obj, key) end
  return V.undefined(string.format("%s has no element %s", type_repr(obj), V.repr(key)))
end

local function slice(obj, a, b, c)
  local mt = getmetatable(obj)
  if mt == UNDEF then fail("%s", obj.hint) end
  local items, is_str = obj, type(obj) == "string"
  if is_str then
    items = V.chars(obj)
  elseif mt ~= LIST then
    fail("%s is not subscriptable with a slice", type_repr(obj))
  end
  for _, x in ipairs {a, b, c} do
    if x ~= NONE and not V.is_int(x) then fail("slice indices must be integers or None") end
  end
  local n = #items
  local step = c == NONE and 1 or c
  if step == 0 then fail("slice step cannot be zero") end
  local function clamp(x, default)
    if x == NONE then return default end
    if x < 0 then x = x + n end
    if step > 0 then return math.max(0, math.min(x, n)) end
    return math.max(-1, math.min(x, n - 1))
  end
  local start = clamp(a, step > 0 and 0 or n - 1)
  local stop = clamp(b, step > 0 and n or -1)
  local out = {}
  local i = start
  while (step > 0 and i < stop) or (step < 0 and i > stop) do
    out[#out + 1] = items[i + 1]
    i = i + step
  end
  if is_str then return table.concat(out) end
  return V.list(out)
end

-- ---- expressions -------------------------------------------------------------------------------

local function num(v, op, other)
  local n = V.tonum(v)
  if n then return n end
  if getmetatable(v) == UNDEF then fail("%s", v.hint) end
  fail("unsupported operand type(s) for %s: '%s' and '%s'", op, V.type_name(v), V.type_name(other))
end

local function add(a, b)
  if getmetatable(a) == UNDEF then fail("%s", a.hint) end
  if getmetatable(b) == UNDEF then fail("%s", b.hint) end
  if type(a) == "string" and type(b) == "string" then return a .. b end
  if getmetatable(a) == LIST and getmetatable(b) == LIST then
    local out = V.list()
    for _, x in ipairs(a) do out[#out + 1] = x end
    for _, x in ipairs(b) do out[#out + 1] = x end
    return out
  end
  if type(a) == "string" or type(b) == "string" then
    if type(a) == "string" then fail('can only concatenate str (not "%s") to str', V.type_name(b)) end
    fail("unsupported operand type(s) for +: '%s' and 'str'", V.type_name(a))
  end
  local r = num(a, "+", b) + num(b, "+", a)
  if V.is_float(a) or V.is_float(b) then return V.float(r) end
  return r
end

local function compare(op, a, b)
  if op == "==" then return V.equal(a, b) end
  if op == "!=" then return not V.equal(a, b) end
  local ta, tb = type(a), type(b)
  if not ((ta == "string" and tb == "string") or (V.tonum(a) and V.tonum(b))) then
    if getmetatable(a) == UNDEF then fail("%s", a.hint) end
    if getmetatable(b) == UNDEF then fail("%s", b.hint) end
    fail("'%s' not supported between instances of '%s' and '%s'", op, V.type_name(a), V.type_name(b))
  end
  if ta ~= "string" then a, b = num(a, op, b), num(b, op, a) end
  if op == "<" then return a < b end
  if op == ">" then return a > b end
  if op == "<=" then return a <= b end
  return a >= b
end

local function binary(op, a, b)
  if op == "+" then return add(a, b) end
  if op == "~" then return V.str(a) .. V.str(b) end
  if op == "==" or op == "!=" or op == "<" or op == ">" or op == "<=" or op == ">=" then return compare(op, a, b) end
  if op == "*" and (type(a) == "string" or type(b) == "string") then
    local str, n = a, b
    if type(b) == "string" then str, n = b, a end
    if not V.is_int(n) then fail("can't multiply sequence by non-int of type '%s'", V.type_name(n)) end
    if #str * math.max(0, n) > M.MAX_TEXT then fail("a string of more than %d bytes", M.MAX_TEXT) end
    return string.rep(str, math.max(0, n))
  end
  local x, y = num(a, op, b), num(b, op, a)
  local r
  if op == "-" then
    r = x - y
  elseif op == "*" then
    r = x * y
  elseif op == "**" then
    r = x ^ y
  else
    if y == 0 then fail("division by zero") end
    if op == "/" then
      r = x / y
    elseif op == "//" then
      r = math.floor(x / y)
    else
      r = x - math.floor(x / y) * y -- %: the sign of the divisor, as Python's
    end
  end
  if op == "/" or V.is_float(a) or V.is_float(b) or (op == "**" and y < 0) then return V.float(r) end
  return r
end

function R:contains(container, item)
  local mt = getmetatable(container)
  if type(container) == "string" then
    if type(item) ~= "string" then fail("'in <string>' requires string as left operand, not %s", V.type_name(item)) end
    return container:find(item, 1, true) ~= nil
  elseif mt == LIST then
    for _, x in ipairs(container) do
      if V.equal(x, item) then return true end
    end
    return false
  elseif mt == DICT or mt == NAMESPACE then
    return container.map[item] ~= nil
  elseif mt == UNDEF then
    return false
  end
  fail("argument of type '%s' is not iterable", V.type_name(container))
end

function R:call(fn, args, kwargs)
  local mt = getmetatable(fn)
  if mt == UNDEF then fail("%s", fn.hint) end
  if mt ~= CALLABLE then fail("'%s' object is not callable", V.type_name(fn)) end
  return fn.fn(args, kwargs, self)
end

-- The arguments of a call: positional ones, and keyword ones (their order in KWARG_ORDER, as
-- Python keeps it: namespace(b=1, a=2) and dict(...) list their keys in that order).
local KWARG_ORDER = setmetatable({}, {__mode = "k"})
M.kwarg_order = function(kwargs) return KWARG_ORDER[kwargs] end

function R:eval_args(e)
  local args, kwargs, order = {}, {}, {}
  for i, a in ipairs(e.args) do args[i] = self:eval(a) end
  for i, kw in ipairs(e.kwargs) do
    kwargs[kw.name] = self:eval(kw.value)
    order[i] = kw.name
  end
  KWARG_ORDER[kwargs] = order
  return args, kwargs
end

function R:eval(e)
  self.line = e.line or self.line
  local t = e.type
  if t == "const" then return e.value end
  if t == "name" then return self:lookup(e.name) end
  if t == "attr" then return self:getattr(self:eval(e.obj), e.name) end
  if t == "item" then return self:getitem(self:eval(e.obj), self:eval(e.key)) end
  if t == "slice" then
    local function opt(x) return x and self:eval(x) or NONE end
    return slice(self:eval(e.obj), opt(e.start), opt(e.stop), opt(e.step))
  end
  if t == "bin" then
    local a = self:eval(e.a)
    local b = self:eval(e.b)
    self.line = e.line
    return binary(e.op, a, b)
  end
  if t == "and" then
    local a = self:eval(e.a)
    if not V.truthy(a) then return a end
    return self:eval(e.b)
  end
  if t == "or" then
    local a = self:eval(e.a)
    if V.truthy(a) then return a end
    return self:eval(e.b)
  end
  if t == "not" then return not V.truthy(self:eval(e.a)) end
  if t == "neg" then
    local a = self:eval(e.a)
    if getmetatable(a) == V.FLOAT then return V.float(-a.v) end
    return -num(a, "unary -", a)
  end
  if t == "in" then
    local a = self:eval(e.a)
    return self:contains(self:eval(e.b), a)
  end
  if t == "cond" then
    if V.truthy(self:eval(e.test)) then return self:eval(e.yes) end
    if e.no then return self:eval(e.no) end
    return V.undefined("the conditional expression had no else branch")
  end
  if t == "list" then
    local out = e.tuple and V.tuple() or V.list()
    for i, x in ipairs(e.items) do out[i] = self:eval(x) end
    return out
  end
  if t == "dict" then
    local d = V.dict()
    for i, k in ipairs(e.keys) do V.dict_set(d, self:eval(k), self:eval(e.vals[i])) end
    return d
  end
  if t == "call" then
    local fn = self:eval(e.fn)
    local args, kwargs = self:eval_args(e)
    self.line = e.line
    return self:call(fn, args, kwargs)
  end
  if t == "filter" then
    local value = self:eval(e.a)
    local args, kwargs = self:eval_args(e)
    self.line = e.line
    return F.filter(self, e.name, value, args, kwargs)
  end
  if t == "test" then
    local value
    if e.a.type == "name" then
      value = self:lookup(e.a.name)
    else
      value = self:eval(e.a)
    end
    local args, kwargs = self:eval_args(e)
    self.line = e.line
    return F.test(self, e.name, value, args, kwargs)
  end
  fail("cannot evaluate a %s", t)
end

-- ---- scopes ---------------------------------------------------------------------------------

function R:lookup(name)
  local frames = self.frames
  for i = #frames, 1, -1 do
    local v = frames[i][name]
    if v ~= nil then return v end
  end
  local g = self.globals[name]
  if g ~= nil then return g end
  return V.undefined(string.format("'%s' is undefined", name))
end

function R:assign(target, value)
  local frame = self.frames[#self.frames]
  if target.type == "attr_target" then
    local ns = self:lookup(target.name)
    if getmetatable(ns) ~= NAMESPACE then fail("cannot assign attribute on non-namespace object") end
    if target.attr:sub(1, 1) == "_" then
      fail("chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'", target.attr)
    end
    V.dict_set(ns, target.attr, value)
    return
  end
  local names = target.names
  if #names == 1 then
    frame[names[1]] = value
    return
  end
  local items = F.iterate(value)
  if #items ~= #names then
    fail("cannot unpack %d values into %d names", #items, #names)
  end
  for i, n in ipairs(names) do frame[n] = items[i] end
end

-- ---- statements -------------------------------------------------------------------------------

function R:write(s)
  if s ~= "" then
    local out = self.out
    out[#out + 1] = s
    out.len = out.len + #s
  end
end

-- Runs body writing into a fresh buffer; returns its text.
function R:capture(body)
  local saved = self.out
  self.out = {len = 0}
  self.capturing = (self.capturing or 0) + 1
  local ok, err = pcall(self.exec_body, self, body)
  self.capturing = self.capturing - 1
  local text = table.concat(self.out)
  self.out = saved
  if not ok then error(err, 0) end
  return text
end

function R:exec_body(body)
  for _, s in ipairs(body) do
    local signal = self:exec(s)
    if signal then return signal end
  end
end

function R:loop_object(items, i, cycle)
  local n = #items
  local d = V.dict()
  V.dict_set(d, "index", i)
  V.dict_set(d, "index0", i - 1)
  V.dict_set(d, "revindex", n - i + 1)
  V.dict_set(d, "revindex0", n - i)
  V.dict_set(d, "first", i == 1)
  V.dict_set(d, "last", i == n)
  V.dict_set(d, "length", n)
  V.dict_set(d, "depth", 1)
  V.dict_set(d, "depth0", 0)
  V.dict_set(d, "previtem", i > 1 and items[i - 1] or V.undefined("there is no previous item"))
  V.dict_set(d, "nextitem", i < n and items[i + 1] or V.undefined("there is no next item"))
  V.dict_set(d, "cycle", cycle)
  return d
end

function R:exec_for(s)
  local source = F.iterate(self:eval(s.iter))
  local frames = self.frames
  frames[#frames + 1] = {}
  local items = source
  if s.filter then
    items = {}
    for _, x in ipairs(source) do
      self:assign(s.target, x)
      if V.truthy(self:eval(s.filter)) then items[#items + 1] = x end
    end
  end
  local index = 0
  local cycle = V.callable("loop.cycle", function(args)
    if #args == 0 then fail("no items for cycling given") end
    return args[(index - 1) % #args + 1]
  end)
  local ok, err = pcall(function()
    for i, x in ipairs(items) do
      index = i
      self.iterations = self.iterations + 1
      if self.iterations > M.MAX_ITERATIONS then
        fail("the template ran more than %d loop iterations", M.MAX_ITERATIONS)
      end
      self:assign(s.target, x)
      frames[#frames].loop = self:loop_object(items, i, cycle)
      if self:exec_body(s.body) == "break" then break end
    end
    if #items == 0 and s.else_body then self:exec_body(s.else_body) end
  end)
  frames[#frames] = nil
  if not ok then error(err, 0) end
end

function R:macro(s)
  return V.callable(s.name, function(args, kwargs, r)
    local frame = {}
    for i, p in ipairs(s.params) do
      local v = args[i]
      if v == nil then v = kwargs[p.name] end
      if v == nil and p.default then v = r:eval(p.default) end
      if v == nil then v = V.undefined(string.format("parameter '%s' was not provided", p.name)) end
      frame[p.name] = v
    end
    local extra = V.list()
    for i = #s.params + 1, #args do extra[#extra + 1] = args[i] end
    frame.varargs = extra
    frame.caller = kwargs.caller or V.undefined("'caller' is undefined")
    if r.depth >= M.MAX_DEPTH then fail("macro calls nested deeper than %d", M.MAX_DEPTH) end
    r.frames[#r.frames + 1] = frame
    r.depth = r.depth + 1
    local ok, text = pcall(r.capture, r, s.body)
    r.depth = r.depth - 1
    r.frames[#r.frames] = nil
    if not ok then error(text, 0) end
    return text
  end)
end

function R:exec(s)
  self.line = s.line or self.line
  local t = s.type
  if t == "text" then
    self:write(s.text)
  elseif t == "output" then
    self:write(V.str(self:eval(s.expr)))
  elseif t == "if" then
    for _, b in ipairs(s.branches) do
      if b.cond == nil or V.truthy(self:eval(b.cond)) then return self:exec_body(b.body) end
    end
  elseif t == "for" then
    self:exec_for(s)
  elseif t == "set" then
    self:assign(s.target, self:eval(s.value))
  elseif t == "set_block" then
    local v = self:capture(s.body)
    for _, f in ipairs(s.filters) do v = F.filter(self, f, v, {}, {}) end
    self:assign(s.target, v)
  elseif t == "macro" then
    self.frames[#self.frames][s.name] = self:macro(s)
  elseif t == "call_block" then
    local fn = self:eval(s.call.fn)
    local args, kwargs = self:eval_args(s.call)
    kwargs.caller = V.callable("caller", function(_, _, r) return r:capture(s.body) end)
    self:write(V.str(self:call(fn, args, kwargs)))
  elseif t == "generation" then
    if (self.capturing or 0) > 0 then fail("{% generation %} inside a macro or a set block is not supported") end
    local start = self.out.len
    local signal = self:exec_body(s.body)
    self.spans[#self.spans + 1] = {start, self.out.len}
    return signal
  elseif t == "break" or t == "continue" then
    return t
  else
    fail("cannot run a %s statement", t)
  end
end

-- Renders tree with vars (a table of template values) and globals; returns text, spans.
-- An error is thrown as {jinja = message, line = N}.
function M.run(tree, vars, globals)
  local self = setmetatable({frames = {vars}, globals = globals, out = {len = 0}, spans = {}, line = 1, iterations = 0,
                             depth = 0}, R)
  local ok, err = pcall(self.exec_body, self, tree.body)
  if not ok then
    if type(err) == "table" and err.jinja and not err.line then err.line = self.line end
    error(err, 0)
  end
  return table.concat(self.out), self.spans
end

return M
