-- lutra.atomic_file: the Lua side of host/io/atomic_file.c (tests/c/test_atomic_file.c tests the
-- C side): whole files and appends, links planted at the path replaced with their targets left
-- alone, failures returned as nil and a message naming the path and the reason.
local atomic_file = require "lutra.atomic_file"
local T = require "lutra.testing"
local equal = T.assert_equal
local files = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "file_helpers.lua")
local read, write = files.read, files.write

local dir = files.temp_dir()
local outside = files.temp_dir()

local function is_link(path)
  local p = io.popen("test -L '" .. path .. "' && echo link")
  local s = p:read("*a")
  p:close()
  return s == "link\n"
end

test("write: the whole text lands by a rename; a planted link is replaced, its target untouched", function()
  local path = dir .. "/config.json"
  equal(atomic_file.write(path, "{}\n"), true)
  equal(read(path), "{}\n")
  equal(atomic_file.write(path, "a\0b", {sync_dir = true}), true) -- bytes, NUL included
  equal(read(path), "a\0b")
  write(outside .. "/victim", "precious")
  os.remove(path)
  assert(os.execute("ln -s '" .. outside .. "/victim' '" .. path .. "'"))
  equal(atomic_file.write(path, "mine"), true)
  equal(is_link(path), false)
  equal(read(path), "mine")
  equal(read(outside .. "/victim"), "precious")
  local ok, err = atomic_file.write(dir .. "/no/such/x.json", "x")
  equal(ok, nil)
  equal(err, "cannot write " .. dir .. "/no/such/x.json: cannot create a temporary file in " .. dir
    .. "/no/such: no such file or directory")
  equal(select(2, atomic_file.write(path, 5)), "atomic_file.write: expected a path and a string, got string and number")
  os.remove(path)
end)

test("append: writes go straight to the file; truncate starts it empty; a planted link is not followed", function()
  local path = dir .. "/metrics.jsonl"
  local log = assert(atomic_file.append(path))
  equal(log:write("1", "\n"), true)
  equal(log:flush(), true)
  equal(read(path), "1\n") -- no buffer: on disk before close
  equal(log:close(), true)
  equal(log:close(), true) -- twice is fine
  equal(select(2, log:write("x")), "cannot write " .. path .. ": the file is closed")
  log = assert(atomic_file.append(path))
  log:write(2, "\n")
  log:close()
  equal(read(path), "1\n2\n")
  log = assert(atomic_file.append(path, {truncate = true}))
  log:write("3\n")
  log:close()
  equal(read(path), "3\n")
  os.remove(path)
  write(outside .. "/victim.log", "precious")
  assert(os.execute("ln -s '" .. outside .. "/victim.log' '" .. path .. "'"))
  log = assert(atomic_file.append(path))
  log:write("4\n")
  log:close()
  equal(is_link(path), false)
  equal(read(path), "4\n")
  equal(read(outside .. "/victim.log"), "precious")
  local none, err = atomic_file.append(dir)
  equal(none, nil)
  equal(err, "cannot write " .. dir .. ": it exists and is not a regular file")
  os.remove(path)
end)

test("cleanup", function()
  os.execute("rm -rf '" .. dir .. "' '" .. outside .. "'")
end)
