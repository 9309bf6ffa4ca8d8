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
-- failed" (", N skipped" added when a test was skipped).
--
-- A test that cannot run here (no PyTorch, no GPU) calls the global `skip(reason)`
-- (lutra.testing.skip is the same; lutra.testing.need_python skips where python3 lacks a
-- module); at a file's top level, skip(reason) skips the whole file. A skip is not a pass:
-- the exit status is 1 when a test failed or a file did not load, else 77 (ctest's
-- SKIP_RETURN_CODE) when a test was skipped, else 0.
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

local passed, failed, skipped = 0, 0, 0

-- A skip is an error whose value is this table; lutra.testing.skip raises the same shape
-- (the runner does not load lutra, so that it runs its own tests with plain luajit).
local function is_skip(err) return type(err) == "table" and type(err.lutra_skip) == "string" end
local SKIP_MT = {__tostring = function(e) return "skipped: " .. e.lutra_skip end}
local function skip(reason)
  error(setmetatable({lutra_skip = tostring(reason or "no reason given")}, SKIP_MT), 0)
end

local function traceback(err)
  if is_skip(err) then return err end
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
  elseif is_skip(err) then
    skipped = skipped + 1
    print(string.format("SKIP  %s: %s: %s", file, name, err.lutra_skip))
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
  rawset(_G, "skip", skip)
  local chunk, load_err = loadfile(file)
  local ok, returned = false, load_err
  if chunk then ok, returned = xpcall(chunk, traceback) end
  if not ok and is_skip(returned) then
    skipped = skipped + 1
    print(string.format("SKIP  %s: the whole file: %s", file, returned.lutra_skip))
  elseif not ok then
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
  rawset(_G, "skip", nil)
  collectgarbage()
end

print(string.format("%d passed, %d failed", passed, failed) .. (skipped > 0 and string.format(", %d skipped", skipped) or ""))
io.stdout:flush()
os.exit(failed > 0 and 1 or skipped > 0 and 77 or 0)
