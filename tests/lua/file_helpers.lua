-- file_helpers.lua — what the Lua tests that handle files share (not a test file itself): a
-- whole file read or written, and a fresh temporary directory.
--   local files = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "file_helpers.lua")
local M = {}

-- The bytes of the file at path.
function M.read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- Writes the bytes s to path (replacing the file).
function M.write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- A new empty directory under the system's temporary directory; returns its path.
function M.temp_dir()
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p '" .. dir .. "'"))
  return dir
end

return M
