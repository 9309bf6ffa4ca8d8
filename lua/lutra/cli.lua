-- lutra.cli — what the REPL shows and completes: the printed form of values (tables one
-- level deep, tensors through tostring) and tab-completion candidates (globals, table
-- fields after '.' or ':', tensor methods). Used by lutra.repl; pure Lua, no host needed.
local M = {}

local KEYWORDS = {
  "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if", "in",
  "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
}
local IS_KEYWORD = {}
for _, k in ipairs(KEYWORDS) do IS_KEYWORD[k] = true end

local MAX_TABLE_ITEMS = 40

local function is_identifier(k)
  return type(k) == "string" and k:match("^[%a_][%w_]*$") ~= nil and not IS_KEYWORD[k]
end
M.KEYWORDS = KEYWORDS

-- ---- printing values --------------------------------------------------------------------

local function quote(s) return (string.format("%q", s):gsub("\\\n", "\\n")) end

local function safe_tostring(v, nested)
  local ok, s = pcall(tostring, v)
  if not ok then return "<" .. type(v) .. ": tostring failed: " .. tostring(s) .. ">" end
  s = tostring(s)
  if nested and s:find("\n") then s = s:match("^[^\n]*") .. " ..." end
  return s
end

local repr

-- A tensor inside a table prints as its shape and dtype: "<tensor [2, 3] f32>".
local function tensor_summary(v)
  local lt = package.loaded.lutra
  local is_tensor = type(lt) == "table" and rawget(lt, "is_tensor")
  if type(is_tensor) ~= "function" then return nil end
  local ok, text = pcall(function()
    if not is_tensor(v) then return nil end
    local dims = {}
    for i, d in ipairs(v.shape) do dims[i] = tostring(d) end
    local device = v.device ~= "cpu" and " " .. tostring(v.device) or ""
    return "<tensor [" .. table.concat(dims, ", ") .. "] " .. tostring(v.dtype) .. device .. ">"
  end)
  return ok and text or nil
end

local function sort_keys(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then return ta < tb end
  if ta == "number" or ta == "string" then return a < b end
  return tostring(a) < tostring(b)
end

-- {1, 2, x = 3, ["a b"] = {...}}: one level deep, nested tables elided.
local function table_repr(t)
  local parts, n = {}, 0
  while rawget(t, n + 1) ~= nil do n = n + 1 end
  for i = 1, math.min(n, MAX_TABLE_ITEMS) do parts[#parts + 1] = repr(rawget(t, i), true) end
  local keys = {}
  for k in next, t do
    if not (type(k) == "number" and k >= 1 and k <= n and k == math.floor(k)) then keys[#keys + 1] = k end
  end
  table.sort(keys, sort_keys)
  for _, k in ipairs(keys) do
    if #parts >= MAX_TABLE_ITEMS then break end
    local key = is_identifier(k) and k or "[" .. repr(k, true) .. "]"
    parts[#parts + 1] = key .. " = " .. repr(rawget(t, k), true)
  end
  local total = n + #keys
  if total > #parts then parts[#parts + 1] = "... (" .. (total - #parts) .. " more)" end
  return "{" .. table.concat(parts, ", ") .. "}"
end

-- The text the REPL prints for one value; nested = inside a table (strings quoted, one line).
function repr(v, nested)
  local t = type(v)
  if t == "string" then return nested and quote(v) or v end
  if t == "table" then
    local mt = getmetatable(v)
    if type(mt) == "table" and mt.__tostring then return safe_tostring(v, nested) end
    if nested then return next(v) == nil and "{}" or "{...}" end
    return table_repr(v)
  end
  if t == "cdata" and nested then return tensor_summary(v) or safe_tostring(v, true) end
  if t == "cdata" or t == "userdata" then return safe_tostring(v, nested) end
  return tostring(v)
end
M.repr = repr

-- Several values separated by tabs (n counts trailing nils).
function M.format_values(n, ...)
  local parts = {}
  for i = 1, n do parts[i] = repr((select(i, ...))) end
  return table.concat(parts, "\t")
end

-- ---- completion ---------------------------------------------------------------------------

local function safe_index(v, k)
  local ok, r = pcall(function() return v[k] end)
  if ok then return r end
end

-- Adds the identifier keys of t and of its __index tables (recursively).
local function add_members(names, t, methods_only, depth)
  if type(t) ~= "table" or depth > 6 then return end
  for k, v in next, t do
    if is_identifier(k) and (not methods_only or type(v) == "function" or type(v) == "table") then names[k] = true end
  end
  local mt = getmetatable(t)
  if type(mt) == "table" then add_members(names, rawget(mt, "__index"), methods_only, depth + 1) end
end

-- Tensors are cdata with a metatype, whose keys cannot be listed: their names come from the
-- library's tables (lutra.Tensor or lutra._methods: methods; lutra.tensor_properties: the
-- fields after '.'), when lutra.is_tensor(v) says v is one (or v resolves one of the methods).
local function add_tensor_members(names, v, methods_only)
  local lt = package.loaded.lutra
  if type(lt) ~= "table" then return end
  local methods = rawget(lt, "_methods") or rawget(lt, "Tensor")
  if type(methods) ~= "table" then return end
  local is_tensor = rawget(lt, "is_tensor")
  local yes = false
  if type(is_tensor) == "function" then
    local ok, r = pcall(is_tensor, v)
    yes = ok and r == true
  end
  if not yes then
    for k, f in next, methods do
      if type(k) == "string" and type(f) == "function" then
        yes = safe_index(v, k) == f
        break
      end
    end
  end
  if not yes then return end
  add_members(names, methods, methods_only, 0)
  local props = rawget(lt, "tensor_properties")
  if not methods_only and type(props) == "table" then add_members(names, props, false, 0) end
end

local function member_names(v, methods_only)
  local names = {}
  if type(v) == "table" then
    add_members(names, v, methods_only, 0)
  elseif type(v) == "string" then
    add_members(names, string, methods_only, 0)
  elseif type(v) == "cdata" or type(v) == "userdata" then
    add_tensor_members(names, v, methods_only)
  end
  return names
end

local function global_names(env)
  local names = {}
  add_members(names, env or _G, false, 0)
  return names
end

-- Candidates completing the dotted path at the end of line (the text before the cursor):
-- full replacements of that path, e.g. "lutra.ze" -> {"lutra.zeros", "lutra.zeros_like"}.
-- env: where names resolve (default _G); root_names(): the names at the root (default
-- env's keys).
function M.complete(line, env, root_names)
  local word = line:match("[%w_%.:]*$")
  if word:match("^[%d%.:]") then return {} end
  local path, sep, partial = word:match("^(.*)([%.:])([%w_]*)$")
  local names, prefix = {}, ""
  if not path then
    partial = word
    names = root_names and root_names() or global_names(env)
    for _, k in ipairs(KEYWORDS) do names[k] = true end
  else
    if path:find("[:]") or path:find("%.%.") or path:sub(-1) == "." then return {} end
    local v = env or _G
    for comp in path:gmatch("[^%.]+") do
      v = safe_index(v, comp)
      if v == nil then return {} end
    end
    names = member_names(v, sep == ":")
    prefix = path .. sep
  end
  local out = {}
  for k in pairs(names) do
    if k:sub(1, #partial) == partial then out[#out + 1] = prefix .. k end
  end
  table.sort(out)
  return out
end

M.global_names = global_names

return M
