-- lutra.jinja.parser — the lexer's parts -> a tree of statements and expressions.
--
--   local tree = require("lutra.jinja.parser").parse(source)   -- {type = "body", ...}
--
-- Statements: if/elif/else, for (a loop filter `if`, else, loop.*, break/continue), set (a name,
-- names, ns.attr, or a {% set %}...{% endset %} block), macro and call, generation (transformers'
-- assistant-mask extension), raw. Expressions follow Jinja's precedence: conditional, or, and,
-- not, comparisons and in, + -, ~, * / // %, **, unary - +, then postfix (.attr, [index], [a:b:c],
-- calls), filters (|f(args)) and tests (is [not] t args). Anything else (extends, include,
-- import, filter blocks, with, autoescape, ...) is an error naming the line: those templates
-- are not chat templates lutra can run.
local lexer = require "lutra.jinja.lexer"
local V = require "lutra.jinja.values"

local M = {}

local function fail(line, msg, ...) error({jinja = string.format(msg, ...), line = line}, 0) end

-- ---- expressions ------------------------------------------------------------------------------

local P = {}
P.__index = P

local function stream(part)
  return setmetatable({toks = lexer.tokens(part), i = 1, line = part.line}, P)
end

function P:peek(k) return self.toks[self.i + (k or 0)] end
function P:next()
  local t = self.toks[self.i]
  self.i = self.i + 1
  return t
end
function P:is(type_, value, k)
  local t = self.toks[self.i + (k or 0)]
  return t ~= nil and t.type == type_ and (value == nil or t.value == value)
end
function P:accept(type_, value)
  if self:is(type_, value) then return self:next() end
  return nil
end
function P:expect(type_, value)
  local t = self:next()
  if not t or t.type ~= type_ or (value ~= nil and t.value ~= value) then
    fail(self.line, "expected %s, got %s", value and ("'" .. value .. "'") or type_,
      t and ("'" .. tostring(t.value) .. "'") or "the end of the tag")
  end
  return t
end
function P:done()
  if self.i <= #self.toks then fail(self.line, "unexpected '%s'", tostring(self.toks[self.i].value)) end
end
function P:node(t) t.line = self.line return t end

local COMPARE = {["=="] = true, ["!="] = true, ["<"] = true, [">"] = true, ["<="] = true, [">="] = true}

function P:expr(no_cond)
  local e = self:or_()
  if not no_cond and self:accept("name", "if") then
    local cond = self:or_()
    local other
    if self:accept("name", "else") then other = self:expr() end
    e = self:node {type = "cond", test = cond, yes = e, no = other}
  end
  return e
end

function P:or_()
  local e = self:and_()
  while self:accept("name", "or") do e = self:node {type = "or", a = e, b = self:and_()} end
  return e
end

function P:and_()
  local e = self:not_()
  while self:accept("name", "and") do e = self:node {type = "and", a = e, b = self:not_()} end
  return e
end

function P:not_()
  if self:accept("name", "not") then return self:node {type = "not", a = self:not_()} end
  return self:compare()
end

function P:compare()
  local e = self:math1()
  while true do
    local t = self:peek()
    if t and t.type == "op" and COMPARE[t.value] then
      self:next()
      e = self:node {type = "bin", op = t.value, a = e, b = self:math1()}
    elseif self:is("name", "in") then
      self:next()
      e = self:node {type = "in", a = e, b = self:math1()}
    elseif self:is("name", "not") and self:is("name", "in", 1) then
      self.i = self.i + 2
      e = self:node {type = "not", a = self:node {type = "in", a = e, b = self:math1()}}
    else
      return e
    end
  end
end

function P:math1()
  local e = self:concat()
  while self:is("op", "+") or self:is("op", "-") do
    e = self:node {type = "bin", op = self:next().value, a = e, b = self:concat()}
  end
  return e
end

function P:concat()
  local e = self:math2()
  while self:accept("op", "~") do e = self:node {type = "bin", op = "~", a = e, b = self:math2()} end
  return e
end

function P:math2()
  local e = self:pow()
  while self:is("op", "*") or self:is("op", "/") or self:is("op", "//") or self:is("op", "%") do
    e = self:node {type = "bin", op = self:next().value, a = e, b = self:pow()}
  end
  return e
end

function P:pow()
  local e = self:unary(true)
  while self:accept("op", "**") do e = self:node {type = "bin", op = "**", a = e, b = self:unary(true)} end
  return e
end

function P:unary(with_filter)
  local e
  if self:accept("op", "-") then
    e = self:node {type = "neg", a = self:unary(false)}
  elseif self:accept("op", "+") then
    e = self:unary(false)
  else
    e = self:postfix(self:primary())
  end
  if with_filter then e = self:filters(e) end
  return e
end

