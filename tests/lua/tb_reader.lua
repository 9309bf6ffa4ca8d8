-- tb_reader.lua — TensorBoard's own readers for the Lua tests (not a test file itself): the venv
-- tests/py/tb_venv.sh makes under the build directory (tensorboard from PyPI), and
-- tests/py/tb_read.py's report of an events directory. A test skips (ctest's skip) only when pip
-- cannot install tensorboard here.
--   local tb_read = dofile(here .. "tb_reader.lua").read   -- tb_read(dir) or tb_read("--records", file)
local json = require "lutra.json"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/"
local files = dofile(here .. "file_helpers.lua")
local root = here .. "../../"

local M = {}

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- The venv's python (made once); nil with the reason when pip cannot install tensorboard here.
local python, python_why
local function need_tensorboard()
  if python then return python end
  if python_why then require("lutra.testing").skip(python_why) end
  local venv = (os.getenv("LUTRA_BUILD_DIR") or root .. "build") .. "/venv-tb"
  local out, err = os.tmpname(), os.tmpname()
  local ok, _, code = os.execute(string.format("bash %s %s >%s 2>%s", sh_quote(root .. "tests/py/tb_venv.sh"),
                                               sh_quote(venv), out, err))
  local status = ok == true and 0 or type(ok) == "number" and (ok >= 256 and math.floor(ok / 256) or ok) or code
  local said = files.read(err)
  local path = files.read(out):match("^(%S+)")
  os.remove(out)
  os.remove(err)
  if status == 77 then
    python_why = "TensorBoard's reader is not available: " .. said:gsub("%s+$", "")
    require("lutra.testing").skip(python_why)
  end
  if status ~= 0 or not path then error("tests/py/tb_venv.sh failed (exit " .. tostring(status) .. "):\n" .. said) end
  python = path
  return python
end

-- What TensorBoard reads: tb_read.py's JSON, decoded.
function M.read(...)
  local py = need_tensorboard()
  local args = {}
  for i, a in ipairs {...} do args[i] = sh_quote(a) end
  local err = os.tmpname()
  local p = io.popen(string.format("%s %s %s 2>%s", sh_quote(py), sh_quote(root .. "tests/py/tb_read.py"),
                                   table.concat(args, " "), err))
  local text = p:read("*a")
  p:close()
  local said = files.read(err)
  os.remove(err)
  local v = json.try_decode(text)
  if type(v) ~= "table" then error("tests/py/tb_read.py failed:\n" .. said .. text) end
  return v
end

return M
