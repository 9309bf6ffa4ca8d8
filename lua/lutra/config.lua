-- lutra.config — a recipe's defaults, overridden by config files and the command line.
--
--   local cfg = lutra.config {lr = 1e-3, steps = 2000, model = {arch = "gpt2", n_layer = 4}}
--   -- lutra recipe.lua --config=runs/x/config.json --lr=6e-4 --model.n_layer=8 --compile --steps 500
--   print(cfg.lr, cfg.model.n_layer)     -- plain fields
--   print(cfg:dump()); cfg:save("runs/x/config.json")
--
-- Sources, later ones winning: the defaults, then each --config=FILE, then the other options
-- in order. A FILE.json is data: a JSON object of overrides nested like the defaults (what
-- cfg:save and the trainer's run_dir/config.json write; null unsets an optional key), read and
-- never run, so a config that came with someone's run directory is safe to load. Any other
-- FILE (FILE.lua) is Lua code that returns a table of overrides: the user's own code, run as
-- such, never a file lutra wrote.
-- Options: --key=value, --key value, --group.key=value, --flag (true) and --no-flag (false)
-- for booleans, --list=1,2,3 for lists; dashes in names may stand for underscores.
-- --help prints the options and exits (unless the defaults have a `help` key).
--
-- Every value is checked against its default's type: numbers, integers (where the default
-- is a whole number: declare config.number(1) for a number that may be fractional),
-- booleans, strings, lists (elements typed by the default's), nested tables. A default
-- "auto" accepts any string or a number. Markers declare keys without a usable default:
--   config.optional(kind [, default])  kind "number"|"integer"|"string"|"boolean", may be nil
--                                      (--key=nil unsets it)
--   config.number(default)             any number
--   config.one_of({"gpt2", "llama"}, "gpt2")
-- An unknown key is an error suggesting the nearest valid one.
--
-- The result is a plain table (nested tables plain too) whose metatable adds cfg:dump()
-- (sorted Lua text, for reading), cfg:save(path) (JSON, to a path ending in .json, written
-- through lutra.atomic_file: a file that --config= reads back as data; the strings must be
-- UTF-8, a number that is not finite is written as the string "inf", "-inf" or "nan", which a
-- number key reads back) and cfg:plain() (a copy without methods); config.dump(cfg) and
-- config.save(cfg, path) do the same when a key is named dump or save.
local errors = require "lutra.errors"
local json = require "lutra.json"
local atomic_file = require "lutra.atomic_file"

local M = {}

local raise = errors.raise
local floor, huge = math.floor, math.huge

-- ---- markers and the schema ------------------------------------------------------------------

local Marker = {}
Marker.__index = Marker

local SCALAR_KINDS = {number = true, integer = true, string = true, boolean = true}

function M.optional(kind, default)
  if not SCALAR_KINDS[kind] then
    raise("config.optional: kind must be \"number\", \"integer\", \"string\" or \"boolean\", got " .. tostring(kind))
  end
  return setmetatable({kind = kind, default = default, optional = true}, Marker)
end

function M.number(default)
  if type(default) ~= "number" then raise("config.number: the default must be a number, got " .. type(default)) end
  return setmetatable({kind = "number", default = default}, Marker)
end

function M.one_of(choices, default)
  if type(choices) ~= "table" or #choices == 0 then raise("config.one_of: expected a non-empty list of choices") end
  local ok = false
  for _, c in ipairs(choices) do ok = ok or c == default end
  if not ok then raise("config.one_of: the default " .. tostring(default) .. " is not one of the choices") end
  return setmetatable({kind = type(default) == "number" and "number" or "string", default = default,
                       choices = choices}, Marker)
end

local function is_integer(v) return type(v) == "number" and v == floor(v) and v > -huge and v < huge end

local function is_list(t)
  local n = #t
  for k in pairs(t) do
    if type(k) ~= "number" or k < 1 or k > n or k ~= floor(k) then return false end
  end
  return true
end

local function join(prefix, key) return prefix == "" and tostring(key) or prefix .. "." .. tostring(key) end

-- Scalar kind of a default value.
local function scalar_kind(v)
  if type(v) == "number" then return is_integer(v) and "integer" or "number" end
  if type(v) == "string" then return v == "auto" and "auto" or "string" end
  if type(v) == "boolean" then return "boolean" end
end

-- A schema node: {kind=, default=, optional=, choices=, elem= (lists), children= (tables)}.
local function build_schema(v, path)
  if getmetatable(v) == Marker then return v end
  local kind = scalar_kind(v)
  if kind then return {kind = kind, default = v} end
  if type(v) ~= "table" then
    raise(string.format("config: the default of '%s' is a %s; defaults are numbers, strings, booleans or tables", path,
      type(v)))
  end
  if is_list(v) then
    local elem = nil -- the elements' kind: integer only if all are, "any" for an empty list
    for i, x in ipairs(v) do
      local k = scalar_kind(x)
      if not k then raise(string.format("config: the default list '%s' holds a %s at [%d]", path, type(x), i)) end
      if k == "auto" then k = "string" end
      if elem == nil or elem == k then
        elem = k
      elseif (elem == "integer" and k == "number") or (elem == "number" and k == "integer") then
        elem = "number"
      else
        raise(string.format("config: the default list '%s' mixes %ss and %ss", path, elem, k))
      end
    end
    return {kind = "list", default = v, elem = elem or "any"}
  end
  local children = {}
  for key, x in pairs(v) do
    if type(key) ~= "string" then
      raise(string.format("config: key %s in '%s' is not a string", tostring(key), path))
    end
    children[key] = build_schema(x, join(path, key))
  end
  return {kind = "table", children = children}
end

-- The value of a schema node as the config starts (deep copies of tables).
local function initial(node)
  if node.kind == "table" then
    local t = {}
    for k, child in pairs(node.children) do t[k] = initial(child) end
    return t
  end
  if node.kind == "list" then return {unpack(node.default)} end
  return node.default
end

-- Every key path (leaves and groups), for suggestions.
local function all_paths(node, prefix, out)
  for k, child in pairs(node.children) do
    local p = join(prefix, k)
    out[#out + 1] = p
    if child.kind == "table" then all_paths(child, p, out) end
  end
  return out
end

-- ---- suggestions -------------------------------------------------------------------------------

-- The Levenshtein distance between strings a and b (byte edits), for suggesting a mistyped key.
local function edit_distance(a, b)
  local prev, cur = {}, {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    cur[0] = i
    local ca = a:byte(i)
    for j = 1, #b do
      local cost = ca == b:byte(j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev, cur = cur, prev
  end
  return prev[#b]
end
M.edit_distance = edit_distance

local function last_part(p) return p:match("([^.]*)$") end

-- The valid path nearest to `path`, or nil when none is near.
local function nearest(path, candidates)
  local best, best_d = nil, huge
  for _, c in ipairs(candidates) do
    local d = edit_distance(path, c)
    if d < best_d or (d == best_d and c < best) then best, best_d = c, d end
  end
  if best and best_d <= math.max(2, floor(#path / 3)) then return best end
  -- the same name in another group: --n_layer for model.n_layer
  local name, found, found_d = last_part(path), nil, huge
  for _, c in ipairs(candidates) do
    local d = edit_distance(name, last_part(c))
    if d < found_d or (d == found_d and c < found) then found, found_d = c, d end
  end
  if found and found_d <= math.min(2, floor(#name / 3)) then return found end
end

local function unknown_key(root, path, where)
  local near = nearest(path, all_paths(root, "", {}))
  local msg = string.format("config: unknown config key '%s'", path)
  if near then msg = msg .. string.format("; did you mean '%s'?", near) end
  raise(msg .. (where and (" (" .. where .. ")") or ""))
end

-- ---- checking and parsing values -------------------------------------------------------------

local function show(v) return type(v) == "string" and string.format("'%s'", v) or tostring(v) end

local KIND_TEXT = {integer = "an integer", number = "a number", string = "a string", boolean = "a boolean",
                   auto = "a number or a string (default \"auto\")", list = "a list", table = "a table of keys",
                   any = "a number, string or boolean"}

local function type_error(path, node, v, where)
  local hint = ""
  if node.kind == "integer" and type(v) == "number" then
    hint = string.format("; declare lutra.config.number(%s) in the defaults if fractional values are meant",
      tostring(node.default))
  elseif node.kind == "table" then
    hint = "; set its keys, e.g. --" .. path .. "." .. (next(node.children) or "key") .. "=..."
  end
  raise(string.format("config: '%s' expects %s, got %s %s%s%s", path, KIND_TEXT[node.kind], type(v), show(v),
    where and (" (" .. where .. ")") or "", hint))
end

local function check_choice(path, node, v, where)
  if not node.choices then return v end
  for _, c in ipairs(node.choices) do if c == v then return v end end
  local names = {}
  for i, c in ipairs(node.choices) do names[i] = tostring(c) end
  local near = nearest(tostring(v), names)
  raise(string.format("config: '%s' must be one of %s; got %s%s%s", path, table.concat(names, ", "), show(v),
    near and string.format(" (did you mean '%s'?)", near) or "", where and (" (" .. where .. ")") or ""))
end

-- Checks a Lua value against a scalar kind; returns it.
local NON_FINITE = {inf = huge, ["-inf"] = -huge, nan = 0 / 0} -- as cfg:save writes them in JSON

local function check_scalar(kind, path, node, v, where)
  if (kind == "number" or kind == "integer") and NON_FINITE[v] then v = NON_FINITE[v] end
  -- inf and nan (--lr=1e400 parses as inf) only where the default itself is one
  local d = node.default
  if type(v) == "number" and (v ~= v or v == huge or v == -huge)
      and not (type(d) == "number" and (d ~= d or d == huge or d == -huge)) then
    raise(string.format("config: '%s' must be a finite number, got %s%s", path, tostring(v),
      where and (" (" .. where .. ")") or ""))
  end
  local ok
  if kind == "integer" then
    ok = is_integer(v)
  elseif kind == "number" then
    ok = type(v) == "number"
  elseif kind == "auto" then
    ok = type(v) == "number" or type(v) == "string"
  elseif kind == "any" then
    ok = type(v) == "number" or type(v) == "string" or type(v) == "boolean"
  else
    ok = type(v) == kind
  end
  if not ok then type_error(path, {kind = kind, default = node.default, children = node.children}, v, where) end
  return v
end

local function check_value(path, node, v, where)
  if v == nil and node.optional then return nil end
  if node.kind == "list" then
    if type(v) ~= "table" or not is_list(v) then type_error(path, node, v, where) end
    local out = {}
    for i, x in ipairs(v) do out[i] = check_scalar(node.elem, path .. "[" .. i .. "]", node, x, where) end
    return out
  end
  return check_choice(path, node, check_scalar(node.kind, path, node, v, where), where)
end

local BOOLEANS = {["true"] = true, yes = true, on = true, ["1"] = true, ["false"] = false, no = false, off = false,
                  ["0"] = false}

-- Parses a command-line string for a scalar kind.
local function parse_scalar(kind, path, node, s, where)
  if kind == "string" then return s end
  if kind == "boolean" then
    local b = BOOLEANS[s:lower()]
    if b == nil then
      raise(string.format("config: '%s' expects a boolean (true/false), got '%s' (%s)", path, s, where))
    end
    return b
  end
  local n = tonumber(s)
  if kind == "auto" or kind == "any" then -- a number when it parses (and for "any", true/false)
    if n then return n end
    if kind == "any" and (s == "true" or s == "false") then return s == "true" end
    return s
  end
  if not n then raise(string.format("config: '%s' expects %s, got '%s' (%s)", path, KIND_TEXT[kind], s, where)) end
  return check_scalar(kind, path, node, n, where)
end

local function parse_value(path, node, s, where)
  if node.optional and (s == "nil" or s == "none") then return nil end
  if node.kind == "table" then type_error(path, node, s, where) end
  if node.kind == "list" then
    local out = {}
    if s ~= "" then
      for part in (s .. ","):gmatch("([^,]*),") do
        out[#out + 1] = parse_scalar(node.elem, path .. "[" .. (#out + 1) .. "]", node, part, where)
      end
    end
    return out
  end
  return check_choice(path, node, parse_scalar(node.kind, path, node, s, where), where)
end

-- ---- merging ----------------------------------------------------------------------------------

-- Merges a table of overrides (from a config file) into cfg, checking every key.
local function merge(root, node, cfg, over, prefix, where)
  for k, v in pairs(over) do
    local path = join(prefix, k)
    local child = type(k) == "string" and node.children[k]
    if not child then unknown_key(root, path, where) end
    if v == json.null then -- a JSON file's null: unsets an optional key
      if not child.optional then
        raise(string.format("config: '%s' expects %s, got null (%s)", path, KIND_TEXT[child.kind], where))
      end
      cfg[k] = nil
    elseif child.kind == "table" then
      if type(v) ~= "table" then type_error(path, child, v, where) end
      merge(root, child, cfg[k], v, path, where)
    else
      cfg[k] = check_value(path, child, v, where)
    end
  end
end

-- The schema node, parent table and key of a dotted path ("model.n_layer"); a list
-- element ("betas.2") gives a node for the element. On failure: nil, the message, and
-- whether the key is unknown (rather than misused).
local function resolve(root, cfg, path, where)
  local node, parent, key = root, cfg, nil
  local parts = {}
  for part in (path .. "."):gmatch("([^.]*)%.") do parts[#parts + 1] = part end
  for i, part in ipairs(parts) do
    local above = table.concat(parts, ".", 1, i - 1)
    if node.kind == "list" and i == #parts and tonumber(part) then
      local idx = tonumber(part)
      if idx ~= floor(idx) or idx < 1 or idx > #parent + 1 then
        return nil, string.format("config: '%s' has %d elements; cannot set element %s (%s)", above, #parent, part,
          where)
      end
      return {kind = node.elem, default = node.default, elem_of = node}, parent, idx
    end
    if node.kind ~= "table" then
      return nil, string.format("config: '%s' is %s, not a table of keys (%s)", above, KIND_TEXT[node.kind], where)
    end
    if not node.children[part] and node.children[(part:gsub("%-", "_"))] then part = part:gsub("%-", "_") end
    local child = node.children[part]
    if not child then return nil, nil, true end
    if i < #parts then parent = parent[part] end
    node, key = child, part
  end
  return node, parent, key
end

local function resolve_or_raise(root, cfg, path, where)
  local node, parent, key = resolve(root, cfg, path, where)
  if node then return node, parent, key end
  if key == true then unknown_key(root, (path:gsub("%-", "_")), where) end
  raise(parent)
end

-- ---- the config object -------------------------------------------------------------------------

local Config = {}
local schemas = setmetatable({}, {__mode = "k"})

local IDENT = "^[%a_][%w_]*$"
local KEYWORDS = {}
for w in ("and break do else elseif end false for function goto if in local nil not or repeat return then true "
  .. "until while"):gmatch("%a+") do KEYWORDS[w] = true end

local function format_number(v)
  if v ~= v then return "0/0" end
  if v == huge then return "math.huge" end
  if v == -huge then return "-math.huge" end
  if is_integer(v) and math.abs(v) < 2 ^ 63 then return string.format("%d", v) end
  for digits = 15, 17 do
    local s = string.format("%." .. digits .. "g", v)
    if tonumber(s) == v then return s end
  end
end

local function format_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    local named = {["\n"] = "\\n", ["\t"] = "\\t", ["\r"] = "\\r", ['"'] = '\\"', ["\\"] = "\\\\"}
    return named[c] or string.format("\\%03d", c:byte())
  end) .. '"'
end

local function format_scalar(v)
  if type(v) == "number" then return format_number(v) end
  if type(v) == "string" then return format_string(v) end
  return tostring(v)
end

local function format_key(k)
  if type(k) == "string" and k:match(IDENT) and not KEYWORDS[k] then return k end
  return "[" .. format_scalar(k) .. "]"
end

local function dump_table(t, node, indent, lines)
  local keys, seen = {}, {}
  for k in pairs(t) do keys[#keys + 1], seen[k] = k, true end
  if node and node.kind == "table" then -- optional keys that are nil still show
    for k in pairs(node.children) do if not seen[k] then keys[#keys + 1] = k end end
  end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(keys) do
    local v, child = t[k], node and node.children and node.children[k]
    local head = indent .. "  " .. format_key(k) .. " = "
    local inline = type(v) == "table"
      and (child and child.kind == "list" or not child and next(v) ~= nil and is_list(v))
    if type(v) == "table" and not inline then
      lines[#lines + 1] = head .. "{"
      dump_table(v, child, indent .. "  ", lines)
      lines[#lines + 1] = indent .. "  },"
    elseif type(v) == "table" then
      local parts = {}
      for i, x in ipairs(v) do parts[i] = format_scalar(x) end
      lines[#lines + 1] = head .. "{" .. table.concat(parts, ", ") .. "},"
    elseif v == nil then
      lines[#lines + 1] = head .. "nil, -- optional " .. (child and child.kind or "")
    else
      lines[#lines + 1] = head .. format_scalar(v) .. ","
    end
  end
end

-- The config as sorted Lua table text.
function M.dump(cfg)
  local lines = {"{"}
  dump_table(cfg, schemas[cfg], "", lines)
  lines[#lines + 1] = "}"
  return table.concat(lines, "\n")
end

-- The config as JSON data: lists marked as arrays (an empty one stays []), an optional key
-- that is nil as null (it reads back unset, not as its default), numbers that are not finite
-- as "inf", "-inf", "nan".
local NON_FINITE_TEXT = {[huge] = "inf", [-huge] = "-inf"}
local function scalar_data(v)
  if type(v) == "number" and (v ~= v or v == huge or v == -huge) then return v ~= v and "nan" or NON_FINITE_TEXT[v] end
  return v
end

local function to_data(t, node)
  local out = {}
  for k, v in pairs(t) do
    local child = node and node.children and node.children[k]
    if type(v) == "table" and ((child and child.kind == "list") or (not child and next(v) ~= nil and is_list(v))) then
      local list = json.array()
      for i, x in ipairs(v) do list[i] = scalar_data(x) end
      out[k] = list
    elseif type(v) == "table" then
      out[k] = to_data(v, child)
    else
      out[k] = scalar_data(v)
    end
  end
  if node and node.kind == "table" then
    for k in pairs(node.children) do
      if t[k] == nil then out[k] = json.null end
    end
  end
  return out
end

-- Writes the config as JSON (indented, keys sorted) to path, which must end in .json: a file
-- that --config= reads back as data. Returns path.
function M.save(cfg, path)
  if type(path) ~= "string" or not path:lower():match("%.json$") then
    raise("config: save writes JSON; name the file *.json (got " .. tostring(path) .. ")")
  end
  local ok, text = pcall(json.encode, to_data(cfg, schemas[cfg]), {indent = 2})
  if not ok then raise("config: cannot save " .. path .. ": " .. (tostring(text):gsub("^[^\n]-:%d+: ", ""))) end
  local done, err = atomic_file.write(path, text .. "\n")
  if not done then raise("config: " .. err) end
  return path
end

local function deep_copy(v)
  if type(v) ~= "table" then return v end
  local t = {}
  for k, x in pairs(v) do t[k] = deep_copy(x) end
  return t
end

Config.__index = {dump = M.dump, save = M.save, plain = deep_copy}
Config.__tostring = M.dump

-- The overrides of a --config file: a FILE.json read as data, any other file run as the
-- user's Lua code (which returns a table).
function M.load(path)
  if type(path) == "string" and path:lower():match("%.json$") then
    local ok, t = pcall(json.read_file, path)
    if not ok then raise("config: cannot load --config=" .. path .. ": " .. (tostring(t):gsub("^[^\n]-:%d+: ", ""))) end
    if type(t) ~= "table" or json.is_array(t) then
      raise("config: --config=" .. path .. " must hold a JSON object of settings, got "
        .. (json.is_array(t) and "an array" or t == json.null and "null" or type(t)))
    end
    return t
  end
  local chunk, err = loadfile(path)
  if not chunk then raise("config: cannot load --config=" .. tostring(path) .. ": " .. tostring(err)) end
  local ok, t = pcall(chunk)
  if not ok then raise("config: --config=" .. path .. " failed: " .. tostring(t)) end
  if type(t) ~= "table" then raise("config: --config=" .. path .. " must return a table, got " .. type(t)) end
  return t
end

-- The --help text: every option with its default and kind.
function M.help(defaults)
  local root = build_schema(defaults or {}, "")
  local lines = {"options (--key=value; --config=FILE.json loads settings as data, as run_dir/config.json holds "
    .. "them; --config=FILE.lua runs your Lua file returning overrides):"}
  local paths = {}
  local function walk(node, prefix)
    for k, child in pairs(node.children) do
      local p = join(prefix, k)
      if child.kind == "table" then walk(child, p) else paths[#paths + 1] = {p, child} end
    end
  end
  walk(root, "")
  table.sort(paths, function(a, b) return a[1] < b[1] end)
  for _, e in ipairs(paths) do
    local p, node = e[1], e[2]
    local d = node.default
    local shown = type(d) == "table" and table.concat(d, ",") or (d == nil and "nil" or format_scalar(d))
    local kind = node.kind .. (node.optional and ", optional" or "")
      .. (node.choices and (": " .. table.concat(node.choices, "|")) or "")
    lines[#lines + 1] = string.format("  --%s=%s  (%s)", p, shown, kind)
  end
  return table.concat(lines, "\n") .. "\n"
end

-- Applies the command line argv (config files, then --key=value overrides) to cfg.
local function apply_args(root, cfg, argv)
  -- first pass: split the arguments into config files and overrides {key, value, text}
  local files, sets = {}, {}
  local i = 1
  while i <= #argv do
    local a = argv[i]
    if type(a) ~= "string" then raise("config: argument " .. i .. " is a " .. type(a) .. ", not a string") end
    local key, value = a:match("^%-%-([^=]+)=(.*)$")
    if not key then key = a:match("^%-%-(.+)$") end
    if not key then raise(string.format("config: unexpected argument '%s': options look like --key=value", a)) end
    if key == "help" and not value and not root.children.help then
      io.write(M.help(defaults))
      os.exit(0)
    end
    local is_file = key == "config" and not root.children.config
    if not value then
      local node = not is_file and resolve(root, cfg, key, a)
      local neg = key:match("^no%-(.+)$")
      local neg_node = not node and neg and resolve(root, cfg, neg, a)
      if node and node.kind == "boolean" then
        value = "true"
      elseif neg_node and neg_node.kind == "boolean" then
        key, value = neg, "false"
      elseif node or is_file then
        value = argv[i + 1]
        if value == nil or value:match("^%-%-") then
          raise(string.format("config: --%s needs a value (--%s=VALUE)", key, key))
        end
        a = a .. " " .. value
        i = i + 1
      else
        resolve_or_raise(root, cfg, key, a) -- the unknown-key (or misuse) error
      end
    end
    if is_file then
      files[#files + 1] = value
    else
      sets[#sets + 1] = {key, value, a}
    end
    i = i + 1
  end

  for _, path in ipairs(files) do merge(root, root, cfg, M.load(path), "", "in " .. path) end
  for _, s in ipairs(sets) do
    local key, value, text = s[1], s[2], s[3]
    local node, parent, k = resolve_or_raise(root, cfg, key, text)
    if node.elem_of then
      parent[k] = parse_scalar(node.kind, key, node, value, text)
    else
      parent[k] = parse_value(key, node, value, text)
    end
  end
end

-- config(defaults, [argv]): argv defaults to the script's arguments (the global `arg`).
function M.new(defaults, argv)
  if type(defaults) ~= "table" then raise("config: expected a table of defaults, got " .. type(defaults)) end
  if argv == nil then
    argv = {}
    local a = rawget(_G, "arg")
    if type(a) == "table" then for i = 1, #a do argv[i] = a[i] end end
  end
  if type(argv) ~= "table" then raise("config: argv must be a list of strings, got " .. type(argv)) end
  local root = build_schema(defaults, "")
  if root.kind ~= "table" then raise("config: the defaults must be a table of keys") end
  local cfg = initial(root)

  -- a mistyped option is the user's command line, not the recipe: the host shows it in one line
  local ok, err = pcall(apply_args, root, cfg, argv)
  if not ok then errors.usage(err) end
  schemas[cfg] = root
  return setmetatable(cfg, Config)
end

setmetatable(M, {__call = function(_, defaults, argv) return M.new(defaults, argv) end})

return M
