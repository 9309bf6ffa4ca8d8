-- lutra.shell — the top-level REPL, `lutra` alone or after -i, with `lutra` preloaded as a global.
-- It sits above the library (it requires lutra); lutra.repl below it is the loop and the debugger
-- that lutra.debug and --repl-on-error open inside a running program.
local repl = require "lutra.repl"
local cli = require "lutra.cli"

local M = {}

-- opts.banner: print the version line first (on a terminal).
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
  if opts.banner and repl.host and repl.host.isatty(0) then
    io.stdout:write("lutra ", repl.host.version, " (", jit and jit.version or _VERSION, ")",
                    ok and " -- `lutra` is loaded" or "", "; Ctrl-D exits\n")
  end
  repl.install_help()
  local env, root_names = nil, nil
  local kept = repl.kept_locals -- after `lutra -i script.lua`: the script's locals come first
  if kept then
    env = setmetatable(kept, {__index = _G, __newindex = _G})
    root_names = function()
      local names = cli.global_names(_G)
      for k in pairs(kept) do names[k] = true end
      for _, k in ipairs(cli.KEYWORDS) do names[k] = true end
      return names
    end
  end
  repl.loop {prompt = repl.prompt("> "), env = env, root_names = root_names}
end

return M
