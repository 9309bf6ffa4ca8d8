-- lutra.commands — the subcommands written in Lua: `lutra launch|ckpt|convert|chat|generate|plot`.
-- host/app/main.c calls main(name, arg) with arg[1..] the words after the command's name;
-- the return value is the exit status. Each command lives in its own module.
local M = {}

M.modules = {
  launch = "lutra.launch",          -- mpirun wrapper: ranks, restarts, --repl-on-error
  ckpt = "lutra.ckpt.cli",           -- ls / inspect a checkpoint directory
  convert = "lutra.ckpt.convert",    -- our checkpoints <-> Hugging Face safetensors
  chat = "lutra.chat",              -- interactive chat with a model directory
  generate = "lutra.chat",          -- one completion of --prompt
  plot = "lutra.plot",              -- loss curves of runs: in the terminal, or as PNG/SVG
}

-- What a failed command prints: a checked error (a bad file, option or value) is its message
-- alone, without the position inside lutra or a traceback, which point at lutra rather than at
-- the input; a Lua runtime error (a bug) keeps both, or LUTRA_TRACEBACK=1 asks for them.
local RUNTIME_ERRORS = {"attempt to ", "bad argument #", "stack overflow", "table index is ", "not enough memory"}
function M.report(err)
  local msg = tostring(err)
  local bug = os.getenv("LUTRA_TRACEBACK") == "1"
  for _, pat in ipairs(RUNTIME_ERRORS) do bug = bug or msg:find(pat, 1, true) ~= nil end
  if bug or type(err) ~= "string" then return debug.traceback(msg, 2) end
  return (msg:gsub("^[^\n]-%.lua:%d+: ", "", 1))
end

function M.main(name, arg)
  local modname = M.modules[name]
  if modname == nil then
    io.stderr:write("lutra: unknown command '", tostring(name), "'\n")
    return 2
  end
  local ok, mod = pcall(require, modname)
  if not ok then
    io.stderr:write("lutra ", name, ": not available in this build (", tostring(mod), ")\n")
    return 1
  end
  local words = {}
  for i = 1, #arg do words[i] = arg[i] end
  local fn = mod.commands and mod.commands[name] or mod.main
  local ok2, status = xpcall(fn, M.report, words, name)
  if not ok2 then
    io.stderr:write("lutra ", name, ": ", tostring(status), "\n")
    return 1
  end
  if type(status) == "number" then return status end
  return status == false and 1 or 0
end

return M
