-- lutra.jinja.lexer — a template's text -> tokens, with the whitespace rules transformers
-- renders chat templates under (trim_blocks and lstrip_blocks on, keep_trailing_newline off).
--
--   local lexer = require "lutra.jinja.lexer"
--   local parts = lexer.split(source)   -- {kind = "text"|"var"|"block", text =, line =}
--   local toks = lexer.tokens(part)     -- the expression tokens of a var or block part
--
-- Whitespace, as Jinja 3.1's lexer does it: "\r\n" and "\r" read as "\n"; one newline at the
-- end of the template is dropped; {%- / {{- / {#- strip all whitespace before the tag, -%} / -}}
-- / -#} all after it; trim_blocks drops the newline right after a block or comment tag;
-- lstrip_blocks drops the spaces and tabs between the start of a line and a block or comment
-- tag ({%+ keeps them). Comments vanish.
local M = {}

local function fail(msg, line, ...) error({jinja = string.format(msg, ...), line = line}, 0) end

local function count_lines(s, i, j)
  local n = 0
  for _ in s:sub(i, j):gmatch("\n") do n = n + 1 end
  return n
end

-- The parts of source: text, var ({{ }}) and block ({% %}) parts with their inner text and line.
function M.split(source)
  source = source:gsub("\r\n", "\n"):gsub("\r", "\n")
  if source:sub(-1) == "\n" then source = source:sub(1, -2) end
  local parts = {}
  local pos, line = 1, 1
  local strip_next = false -- the previous tag ended with "-"
  local line_starting = true
  local n = #source
  while pos <= n do
    local s, _, opener = source:find("{([{%%#])", pos)
    local text = source:sub(pos, (s or n + 1) - 1)
    if strip_next then text = text:gsub("^%s+", "") end
    strip_next = false
    if not s then
      if text ~= "" then parts[#parts + 1] = {kind = "text", text = text, line = line} end
      break
    end
    local sign = source:sub(s + 2, s + 2)
    if sign == "-" then
      text = text:gsub("%s+$", "")
    elseif sign ~= "+" and opener ~= "{" then -- lstrip_blocks
      local last_nl = text:match(".*()\n")
      local l_pos = last_nl and last_nl + 1 or 1
      if (last_nl or line_starting) and text:sub(l_pos):match("^[ \t\f\v]*$") then text = text:sub(1, l_pos - 1) end
    end
    if text ~= "" then parts[#parts + 1] = {kind = "text", text = text, line = line} end
    line = line + count_lines(source, pos, s - 1)
    local body_start = s + 2 + ((sign == "-" or sign == "+") and 1 or 0)
    local closer = opener == "{" and "}}" or (opener == "%" and "%}" or "#}")
    local e
    if opener == "#" then
      e = source:find("#}", body_start, true)
    else
      -- the closer outside string literals
      local i = body_start
      while i <= n do
        local c = source:sub(i, i)
        if c == "'" or c == '"' then
          local close = i + 1
          while close <= n and source:sub(close, close) ~= c do
            close = close + (source:sub(close, close) == "\\" and 2 or 1)
          end
          i = close + 1
        elseif source:sub(i, i + 1) == closer or (source:sub(i, i) == "-" and source:sub(i + 1, i + 2) == closer) then
          e = i
          break
        else
          i = i + 1
        end
      end
    end
    if not e then
      fail("unexpected end of template: a %s was not closed with %s", line,
        opener == "{" and "{{" or ("{" .. opener), closer)
    end
    local inner_end = e - 1
    local after = e + 2
    if source:sub(e, e) == "-" and opener ~= "#" then
      strip_next, after = true, e + 3
    elseif opener == "#" and source:sub(e - 1, e - 1) == "-" then
      strip_next = true
    end
    if source:sub(e, e + 1) == closer and source:sub(e - 1, e - 1) == "-" and opener == "#" then
      inner_end = e - 2
    end
    if opener ~= "#" then
      parts[#parts + 1] = {kind = opener == "{" and "var" or "block", text = source:sub(body_start, inner_end), line = line}
    end
    line = line + count_lines(source, s, after - 1)
    if opener ~= "{" and not strip_next and source:sub(after, after) == "\n" then -- trim_blocks
      after = after + 1
      line = line + 1
    end
    line_starting = source:sub(after - 1, after - 1) == "\n"
    pos = after
  end
  return parts
end

-- ---- expression tokens ---------------------------------------------------------------------

local OPERATORS = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=", "(", ")", "[",
                   "]", "{", "}", ",", ".", ":", "|"}

local ESCAPES = {n = "\n", t = "\t", r = "\r", ["\\"] = "\\", ["'"] = "'", ['"'] = '"', a = "\a", b = "\b",
                 f = "\f", v = "\v", ["0"] = "\0", ["\n"] = ""}

local function utf8_char(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then
    return string.char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
  end
  return string.char(0xF0 + math.floor(cp / 262144), 0x80 + math.floor(cp / 4096) % 64,
    0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
end

-- A string literal's body with Python's escapes (\n, \t, \\, \', \", \xHH, \uHHHH, \UHHHHHHHH);
-- an unknown escape keeps its backslash, as Python's does.
local function unescape(body)
  return (body:gsub("\\(.)(%x?%x?%x?%x?%x?%x?%x?%x?)", function(c, hex)
    if ESCAPES[c] then return ESCAPES[c] .. hex end
    local want = c == "x" and 2 or c == "u" and 4 or c == "U" and 8 or nil
    if want and #hex >= want then
      return utf8_char(tonumber(hex:sub(1, want), 16)) .. hex:sub(want + 1)
    end
    return "\\" .. c .. hex
  end))
end

-- The tokens of an expression text: {type = "name"|"string"|"number"|"op", value =}.
function M.tokens(part)
  local s, toks, i, n = part.text, {}, 1, #part.text
  while i <= n do
    local c = s:sub(i, i)
    if c:match("%s") then
      i = i + 1
    elseif c:match("[%a_]") then
      local w = s:match("^[%w_]+", i)
      toks[#toks + 1] = {type = "name", value = w}
      i = i + #w
    elseif c:match("%d") then
      local num = s:match("^%d[%d_]*%.%d[%d_]*[eE][+-]?%d+", i) or s:match("^%d[%d_]*%.%d[%d_]*", i)
        or s:match("^%d[%d_]*[eE][+-]?%d+", i) or s:match("^%d[%d_]*", i)
      toks[#toks + 1] = {type = "number", value = tonumber((num:gsub("_", ""))), float = num:find("[.eE]") ~= nil}
      i = i + #num
    elseif c == "'" or c == '"' then
      local j = i + 1
      while j <= n and s:sub(j, j) ~= c do j = j + (s:sub(j, j) == "\\" and 2 or 1) end
      if j > n then fail("a string literal is not closed", part.line) end
      toks[#toks + 1] = {type = "string", value = unescape(s:sub(i + 1, j - 1))}
      i = j + 1
    else
      local op
      for _, o in ipairs(OPERATORS) do
        if s:sub(i, i + #o - 1) == o then
          op = o
          break
        end
      end
      if not op then fail("unexpected character '%s'", part.line, c) end
      toks[#toks + 1] = {type = "op", value = op}
      i = i + #op
    end
  end
  return toks
end

return M