function P:primary()
  local t = self:next()
  if not t then fail(self.line, "expected an expression, got the end of the tag") end
  if t.type == "string" then
    local s = t.value
    while self:is("string") do s = s .. self:next().value end -- adjacent literals join
    return self:node {type = "const", value = s}
  elseif t.type == "number" then
    return self:node {type = "const", value = t.float and V.float(t.value) or t.value}
  elseif t.type == "name" then
    local v = t.value
    if v == "true" or v == "True" then return self:node {type = "const", value = true} end
    if v == "false" or v == "False" then return self:node {type = "const", value = false} end
    if v == "none" or v == "None" then return self:node {type = "const", value = V.NONE} end
    return self:node {type = "name", name = v}
  elseif t.type == "op" and t.value == "(" then
    local e = self:tuple_or_expr(")")
    self:expect("op", ")")
    return e
  elseif t.type == "op" and t.value == "[" then
    local items = {}
    while not self:is("op", "]") do
      if #items > 0 then self:expect("op", ",") end
      if self:is("op", "]") then break end
      items[#items + 1] = self:expr()
    end
    self:expect("op", "]")
    return self:node {type = "list", items = items}
  elseif t.type == "op" and t.value == "{" then
    local keys, vals = {}, {}
    while not self:is("op", "}") do
      if #keys > 0 then self:expect("op", ",") end
      if self:is("op", "}") then break end
      keys[#keys + 1] = self:expr()
      self:expect("op", ":")
      vals[#vals + 1] = self:expr()
    end
    self:expect("op", "}")
    return self:node {type = "dict", keys = keys, vals = vals}
  end
  fail(self.line, "unexpected '%s'", tostring(t.value))
end

-- (a) is a, (a, b) a tuple (a list here: templates only iterate or index them).
function P:tuple_or_expr(closer)
  if closer and self:is("op", closer) then return self:node {type = "list", items = {}, tuple = true} end
  local first = self:expr()
  if not self:is("op", ",") then return first end
  local items = {first}
  while self:accept("op", ",") do
    if closer and self:is("op", closer) then break end
    items[#items + 1] = self:expr()
  end
  return self:node {type = "list", items = items, tuple = true}
end

function P:args()
  local args, kwargs = {}, {}
  self:expect("op", "(")
  while not self:is("op", ")") do
    if #args > 0 or next(kwargs) then self:expect("op", ",") end
    if self:is("op", ")") then break end
    if self:is("name") and self:is("op", "=", 1) then
      local k = self:next().value
      self:next()
      kwargs[#kwargs + 1] = {name = k, value = self:expr()}
    else
      if #kwargs > 0 then fail(self.line, "a positional argument after a keyword argument") end
      args[#args + 1] = self:expr()
    end
  end
  self:expect("op", ")")
  return args, kwargs
end

function P:slice_part()
  if self:is("op", ":") or self:is("op", "]") then return nil end
  return self:expr()
end

function P:postfix(e)
  while true do
    if self:accept("op", ".") then
      local t = self:next()
      if not t or (t.type ~= "name" and t.type ~= "number") then fail(self.line, "expected a name after '.'") end
      e = self:node {type = "attr", obj = e, name = t.type == "number" and t.value + 1 - 1 or t.value}
    elseif self:accept("op", "[") then
      local a = self:slice_part()
      if self:accept("op", ":") then
        local b = self:slice_part()
        local c
        if self:accept("op", ":") then c = self:slice_part() end
        e = self:node {type = "slice", obj = e, start = a, stop = b, step = c}
      else
        if not a then fail(self.line, "expected an index inside []") end
        e = self:node {type = "item", obj = e, key = a}
      end
      self:expect("op", "]")
    elseif self:is("op", "(") then
      local args, kwargs = self:args()
      e = self:node {type = "call", fn = e, args = args, kwargs = kwargs}
    else
      return e
    end
  end
end

local TEST_ARG_STARTS = {name = true, string = true, number = true}

function P:filters(e)
  while true do
    if self:accept("op", "|") then
      local name = self:expect("name").value
      while self:is("op", ".") and self:is("name", nil, 1) do -- dotted filter names
        self:next()
        name = name .. "." .. self:next().value
      end
      local args, kwargs = {}, {}
      if self:is("op", "(") then args, kwargs = self:args() end
      e = self:node {type = "filter", name = name, a = e, args = args, kwargs = kwargs}
    elseif self:accept("name", "is") then
      local negate = self:accept("name", "not") ~= nil
      local name = self:expect("name").value
      local args, kwargs = {}, {}
      local t = self:peek()
      if self:is("op", "(") then
        args, kwargs = self:args()
      elseif t and (TEST_ARG_STARTS[t.type] or (t.type == "op" and (t.value == "[" or t.value == "{")))
        and not (t.type == "name" and (t.value == "else" or t.value == "or" or t.value == "and"
          or t.value == "if" or t.value == "is" or t.value == "in" or t.value == "not")) then
        args = {self:postfix(self:primary())}
      end
      e = self:node {type = "test", name = name, a = e, args = args, kwargs = kwargs}
      if negate then e = self:node {type = "not", a = e} end
    else
      return e
    end
  end
end

-- An assignment target: a name, names (a, b) or ns.attr.
function P:target()
  local first = self:expect("name").value
  if self:accept("op", ".") then
    return {type = "attr_target", name = first, attr = self:expect("name").value}
  end
  local names = {first}
  while self:accept("op", ",") do names[#names + 1] = self:expect("name").value end
  return {type = "names", names = names}
end

-- ---- statements ------------------------------------------------------------------------------

local UNSUPPORTED = {extends = true, include = true, import = true, from = true, block = true, filter = true,
                     with = true, autoescape = true, trans = true, ["do"] = true}

local Parser = {}
Parser.__index = Parser

-- Parses statements until a block whose keyword is in ends; returns body, that keyword, its stream.
function Parser:body(ends, opener)
  local body = {}
  while true do
    local part = self.parts[self.i]
    if not part then
      if ends then
        fail(opener.line, "'%s' is not closed (expected {%% %s %%} before the end of the template)", opener.word,
          ends[1])
      end
      return body
    end
    self.i = self.i + 1
    if part.kind == "text" then
      body[#body + 1] = {type = "text", text = part.text, line = part.line}
    elseif part.kind == "var" then
      local p = stream(part)
      local e = p:expr()
      p:done()
      body[#body + 1] = {type = "output", expr = e, line = part.line}
    else
      local p = stream(part)
      local word = p:expect("name").value
      if ends and ends[word] then return body, word, p end
      body[#body + 1] = self:statement(word, p, part)
    end
  end
end

local function set_of(...)
  local s = {...}
  for _, w in ipairs({...}) do s[w] = true end
  return s
end

function Parser:statement(word, p, part)
  local line = part.line
  if word:match("^end") or word == "elif" or word == "else" then fail(line, "unexpected {%% %s %%}", word) end
  local opener = {word = word, line = line}
  if word == "if" then
    local node = {type = "if", line = line, branches = {}}
    local cond = p:expr()
    p:done()
    while true do
      local body, ending, q = self:body(set_of("endif", "elif", "else"), opener)
      node.branches[#node.branches + 1] = {cond = cond, body = body}
      if ending == "endif" then
        q:done()
        return node
      elseif ending == "elif" then
        cond = q:expr()
        q:done()
      else
        q:done()
        local rest, last, r = self:body(set_of("endif"), opener)
        r:done()
        node.branches[#node.branches + 1] = {body = rest}
        assert(last == "endif")
        return node
      end
    end
  elseif word == "for" then
    local target = p:target()
    p:expect("name", "in")
    local iter = p:expr(true)
    local filter
    if p:accept("name", "if") then filter = p:expr(true) end
    if p:accept("name", "recursive") then fail(line, "recursive for loops are not supported") end
    p:done()
    local body, ending, q = self:body(set_of("endfor", "else"), opener)
    q:done()
    local else_body
    if ending == "else" then
      local _, r
      else_body, _, r = self:body(set_of("endfor"), opener)
      r:done()
    end
    return {type = "for", line = line, target = target, iter = iter, filter = filter, body = body, else_body = else_body}
  elseif word == "set" then
    local target = p:target()
    if p:accept("op", "=") then
      local value = p:tuple_or_expr()
      p:done()
      return {type = "set", line = line, target = target, value = value}
    end
    local filters = {}
    while p:accept("op", "|") do filters[#filters + 1] = p:expect("name").value end
    p:done()
    local body, _, q = self:body(set_of("endset"), opener)
    q:done()
    return {type = "set_block", line = line, target = target, body = body, filters = filters}
  elseif word == "macro" then
    local name = p:expect("name").value
    p:expect("op", "(")
    local params = {}
    while not p:is("op", ")") do
      if #params > 0 then p:expect("op", ",") end
      local pname = p:expect("name").value
      local default
      if p:accept("op", "=") then default = p:expr() end
      params[#params + 1] = {name = pname, default = default}
    end
    p:expect("op", ")")
    p:done()
    local body, _, q = self:body(set_of("endmacro"), opener)
    q:done()
    return {type = "macro", line = line, name = name, params = params, body = body}
  elseif word == "call" then
    local call = p:expr()
    p:done()
    if call.type ~= "call" then fail(line, "{% call %} needs a macro call") end
    local body, _, q = self:body(set_of("endcall"), opener)
    q:done()
    return {type = "call_block", line = line, call = call, body = body}
  elseif word == "generation" then
    p:done()
    local body, _, q = self:body(set_of("endgeneration"), opener)
    q:done()
    return {type = "generation", line = line, body = body}
  elseif word == "break" or word == "continue" then
    p:done()
    return {type = word, line = line}
  elseif word == "raw" then
    fail(line, "{%% raw %%} is not supported")
  elseif UNSUPPORTED[word] then
    fail(line, "{%% %s %%} is not supported in chat templates (lutra's Jinja runs templates on their own: "
      .. "no other files, no extensions beyond {%% generation %%})", word)
  end
  fail(line, "unknown tag '%s'", word)
end

function M.parse(source)
  local self = setmetatable({parts = lexer.split(source), i = 1}, Parser)
  local body, ending, p = self:body(nil)
  if ending then fail(p.line, "unexpected '%s'", ending) end
  return {type = "body", body = body}
end

return M
