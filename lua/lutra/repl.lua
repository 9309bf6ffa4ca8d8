-- lutra.repl — the REPL: reads chunks (multi-line while incomplete), evaluates them and
-- prints the values (lutra.cli formats values and computes completions). Its debugger:
-- lutra.debug() and --repl-on-error open the same REPL inside a running function's frame,
-- where that function's locals and upvalues read and assign by name.
-- Line editing, history and Ctrl-C come from the C host (module `lutra.host`); under a
-- plain luajit this module falls back to io.read.
local M = {}

local has_host, host = pcall(require, "lutra.host")
if not has_host then host = nil end
local cli = require "lutra.cli"
local repr, KEYWORDS = cli.repr, cli.KEYWORDS
M.repr, M.format_values, M.complete = cli.repr, cli.format_values, cli.complete

local MAX_TRACEBACK = 12

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

-- Runs a compiled chunk and prints its values (to `out`, default stdout) or its error
-- (to stderr).
function M.eval_print(fn, is_expr, out)
  out = out or io.stdout
  local function handler(e) return short_traceback(e, fn) end
  local res = {xpcall(fn, handler)}
  local n = table.maxn(res)
  if res[1] and is_expr and type(res[2]) == "table" then
    res = res[2]
    n = res.n
    if n > 0 then out:write(cli.format_values(n, unpack(res, 1, n)), "\n") end
  elseif res[1] then
    if n > 1 then out:write(cli.format_values(n - 1, unpack(res, 2, n)), "\n") end
  else
    io.stderr:write(tostring(res[2]), "\n")
  end
  out:flush()
  io.stderr:flush()
  return res[1]
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
  local names = cli.global_names(fenv)
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
  .help          this text (help() lists the REPL's other commands)
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

-- echo: show the prompt even off a terminal (a terminal lent by `lutra launch`)
local function read_line(prompt, completer, echo)
  if echo then
    io.stdout:write(prompt)
    io.stdout:flush()
  end
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

-- ctx: env (nil = globals), root_names(), frame (in a debugger), prompt, echo (show it).
local function loop(ctx)
  open_history()
  local interactive = host and host.isatty(0)
  -- with stdout redirected (`lutra train.lua | tee log`) but a terminal on stderr, the
  -- REPL talks on stderr (readline puts its prompt there too)
  local out = interactive and not host.isatty(1) and host.isatty(2) and io.stderr or io.stdout
  local function completer(line) return M.complete(line, ctx.env, ctx.root_names) end
  local buffer
  while true do
    local line = read_line(buffer and ">> " or ctx.prompt or "> ", completer, ctx.echo and not interactive)
    if line == nil then
      if interactive then out:write("\n") end
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
        if fn then M.eval_print(fn, is_expr, out) else io.stderr:write(is_expr, "\n") end
      end
    end
  end
  io.stdout:flush()
end

-- The read-eval-print loop over one context {prompt = , env = , ...}; lutra.shell runs the top-level one.
M.loop = loop
M.host = has_host and host or nil

-- ---- help() ----------------------------------------------------------------------------------

local REPL_HELP = [[
The lutra REPL: Lua, with the library loaded as `lutra`.
  expression         prints its values (`=expr` too)
  statements         run; a chunk left open continues on the next line (>> prompt)
  TAB                completes names, fields and tensor methods
  Ctrl-C             drops the line being typed, or interrupts running code
  Ctrl-D             leaves the REPL (after `lutra -i script.lua` or an error: exits)
  help(x)            x's documentation, where the reference has it
In lutra.debug() and the post-mortem REPL (--repl-on-error), code runs in the stopped frame:
  its locals and upvalues read and assign by name, and
  .locals  .bt  .up [n]  .down [n]  .help   show the frame, the stack, and move along it
`lutra -i script.lua` keeps the script's main-chunk locals; history: ~/.lutra_history
(LUTRA_HISTORY).]]

-- Functions x -> documentation text or nil, asked in turn by help(x); lutra.doc (the sources'
-- doc comments, as in docs/api.md) is the last one asked.
M.doc_finders = {}
local function find_doc(x)
  local ok, doc = pcall(require, "lutra.doc")
  return ok and doc.find(x) or nil
end

-- help(): the REPL's commands; help(x): x's documentation from the first finder that has it.
function M.help(x)
  if x == nil then
    io.stdout:write(REPL_HELP, "\n")
    return
  end
  for i = 1, #M.doc_finders + 1 do
    local ok, text = pcall(M.doc_finders[i] or find_doc, x)
    if ok and text then
      io.stdout:write(text, "\n")
      return
    end
  end
  io.stdout:write("help: no documentation for ", repr(x), " (help() shows the REPL's commands)\n")
end

-- help as a global while a REPL is open, unless the program has its own.
function M.install_help()
  if rawget(_G, "help") == nil then rawset(_G, "help", M.help) end
end

-- ---- ranks: the prompt says which one; lutra.debug{rank = r} stops one, the others wait ------

-- This process's place in the world: lutra.dist.comm's when it is up, else the launcher's
-- environment (world of 1 without one).
function M.world()
  local ok, device = pcall(require, "lutra.dist.device")
  if not ok then return 0, 1 end
  return device.world_rank(), device.world_size()
end

-- The prompt, with the rank in a world of more than one: "debug> " -> "debug[rank 1]> ",
-- "> " -> "lutra[rank 1]> ".
function M.prompt(base)
  local rank, size = M.world()
  if size <= 1 then return base end
  local name = base:match("^(.-)> $")
  return (name ~= "" and name or "lutra") .. "[rank " .. rank .. "]> "
end

-- Under `lutra launch` the terminal is the launcher's: the REPL borrows it for its time
-- (lutra.dist.console; ranks take turns).
local function frame_repl(height, top, banner, prompt)
  M.install_help()
  local frame = {height = height, top = top, active = true}
  io.stderr:write(banner, describe(frame), "\n  (.help for commands)\n")
  io.stderr:flush()
  local env = frame_env(frame)
  local ok, console = pcall(require, "lutra.dist.console")
  local give_back, echo
  if ok then give_back, echo = console.attach(M.world()) end
  local ran, err = pcall(loop, {env = env, frame = frame, prompt = prompt, echo = echo,
                                root_names = function() return frame_names(frame) end})
  frame.active = false
  if give_back then give_back() end
  if not ran then error(err, 0) end
end

-- Opens the REPL in the caller's frame; Ctrl-D continues the script. With {rank = r} every
-- rank of the world must call it: rank r opens the REPL, the others wait in a world barrier
-- with their watchdog off (comm.hold), and all go on together when the REPL ends.
-- (The REPL reads stdin: `lutra launch` lends its terminal to whichever rank's REPL is open;
-- mpirun alone gives stdin to rank 0 only, unless given --stdin r.)
function M.debug(opts)
  local height = depth() - 1 -- the caller of debug()
  if opts ~= nil and type(opts) ~= "table" then
    error("lutra.debug: expected nothing or {rank = r}, got " .. type(opts), 2)
  end
  local want = opts and opts.rank
  if want == nil then
    local rank, size = M.world()
    if size <= 1 then
      frame_repl(height, height, "lutra.debug: Ctrl-D continues. Stopped at ", "debug> ")
      return
    end
    -- this rank alone: its watchdog is off while the REPL is open (and under `lutra launch`
    -- the hold file holds the others', as long as no other rank ends a hold meanwhile)
    local comm = require "lutra.dist.comm"
    comm.hold(frame_repl, height, height, "lutra.debug on rank " .. rank .. ": Ctrl-D continues. Stopped at ",
              M.prompt("debug> "))
    return
  end
  if type(want) ~= "number" or want < 0 or want ~= math.floor(want) then
    error("lutra.debug: rank must be a non-negative integer, got " .. tostring(want), 2)
  end
  local comm = require "lutra.dist.comm"
  local world = comm.init()
  local rank, size = comm.rank(), comm.size()
  if want >= size then error(string.format("lutra.debug: rank %d is not in the world of %d", want, size), 2) end
  if size == 1 then
    frame_repl(height, height, "lutra.debug: Ctrl-D continues. Stopped at ", "debug> ")
    return
  end
  if rank == want then
    comm.hold(function()
      frame_repl(height, height, string.format("lutra.debug on rank %d of %d (the others wait): Ctrl-D continues all. "
        .. "Stopped at ", rank, size), M.prompt("debug> "))
      world:barrier()
    end)
  else
    comm.hold(function() world:barrier() end)
  end
end

-- ---- `lutra -i script.lua`: the script's main-chunk locals, kept for the REPL after it -------

-- Keeps (in M.kept_locals) the locals in scope in the outermost main chunk on the stack, the
-- script's: the host calls it at the script's end (a call it appends to the script's text)
-- and, when the script fails, from its error handler before the stack unwinds.
function M.keep_locals()
  local level, main = 2, nil
  while true do
    local info = debug.getinfo(level, "S")
    if not info then break end
    if info.what == "main" then main = level end
    level = level + 1
  end
  if not main then return end
  local kept, i = {}, 1
  while true do
    local name, value = debug.getlocal(main, i)
    if not name then break end
    if name:sub(1, 1) ~= "(" then kept[name] = value end -- a later local shadows an earlier one
    i = i + 1
  end
  M.kept_locals = kept
end

-- Files of the lutra library: an error raised inside it opens at the caller's frame.
local LIBRARY_PREFIX = debug.getinfo(1, "S").source:match("^(@.*[/\\])[^/\\]+$")

local function in_library(info)
  return LIBRARY_PREFIX ~= nil and info.source:sub(1, #LIBRARY_PREFIX) == LIBRARY_PREFIX
end

-- Called by the host's error handler (before the stack unwinds): opens the REPL in the
-- innermost Lua frame of the error, or in the innermost one outside the lutra library
-- when the library raised it (.down then reaches the library's frames).
-- handler: the Lua error handler that called post_mortem (lutra.errors.pcall's): the REPL opens
-- in a frame above it.
function M.post_mortem(msg, handler)
  local _ = msg -- the handler has printed it already
  -- LuaJIT marks the state as handling an error while a handler runs: the first handler called
  -- meanwhile (the REPL's own xpcall) would fail with "error in error handling". An error
  -- caught by a plain pcall clears the mark.
  pcall(error, "")
  local h, level = depth(), 2
  if handler then
    while true do
      local info = debug.getinfo(level, "f")
      if not info then return end
      level = level + 1
      if info.func == handler then break end
    end
  end
  local innermost, user
  while true do
    local info = debug.getinfo(level, "S")
    if not info then break end
    if info.what ~= "C" then
      innermost = innermost or level
      if not in_library(info) then
        user = level
        break
      end
    end
    level = level + 1
  end
  if not innermost then return end
  local rank, size = M.world()
  local banner = "post-mortem REPL at the error; Ctrl-D exits. Stopped at "
  if size > 1 then
    -- under `lutra launch --repl-on-error`: the hold file keeps the other ranks' watchdogs
    -- from ending the job while this REPL is open; leaving it exits non-zero, and mpirun
    -- then stops the others
    local hold = os.getenv("LUTRA_HOLD_FILE")
    local f = hold and hold ~= "" and io.open(hold, "w")
    if f then
      f:write(rank, "\n")
      f:close()
    end
    banner = string.format("lutra: rank %d of %d failed (the error above)%s.\npost-mortem REPL on rank %d; "
      .. "Ctrl-D ends the job. Stopped at ", rank, size, f and "; the other ranks are held" or "", rank)
  end
  frame_repl(h - (user or innermost) + 1, h - innermost + 1, banner, M.prompt("debug> "))
end

return M
