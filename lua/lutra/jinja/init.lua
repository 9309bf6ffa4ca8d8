-- lutra.jinja — the Jinja that Hugging Face chat templates are written in, interpreted in Lua
-- (no code is generated or loaded: a template can only compute with the values it is given).
--
--   local jinja = require "lutra.jinja"
--   local t = jinja.compile(text, {name = "chat template (tokenizer_config.json)"})
--   local text, spans = t:render({messages = msgs, add_generation_prompt = true, bos_token = "<s>"})
--   -- spans: the byte ranges {start, stop} (0-based, stop exclusive) of {% generation %} blocks
--
-- The semantics are those transformers renders chat templates with: Jinja 3.1's sandboxed
-- environment, trim_blocks and lstrip_blocks on, the loopcontrols extension (break, continue),
-- the {% generation %} extension, and the globals raise_exception(msg), strftime_now(fmt),
-- namespace(...), dict(...) and range(...). The pieces: lexer (whitespace rules and tokens),
-- parser (the tree), render (scopes and statements), filters (filters and tests), methods (str,
-- dict and list methods), values (Python's values in Lua). Errors name the template and line:
--   chat template (tokenizer_config.json) line 3: no filter named 'wordwrap'
--   chat template (tokenizer_config.json) line 12: raise_exception: Conversation roles must alternate ...
-- Limits: a number from the data (JSON decoded by lutra.json) is a Python int when integral, so a
-- 1.0 in a conversation prints "1" where Python prints "1.0" (the template's own floats, 3 / 2 or
-- 1.0, print as Python's); a construct outside the subset (extends, include, import, filter
-- blocks, recursive loops, ...) is refused by name.
local V = require "lutra.jinja.values"
local parser = require "lutra.jinja.parser"
local render = require "lutra.jinja.render"

local M = {}

M.values = V

local Template = {}
Template.__index = Template

local function message(name, err)
  if type(err) == "table" and err.jinja then
    return string.format("%s line %d: %s", name, err.line or 1, err.jinja)
  end
  return string.format("%s: %s", name, tostring(err))
end

local function kwarg_dict(args, kwargs)
  local d = V.dict()
  for _, a in ipairs(args) do
    if V.is_dict(a) then
      for _, k in ipairs(a.keys) do V.dict_set(d, k, a.map[k]) end
    elseif getmetatable(a) == V.NAMESPACE then
      for _, k in ipairs(a.keys) do V.dict_set(d, k, a.map[k]) end
    else
      V.fail("expected a mapping, got %s", V.type_name(a))
    end
  end
  for _, k in ipairs(render.kwarg_order(kwargs) or {}) do V.dict_set(d, k, kwargs[k]) end
  return d
end

-- The globals transformers gives chat templates.
local function globals(opts)
  local g = {}
  g.raise_exception = V.callable("raise_exception", function(args)
    error({jinja = "raise_exception: " .. V.str(args[1] == nil and "" or args[1]), raised = true}, 0)
  end)
  g.strftime_now = V.callable("strftime_now", function(args)
    local fmt = args[1]
    if type(fmt) ~= "string" then V.fail("strftime_now expects a format string") end
    if fmt:find("^!?%*") then V.fail("strftime_now: %s is not a strftime format", V.repr(fmt)) end
    return os.date(fmt, opts.now)
  end)
  g.namespace = V.callable("namespace", function(args, kwargs)
    local d = kwarg_dict(args, kwargs)
    local ns = V.namespace()
    for _, k in ipairs(d.keys) do
      if type(k) == "string" and k:sub(1, 1) == "_" then
        V.fail("chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'", k)
      end
      V.dict_set(ns, k, d.map[k])
    end
    return ns
  end)
  g.dict = V.callable("dict", function(args, kwargs) return kwarg_dict(args, kwargs) end)
  g.range = V.callable("range", function(args)
    local a, b, c = args[1], args[2], args[3] or 1
    if b == nil then a, b = 0, a end
    for _, x in ipairs {a, b, c} do
      if not V.is_int(x) then V.fail("range expects integers") end
    end
    if c == 0 then V.fail("range() arg 3 must not be zero") end
    local out = V.list()
    local i = a
    while (c > 0 and i < b) or (c < 0 and i > b) do
      out[#out + 1] = i
      i = i + c
      if #out > 100000 then V.fail("range: more than 100000 items") end
    end
    return out
  end)
  return g
end

-- compile(text, {name =}) -> a template; a syntax error names the line.
function M.compile(text, opts)
  opts = opts or {}
  local name = opts.name or "template"
  if type(text) ~= "string" then error(name .. ": the template must be a string, got " .. type(text), 0) end
  local ok, tree = pcall(parser.parse, text)
  if not ok then error(message(name, tree), 0) end
  return setmetatable({tree = tree, name = name, text = text,
                       has_generation = text:find("{%%%-?%s*generation%s*%-?%%}") ~= nil}, Template)
end

-- t:render(vars [, {now = os.time() value for strftime_now}]) -> text, generation spans.
-- vars are Lua values (strings, numbers, booleans, json.null, lists, tables); see values.from_lua.
function Template:render(vars, opts)
  opts = opts or {}
  local ok, text, spans = pcall(function()
    local frame = {}
    for k, v in pairs(vars) do frame[k] = V.from_lua(v) end
    return render.run(self.tree, frame, globals(opts))
  end)
  if not ok then error(message(self.name, text), 0) end
  return text, spans
end

return M
