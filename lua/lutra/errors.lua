-- lutra.errors — turns C status codes and bad arguments into Lua errors that point
-- at the user's line.
--
-- raise() walks up the stack past every frame of lutra's own files (and C frames
-- such as pcall) and reports the error at the first frame of the caller's code,
-- so `a + b` with mismatched shapes fails with "recipe.lua:12: add: ...", whatever
-- depth of lutra functions sits between the user's line and the C call.
local lt = require "lutra.ffi"
local fields = require "lutra.tensor.fields"
local ffi, C = lt.ffi, lt.C

local M = {}

local getinfo, error, sub = debug.getinfo, error, string.sub

-- Every module under lua/lutra/ (this file's directory, nested ones included).
local library_prefix = debug.getinfo(1, "S").source:match("^(@.*[/\\])[^/\\]+$") or "@lutra/"
local prefix_len = #library_prefix
M.library_prefix = library_prefix

-- The stack level (as seen by raise) of the first frame outside lutra.
local function user_level()
  local level = 3 -- 1 is user_level, 2 is raise
  while true do
    local info = getinfo(level, "S")
    if not info then return 2 end -- all library code: report at the innermost caller
    if info.what ~= "C" and sub(info.source, 1, prefix_len) ~= library_prefix then return level - 1 end
    level = level + 1
  end
end

-- Raises msg at the user's line.
function M.raise(msg)
  error(msg, user_level())
end

-- Raises the C library's last error at the user's line. A tensor whose storage is
-- gone was freed from Lua (free(), tidy()): Lua never hands out undefined tensors.
function M.fail()
  local msg = ffi.string(C.lt_last_error())
  msg = msg:gsub("(%S+) is undefined %(freed, or never allocated%)", function(what)
    return (what == "tensor" and "" or what .. " ") .. "tensor was freed (by free() or lutra.tidy)"
  end)
  error(msg, user_level())
end

-- Raises when t's storage was freed; `op` names the operation.
function M.check_alive(t, op)
  if fields.is_freed(t) then error(op .. ": tensor was freed (by free() or lutra.tidy)", user_level()) end
end

-- Argument checks for the places where a wrong type would otherwise reach the FFI,
-- whose conversion error would point inside lutra.
local Tensor = ffi.typeof("lt_tensor")
local istype, floor = ffi.istype, math.floor

function M.tensor_arg(op, x, what)
  if type(x) ~= "cdata" or not istype(Tensor, x) then
    error(string.format("%s: %s must be a tensor, got %s", op, what, type(x)), user_level())
  end
  return x
end

-- An integer (nil allowed when `optional`).
function M.int_arg(op, v, what, optional)
  if v == nil and optional then return v end
  if type(v) ~= "number" or v ~= floor(v) then
    error(string.format("%s: %s must be an integer, got %s", op, what, v == nil and "nothing" or tostring(v)), user_level())
  end
  return v
end

-- Messages of errors in what the user typed (a recipe's command-line options): the host prints
-- such a message alone, without a traceback or the post-mortem REPL.
M.usage_errors = {}

-- Raises msg (already positioned) as a usage error.
function M.usage(msg)
  M.usage_errors[msg] = true
  error(msg, 0)
end

-- ---- pcall that leaves the raising frame to the post-mortem ----------------------------------
-- Under --repl-on-error the host sets lutra.host.repl_on_error. The library's own pcalls that
-- clean up and raise again (tidy, grad mode, the trainer's loop, autograd's backward) go
-- through M.pcall: its handler runs before the stack unwinds, so the post-mortem REPL opens at
-- the frame that raised, with its locals, not at the library's re-raise. It opens only when
-- nothing but such pcalls stands between the error and the host: a plain pcall or xpcall on
-- the stack (a recipe's, or the REPL's own) catches the error, and the REPL stays shut.

local guarded_pcall

-- Whether a pcall or xpcall other than M.pcall's stands above the handler (level 3 up).
local function caught_above()
  local level = 3
  while true do
    local info = getinfo(level, "f")
    if not info then return false end
    local f = info.func
    if f == pcall then return true end
    if f == xpcall then
      local caller = getinfo(level + 1, "f")
      if not caller or caller.func ~= guarded_pcall then return true end
    end
    level = level + 1
  end
end

local function on_error(e)
  local host = package.loaded["lutra.host"]
  if type(host) ~= "table" or not host.repl_on_error or not host.post_mortem or caught_above() then return e end
  host.repl_on_error = false -- one post-mortem; an error inside it must not open another
  host.error_reported = true -- the host does not print the message again
  io.stderr:write(debug.traceback(type(e) == "string" and e or tostring(e), 2), "\n")
  io.stderr:flush()
  -- the host's entry to lutra.repl.post_mortem (the REPL sits above this module)
  local ok, err = pcall(host.post_mortem, e, on_error)
  if not ok then io.stderr:write("lutra: post-mortem REPL failed: ", tostring(err), "\n") end
  return e
end

local function pass(...) return ... end

-- As pcall(fn, ...); under --repl-on-error an error that nothing else catches opens the
-- post-mortem REPL at the frame that raised it before this returns false, err.
function M.pcall(fn, ...)
  return pass(xpcall(fn, on_error, ...)) -- not a tail call of xpcall: caught_above sees this frame
end
guarded_pcall = M.pcall

-- Runs fn(...) with tbl[key] = value and puts the old value back whether fn returns or raises;
-- returns what fn returns (a mode switch: grad mode, autocast, a wrapper's no_sync).
function M.with_field(tbl, key, value, fn, ...)
  local before = tbl[key]
  tbl[key] = value
  local res = {M.pcall(fn, ...)}
  tbl[key] = before
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

return M
