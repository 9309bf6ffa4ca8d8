-- recipes/data/fortunes.lua — the default corpus of recipes/pretrain.lua: the English
-- fortune cookies of Debian's `fortunes` package (about 2.3 MB of quotations, poems and
-- jokes; `apt-get install fortunes`), joined into one plain text file. Needs no network
-- beyond Debian's packages.
--
--   lutra recipes/data/fortunes.lua [OUT.txt]            -- writes the corpus
--   local make = dofile("recipes/data/fortunes.lua")     -- as a function: make(out) -> out
--
-- Each cookie is kept as written; the "%" lines between cookies become blank lines. The
-- files are taken in name order (art and ascii-art left out: pictures, not text), so the
-- corpus is the same on every machine with the same package version.
local M = {}

M.DIR = "/usr/share/games/fortunes"
M.SKIP = {art = true, ["ascii-art"] = true}

local function list(dir)
  local p = io.popen("ls -1 '" .. dir .. "' 2>/dev/null")
  if not p then return {} end
  local names = {}
  for name in p:lines() do
    if not name:find("%.") and not M.SKIP[name] then names[#names + 1] = name end
  end
  p:close()
  table.sort(names)
  return names
end

-- Writes the corpus to `out` (unless it is there already and force is not set); returns
-- out, or nil and a message saying what to install.
function M.make(out, force)
  if not force then
    local f = io.open(out, "rb")
    if f then
      local size = f:seek("end")
      f:close()
      if size > 0 then return out end
    end
  end
  local names = list(M.DIR)
  if #names == 0 then
    return nil, "no default corpus: Debian's fortunes package is not installed (apt-get install fortunes, or "
      .. ".ci/install-deps); or give a text file: --data=FILE.txt"
  end
  local dir = out:match("^(.*)/[^/]+$")
  if dir then os.execute("mkdir -p '" .. dir .. "'") end
  local tmp = out .. ".tmp"
  local w = assert(io.open(tmp, "wb"))
  for _, name in ipairs(names) do
    local f = io.open(M.DIR .. "/" .. name, "rb")
    if f then
      for line in f:lines() do
        if line == "%" then w:write("\n") else w:write(line, "\n") end
      end
      f:close()
      w:write("\n")
    end
  end
  w:close()
  assert(os.rename(tmp, out))
  return out
end

if arg and arg[0] and arg[0]:match("fortunes%.lua$") then -- run as a script
  local out = arg[1] or "fortunes.txt"
  local path, err = M.make(out, true)
  if not path then
    io.stderr:write(err, "\n")
    os.exit(1)
  end
  print("wrote " .. path)
end

return setmetatable(M, {__call = function(_, out, force) return M.make(out, force) end})
