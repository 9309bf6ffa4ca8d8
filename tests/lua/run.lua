-- run.lua — runs Lua test files.
--
--   lutra tests/lua/run.lua tests/lua/test_tensor.lua [more files...]
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUTRA_LIB=build/liblutra.so luajit tests/lua/run.lua FILE...
--
-- A test file registers its tests with the global `test(name, fn)`; they run in
-- the order registered. (A file may also return a table name -> function; those
-- run after, in name order.) Each test runs in xpcall with a traceback, with the
-- default generator reseeded (lutra.manual_seed(0)) and the testing generator
-- reset, so tests do not depend on each other's draws. Failures print the test's
-- name, the message and the traceback. The last line is exactly "N passed, N
-- failed"; the exit status is 1 when a test failed or a file did not load.
-- Assertions: lutra.testing (assert_close, assert_equal, assert_error, ...).

-- lua/ of this checkout first, so that plain luajit finds the library without LUA_PATH
local script = arg and arg[0] or ""
local here = script:match("^(.*)[/\\]tests[/\\]lua[/\\][^/\\]*$") or (script:match("^tests[/\\]lua[/\\]") and ".")
if here then package.path = here .. "/lua/?.lua;" .. here .. "/lua/?/init.lua;" .. package.path end

local files = {}
for i = 1, arg and #arg or 0 do files[#files + 1] = arg[i] end
if #files == 0 then
  io.stderr:write("usage: run.lua FILE...  (test files that call test(name, fn) or return {name = fn})\n")
  os.exit(2)
end

local passed, failed = 0, 0

local function traceback(err)
  return debug.traceback(tostring(err), 2)
end

local function reset_generators()
  local ok, lt = pcall(require, "lutra")
  if ok then lt.manual_seed(0) end
  local okt, testing = pcall(require, "lutra.testing")
  if okt then testing.seed(0) end
end

local function run_one(file, name, fn)
  reset_generators()
  local t0 = os.clock()
  local ok, err = xpcall(fn, traceback)
  local dt = os.clock() - t0
  if ok then
    passed = passed + 1
    if os.getenv("LUTRA_TEST_VERBOSE") then print(string.format("ok    %s: %s (%.2fs)", file, name, dt)) end
  else
    failed = failed + 1
    print(string.format("FAIL  %s: %s\n%s\n", file, name, err))
  end
end

for _, file in ipairs(files) do
  local registered = {}
  rawset(_G, "test", function(name, fn)
    if type(name) ~= "string" or type(fn) ~= "function" then error("test(name, fn): expected a string and a function", 2) end
    registered[#registered + 1] = {name, fn}
  end)
  local chunk, load_err = loadfile(file)
  local ok, returned = false, load_err
  if chunk then ok, returned = xpcall(chunk, traceback) end
  if not ok then
    failed = failed + 1
    print(string.format("FAIL  %s: the file did not load\n%s\n", file, tostring(returned)))
  else
    for _, t in ipairs(registered) do run_one(file, t[1], t[2]) end
    if type(returned) == "table" then
      local names = {}
      for name, fn in pairs(returned) do
        if type(fn) == "function" then names[#names + 1] = name end
      end
      table.sort(names)
      for _, name in ipairs(names) do run_one(file, name, returned[name]) end
    end
  end
  rawset(_G, "test", nil)
  collectgarbage()
end

print(string.format("%d passed, %d failed", passed, failed))
io.stdout:flush()
os.exit(failed > 0 and 1 or 0)
