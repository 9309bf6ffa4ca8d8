-- lutra.doc — documentation read from lutra's own Lua sources: help(x) in the REPL and docs/api.md.
--
--   doc.find(x) -> text or nil      x: a module or class table (lt.nn.Linear, lt.train), a function
--                                   (lt.F.rope, t.matmul), an object (its class), or a name
--                                   ("cross_entropy", "nn.Linear", "F.rope", "lutra.optim")
--   doc.function_doc(fn, name), doc.module_doc(t)   the parts: tests/house/api_doc.lua writes docs/api.md
--
-- The one format: a module's head comment (the comment lines that open its file: `-- lutra.x — what
-- it is`, then usage lines) documents the module and its classes; a function's doc is the comment
-- block right above its definition, else the usage lines of its module's head that name it
-- (`--   F.rope(x, positions, theta, out) -> ...`). Sources are read as text, never run.
local M = {}

local lines_cache = {}

-- The file's lines, or nil when it cannot be read.
local function file_lines(path)
  local cached = lines_cache[path]
  if cached ~= nil then return cached or nil end
  local f = io.open(path, "r")
  if not f then
    lines_cache[path] = false
    return nil
  end
  local lines = {}
  for line in f:lines() do lines[#lines + 1] = line end
  f:close()
  lines_cache[path] = lines
  return lines
end

-- "lutra/nn/linear.lua" from any path that has a lua/ root (what docs show, the same on every machine).
local function short_path(path)
  return path:match("lua/(lutra/.*)$") or path:match("(lutra/.*)$") or path
end

local function strip(line)
  return (line:gsub("^%s*%-%-%s?", ""))
end

local function is_comment(line)
  return line ~= nil and line:match("^%s*%-%-") ~= nil and not line:match("^%s*%-%-%s*%-%-%-%-")
end

-- The comment lines that open a file (a leading #! line skipped).
local function head_comment(path)
  local lines = file_lines(path)
  if not lines then return nil end
  local i, out = 1, {}
  if lines[1] and lines[1]:match("^#!") then i = 2 end
  while is_comment(lines[i]) do
    out[#out + 1] = strip(lines[i])
    i = i + 1
  end
  return #out > 0 and table.concat(out, "\n") or nil
end

-- The comment block that ends right above line n.
local function comment_above(lines, n)
  local i = n - 1
  while is_comment(lines[i]) do i = i - 1 end
  if i == n - 1 then return nil end
  local out = {}
  for j = i + 1, n - 1 do out[#out + 1] = strip(lines[j]) end
  return table.concat(out, "\n")
end

-- The head's usage lines (indented) that call name, and its lines that begin with a call of it
-- (`forward(x, cache, pos) passes ...`), each with its deeper-indented continuation.
local function head_usage(head, name)
  if not head or not name then return nil end
  local lines, out = {}, {}
  for line in (head .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
  local i = 1
  local pattern = "[%.:%s]" .. name:gsub("%p", "%%%0") .. "[%(%{]"
  local called = "^%s*[%w_%.:]-[%.:]?" .. name:gsub("%p", "%%%0") .. "[%(%{]"
  while i <= #lines do
    local line = lines[i]
    if line:find(called) or (line:match("^%s") and (" " .. line):find(pattern)) then
      local indent = #line:match("^(%s*)")
      out[#out + 1] = line
      i = i + 1
      while lines[i] and #lines[i]:match("^(%s*)") > indent and lines[i]:match("%S") do
        out[#out + 1] = lines[i]
        i = i + 1
      end
    else
      i = i + 1
    end
  end
  return #out > 0 and table.concat(out, "\n") or nil
end

-- The loaded lutra module whose value is t (the shortest name when several are), and its source file.
local function module_of(t)
  local best
  for name, value in pairs(package.loaded) do
    if value == t and type(name) == "string" and name:match("^lutra") and (not best or #name < #best) then
      best = name
    end
  end
  if not best then return nil end
  return best, package.searchpath(best, package.path)
end

-- Where fn is defined: its file, first line, the line's text; nil for C functions.
local function defined_at(fn)
  local info = debug.getinfo(fn, "S")
  if not info or info.what == "C" or info.source:sub(1, 1) ~= "@" then return nil end
  local path = info.source:sub(2)
  local lines = file_lines(path)
  if not lines then return nil end
  return path, info.linedefined, lines
end

-- {signature =, where =, text =} for a function (name: the name it is known by, for the head's usage
-- lines); text is nil when the function has no doc comment.
function M.function_doc(fn, name)
  local path, n, lines = defined_at(fn)
  if not path then return nil end
  local text = comment_above(lines, n)
  if not text then
    -- a group of one-line definitions under one comment (m:freeze, m:unfreeze)
    local i = n - 1
    while i > 0 and n - i < 8 and lines[i]:match("^function .*end$") do i = i - 1 end
    if i < n - 1 then text = comment_above(lines, i + 1) end
  end
  if not text and lines[n]:match("^%s") then
    -- made inside a factory or a loop: the comment above the enclosing top-level function or loop
    local i = n - 1
    while i > 0 and lines[i]:match("^%s+%S") and n - i < 8 do i = i - 1 end
    if i > 0 and (lines[i]:match("function") or lines[i]:match("^for%s") or lines[i]:match("^do")) then
      text = comment_above(lines, i)
    end
  end
  if not text then text = lines[n]:match("%s%-%-%s*(%S.*)$") end -- a comment at the end of the line
  if not text then
    -- a file made for this one function names it in its head's first line (`lutra.functional.one_hot —
    -- F.one_hot(index, num_classes): ...`): the head is its doc
    local head, fname = head_comment(path), name or lines[n]:match("function%s+[%w_]+[%.:]([%w_]+)")
    local first = head and head:match("^[^\n]*")
    if fname and first and (" " .. first):find("[%.:%s]" .. fname:gsub("%p", "%%%0") .. "[%(%{]") then text = head end
  end
  if not text then
    text = head_usage(head_comment(path), name or lines[n]:match("function%s+[%w_]+[%.:]([%w_]+)"))
  end
  return {signature = (lines[n]:gsub("^%s+", ""):gsub("%s+$", "")), where = short_path(path) .. ":" .. n,
          text = text, head = head_comment(path)}
end

-- {name =, where =, text =} for a module or class table; nil when t is no loaded lutra module.
function M.module_doc(t)
  local name, path = module_of(t)
  if not name then return nil end
  return {name = name, where = path and short_path(path) or "?", text = path and head_comment(path)}
end

-- The public tables a name is looked up in, in order: F, tensor methods, lutra, nn, then the
-- training modules.
local function search_tables(lt)
  local out = {{"F", lt.F}, {"Tensor", lt.Tensor}, {"lutra", lt}, {"nn", lt.nn}}
  for _, k in ipairs {"optim", "data", "train", "generate", "ckpt", "hf", "tokenizer", "dist", "autograd",
                      "config", "cuda", "models", "json", "safetensors"} do
    out[#out + 1] = {k, lt[k]}
  end
  return out
end

-- x named by a string: "cross_entropy", "F.rope", "nn.Linear", "lutra.optim", "t:matmul".
-- lutra itself is taken from package.loaded, not required: lutra.repl asks this module, below lutra.
local function resolve(name)
  local lt = package.loaded.lutra
  if type(lt) ~= "table" then
    local mod = package.loaded["lutra." .. name:gsub("^lutra%.", "")]
    return mod, mod and name:match("([%w_]+)$")
  end
  local path = name:gsub("^lutra%.", ""):gsub("^lt%.", ""):gsub("^t[:%.]", "Tensor.")
  if name == "lutra" or name == "lt" then return lt, "lutra" end
  local value = lt
  for part in path:gmatch("[^%.:]+") do
    if type(value) ~= "table" then value = nil break end
    local ok, v = pcall(function() return value[part] end)
    value = ok and v or nil
    if value == nil then break end
  end
  if value ~= nil then return value, path:match("([%w_]+)$") end
  if package.loaded["lutra." .. path] then return package.loaded["lutra." .. path], path end
  for _, entry in ipairs(search_tables(lt)) do
    local t = entry[2]
    if type(t) == "table" then
      local v = rawget(t, name)
      if v ~= nil then return v, name end
    end
  end
  return nil
end

-- For a class that is a field of a module rather than a module itself (data.Loader, optim.Optimizer):
-- the doc of the module that holds it, named by the field; of several, the most specific (the
-- longest name: lutra.nn.activation for nn.GELU, not lutra.nn).
local function holder_doc(t)
  local best, best_key
  for name, mod in pairs(package.loaded) do
    if type(name) == "string" and name:match("^lutra") and type(mod) == "table" and mod ~= t
       and (not best or #name > #best) then
      for k, v in pairs(mod) do
        if v == t and type(k) == "string" and k ~= "super" and k:sub(1, 1) ~= "_" then
          best, best_key = name, k
          break
        end
      end
    end
  end
  if not best then return nil end
  local d = M.module_doc(package.loaded[best])
  if d then d.name = best .. "." .. best_key .. ", in " .. d.name end
  return d
end

local function format_module(d)
  return (d.text or "(no head comment)") .. "\n  (" .. d.name .. ", " .. d.where .. ")"
end

local function format_function(d)
  -- a function made in a loop or by a factory has no comment of its own: its file's head says what it is
  local text = d.text or (d.head and "(no doc comment of its own; its file's head:)\n" .. d.head) or "(no doc comment)"
  return d.signature .. "  (" .. d.where .. ")\n" .. text
end

-- x's documentation as text, or nil.
function M.find(x, name)
  if type(x) == "string" then
    local value, key = resolve(x)
    if value == nil then return nil end
    return M.find(value, key)
  elseif type(x) == "function" then
    -- lutra.exp is a checking wrapper of the tensor method t:exp: the method's doc says what it does
    local lt = package.loaded.lutra
    if type(lt) == "table" and type(lt.Tensor) == "table" then
      for k, v in pairs(lt) do
        local method = rawget(lt.Tensor, k)
        if v == x and type(method) == "function" and method ~= x then
          local text = M.find(method, k)
          return text and ("lutra." .. k .. "(t, ...) is t:" .. k .. "(...):\n" .. text)
        end
      end
    end
    local d = M.function_doc(x, name)
    return d and format_function(d)
  elseif type(x) == "table" then
    local d = M.module_doc(x)
    if d then return format_module(d) end
    -- a class held by a module (nn.GELU in lutra.nn.activation): that module, before its parent classes
    if rawget(x, "__index") == x then
      d = holder_doc(x)
      if d then return format_module(d) end
    end
    -- an object: its class (the metatable's __index chain), a module or a field of one
    local seen, mt = {}, getmetatable(x)
    while type(mt) == "table" and not seen[mt] do
      seen[mt] = true
      d = M.module_doc(mt) or (type(mt.__index) == "table" and M.module_doc(mt.__index))
      if d then return format_module(d) end
      mt = type(mt.__index) == "table" and mt.__index or nil
    end
    d = holder_doc(x) or (type(getmetatable(x)) == "table" and holder_doc(getmetatable(x)))
    if d then return format_module(d) end
  end
  return nil
end

return M
