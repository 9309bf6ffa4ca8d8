-- lutra.repl — the REPL: reading chunks (multi-line while incomplete), printing values,
-- tab completion, and the debugger: lutra.debug() and --repl-on-error open the same REPL
-- inside a running function's frame, where its locals and upvalues read and assign by name.
-- Line editing, history and Ctrl-C come from the C host (module `lutra.host`); under a
-- plain luajit this module falls back to io.read.
local M = {}

local has_host, host = pcall(require, "lutra.host")
if not has_host then host = nil end

local KEYWORDS = {
  "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if", "in",
  "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
}
local IS_KEYWORD = {}
for _, k in ipairs(KEYWORDS) do IS_KEYWORD[k] = true end

local MAX_TABLE_ITEMS = 40
local MAX_TRACEBACK = 12

local function is_identifier(k)
  return type(k) == "string" and k:match("^[%a_][%w_]*$") ~= nil and not IS_KEYWORD[k]
end

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

-- ---- chunks -----------------------------------------------------------------------------

-- A chunk is incomplete when the parser stopped at the end of the input.
function M.is_incomplete(err) return type(err) == "string" and err:sub(-7) == "'<eof>'" end

-- Compiles src as an expression if it is one, else as statements. Returns fn, is_expr, or
-- nil, err, incomplete. An expression's fn returns its values packed ({n = count, ...}):
-- packing them in a call keeps the chunk's own frame (`return f()` would be a tail call,
-- losing the chunk's line from error messages and tracebacks).
function M.compile(src, env)
  if src:sub(1, 1) == "=" then src = "return " .. src:sub(2) end
  local fn, err_expr = loadstring("return " .. src, "=stdin")
  local is_expr = fn ~= nil
  local err
  if is_expr then
    fn = loadstring("return (function(...) return {n = select('#', ...), ...} end)(" .. src .. "\n)", "=stdin") or fn
  else
    fn, err = loadstring(src, "=stdin")
  end
  if not fn then return nil, err, M.is_incomplete(err) or M.is_incomplete(err_expr) end
  if env then setfenv(fn, env) end
  return fn, is_expr
end

local function frame_text(info)
  local where = info.what == "C" and "[C]" or info.short_src .. (info.currentline > 0 and ":" .. info.currentline or "")
  local what
  if info.what == "main" then what = "in main chunk"
  elseif info.name then what = "in function '" .. info.name .. "'"
  elseif info.what == "C" then what = "?"
  else what = "in function <" .. info.short_src .. ":" .. info.linedefined .. ">" end
  return where .. ": " .. what
end

-- Error text plus the frames between the error and the REPL chunk (none when the chunk
-- itself failed). Runs as the xpcall handler, so the stack is still there.
local function short_traceback(err, chunk)
  local msg = type(err) == "string" and err or repr(err)
  local lines, level, found = {}, 3, false
  while #lines < MAX_TRACEBACK do
    local info = debug.getinfo(level, "Slnf")
    if not info or info.func == xpcall then break end
    lines[#lines + 1] = frame_text(info)
    if info.func == chunk then
      found = true
      break
    end
    level = level + 1
  end
  local first = debug.getinfo(3, "S")
  if #lines == 0 or (found and (#lines == 1 or (#lines == 2 and first.what == "C"))) then return msg end
  return msg .. "\nstack traceback:\n\t" .. table.concat(lines, "\n\t")
end

-- Runs a compiled chunk and prints its values (to stdout) or its error (to stderr).
function M.eval_print(fn, is_expr)
  local function handler(e) return short_traceback(e, fn) end
  local res = {xpcall(fn, handler)}
  local n = table.maxn(res)
  if res[1] and is_expr and type(res[2]) == "table" then
    res = res[2]
    n = res.n
    if n > 0 then io.stdout:write(M.format_values(n, unpack(res, 1, n)), "\n") end
  elseif res[1] then
    if n > 1 then io.stdout:write(M.format_values(n - 1, unpack(res, 2, n)), "\n") end
  else
    io.stderr:write(tostring(res[2]), "\n")
  end
  io.stdout:flush()
  io.stderr:flush()
  return res[1]
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

-- ---- frames: locals and upvalues of a running function, found by stack height ------------
-- A frame is kept as its height (levels from the bottom of the stack), which stays valid
-- however deep the REPL's own calls go.

local function depth() -- levels visible from the caller of depth()
  local n = 1
  while debug.getinfo(n + 2, "l") do n = n + 1 end
  return n
end

local function level_of(height) return depth() - height end -- as seen by level_of's caller

-- (no tail calls below where a level is in play: a tail call drops the caller's frame)
local function frame_info(height, what)
  local info = debug.getinfo(level_of(height), what)
  return info
end

-- Index of the innermost active local called name in the frame, or nil.
local function local_index(level, name)
  local found, i = nil, 1
  while true do
    local n = debug.getlocal(level + 1, i)
    if not n then return found end
    if n == name then found = i end
    i = i + 1
  end
end

local function upvalue_index(func, name)
  local i = 1
  while true do
    local n = debug.getupvalue(func, i)
    if not n then return nil end
    if n == name then return i end
    i = i + 1
  end
end

local function frame_get(height, name)
  local level = level_of(height)
  local i = local_index(level, name)
  if i then return select(2, debug.getlocal(level, i)) end
  local func = debug.getinfo(level, "f").func
  local u = upvalue_index(func, name)
  if u then return select(2, debug.getupvalue(func, u)) end
  return getfenv(func)[name]
end

local function frame_set(height, name, value)
  local level = level_of(height)
  local i = local_index(level, name)
  if i then
    debug.setlocal(level, i, value)
    return
  end
  local func = debug.getinfo(level, "f").func
  local u = upvalue_index(func, name)
  if u then
    debug.setupvalue(func, u, value)
    return
  end
  getfenv(func)[name] = value
end

-- {name = value} and the ordered names of the frame's locals and upvalues.
local function frame_vars(height)
  local level = level_of(height)
  local locals, upvalues = {}, {}
  local i = 1
  while true do
    local n, v = debug.getlocal(level, i)
    if not n then break end
    if n:sub(1, 1) ~= "(" then locals[#locals + 1] = {n, v} end
    i = i + 1
  end
  local func = debug.getinfo(level, "f").func
  i = 1
  while true do
    local n, v = debug.getupvalue(func, i)
    if not n then break end
    upvalues[#upvalues + 1] = {n, v}
    i = i + 1
  end
  return locals, upvalues, getfenv(func)
end

-- The environment REPL chunks run in: names resolve to the frame's locals, then its
-- upvalues, then its globals; assignments go to the same place.
local function frame_env(frame)
  return setmetatable({}, {
    __index = function(_, k)
      if frame.active then return frame_get(frame.height, k) end
      return _G[k]
    end,
    __newindex = function(_, k, v)
      if frame.active then return frame_set(frame.height, k, v) end
      _G[k] = v
    end,
  })
end

local function frame_names(frame)
  local locals, upvalues, fenv = frame_vars(frame.height)
  local names = global_names(fenv)
  for _, p in ipairs(locals) do names[p[1]] = true end
  for _, p in ipairs(upvalues) do names[p[1]] = true end
  for _, k in ipairs(KEYWORDS) do names[k] = true end
  return names
end

local function describe(frame)
  local info = frame_info(frame.height, "Sln")
  local locals, upvalues = frame_vars(frame.height)
  local function names(list)
    local t = {}
    for _, p in ipairs(list) do t[#t + 1] = p[1] end
    return #t > 0 and table.concat(t, ", ") or "(none)"
  end
  return frame_text(info) .. "\n  locals: " .. names(locals) .. "\n  upvalues: " .. names(upvalues)
end

-- Moves toward the callers (dir = -1, ".up") or back (dir = 1), skipping C frames.
local function move(frame, dir, count)
  for _ = 1, count do
    local h = frame.height + dir
    while h >= 1 and h <= frame.top and frame_info(h, "S").what == "C" do h = h + dir end
    if h < 1 or h > frame.top then break end
    frame.height = h
  end
  io.stderr:write(describe(frame), "\n")
end

local function backtrace(frame)
  local lines = {}
  for h = frame.top, 1, -1 do
    local info = frame_info(h, "Sln")
    lines[#lines + 1] = (h == frame.height and "->" or "  ") .. frame_text(info)
  end
  return table.concat(lines, "\n")
end

local function show_vars(frame)
  local locals, upvalues = frame_vars(frame.height)
  local out = {}
  for _, p in ipairs(locals) do out[#out + 1] = "  local " .. p[1] .. " = " .. repr(p[2], true) end
  for _, p in ipairs(upvalues) do out[#out + 1] = "  upvalue " .. p[1] .. " = " .. repr(p[2], true) end
  return #out > 0 and table.concat(out, "\n") or "  (no locals or upvalues)"
end

local DEBUG_HELP = [[
  Lua code runs in the frame: its locals and upvalues read and assign by name.
  .locals        show the frame's locals and upvalues
  .bt            show the stack (-> marks the frame)
  .up [n]        go to the caller;  .down [n]  back toward the stop
  .help          this text
  Ctrl-D         leave the REPL (continue the script, or exit after an error)]]

local function debug_command(frame, line)
  local cmd, n = line:match("^%s*%.(%a+)%s*(%d*)%s*$")
  n = tonumber(n) or 1
  local out
  if cmd == "locals" then out = show_vars(frame)
  elseif cmd == "bt" then out = backtrace(frame)
  elseif cmd == "up" then return move(frame, -1, n)
  elseif cmd == "down" then return move(frame, 1, n)
  elseif cmd == "help" then out = DEBUG_HELP
  else out = "unknown command " .. line .. " (.help lists them)" end
  io.stderr:write(out, "\n")
end

-- ---- the loop ---------------------------------------------------------------------------------

local function read_line(prompt, completer)
  if host then return host.readline(prompt, completer) end
  io.stdout:write(prompt)
  io.stdout:flush()
  return io.read("*l")
end

local function add_history(text)
  if host and M.history_enabled then host.add_history(text) end
end

local function open_history()
  if not host or M.history_enabled ~= nil then return end
  M.history_enabled = false
  if not host.isatty(0) then return end
  local path = os.getenv("LUTRA_HISTORY")
  if path == nil then
    local home = os.getenv("HOME")
    path = home and home .. "/.lutra_history"
  end
  if path and path ~= "" then M.history_enabled = host.history_open(path) == true end
end

-- ctx: env (nil = globals), root_names(), frame (in a debugger), prompt.
local function loop(ctx)
  open_history()
  local interactive = host and host.isatty(0)
  local function completer(line) return M.complete(line, ctx.env, ctx.root_names) end
  local buffer
  while true do
    local line = read_line(buffer and ">> " or ctx.prompt or "> ", completer)
    if line == nil then
      if interactive then io.stdout:write("\n") end
      break
    elseif line == false then
      buffer = nil -- Ctrl-C drops the pending chunk
    elseif not buffer and line:match("^%s*$") then
      -- nothing
    elseif not buffer and ctx.frame and line:match("^%s*%.%a") then
      add_history(line)
      debug_command(ctx.frame, line)
    else
      buffer = buffer and buffer .. "\n" .. line or line
      local fn, is_expr, incomplete = M.compile(buffer, ctx.env)
      if fn or not incomplete then
        add_history(buffer)
        buffer = nil
        if fn then M.eval_print(fn, is_expr) else io.stderr:write(is_expr, "\n") end
      end
    end
  end
  io.stdout:flush()
end

-- The top-level REPL, `lutra` alone or after -i; `lutra` is preloaded as a global.
function M.main(opts)
  opts = opts or {}
  local ok, lt = pcall(require, "lutra")
  if ok then
    rawset(_G, "lutra", lt)
  else
    local msg = tostring(lt)
    local first, rest = msg:match("^([^\n]*)\n?(.*)$")
    local _, more = rest:gsub("[^\n]+", "")
    io.stderr:write("lutra: require \"lutra\" failed (the REPL still works): ", first,
                    more > 0 and " (" .. more .. " more lines: require \"lutra\" to see them)" or "", "\n")
  end
  if opts.banner and host and host.isatty(0) then
    io.stdout:write("lutra ", host.version, " (", jit and jit.version or _VERSION, ")",
                    ok and " -- `lutra` is loaded" or "", "; Ctrl-D exits\n")
  end
  loop {}
end

local function frame_repl(height, banner, prompt)
  local frame = {height = height, top = height, active = true}
  io.stderr:write(banner, describe(frame), "\n  (.help for commands)\n")
  local env = frame_env(frame)
  loop {env = env, frame = frame, prompt = prompt, root_names = function() return frame_names(frame) end}
  frame.active = false
end

-- Opens the REPL in the caller's frame; Ctrl-D continues the script.
function M.debug()
  local height = depth() - 1 -- the caller of debug()
  frame_repl(height, "lutra.debug: Ctrl-D continues. Stopped at ", "debug> ")
end

-- Called by the host's error handler (before the stack unwinds): opens the REPL in the
-- innermost Lua frame of the error.
function M.post_mortem(msg)
  local h, level = depth(), 2
  while true do
    local info = debug.getinfo(level, "S")
    if not info then return end
    if info.what ~= "C" then break end
    level = level + 1
  end
  local _ = msg
  frame_repl(h - level + 1, "post-mortem REPL at the error; Ctrl-D exits. Stopped at ", "debug> ")
end

return M
