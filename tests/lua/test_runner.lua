-- run.lua itself: runs registered and returned tests, reports failures with a
-- traceback, ends with "N passed, N failed" and exits 1 on any failure, 77 (ctest's skip)
-- when a test was skipped and none failed. Runs the
-- runner in a child process with the same interpreter (lutra or luajit).
local T = require "lutra.testing"
local equal = T.assert_equal

local interpreter, runner = arg[-1], arg[0]

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Runs the runner on files written from `sources` (with `env`, a "NAME=value ..." prefix);
-- returns its output and exit status.
local function run(sources, env)
  local paths = {}
  for i, src in ipairs(sources) do
    paths[i] = os.tmpname()
    local f = assert(io.open(paths[i], "w"))
    f:write(src)
    f:close()
  end
  local quoted = {}
  for i, p in ipairs(paths) do quoted[i] = sh_quote(p) end
  local cmd = string.format("%s %s %s %s 2>&1; echo \"exit=$?\"", env or "", sh_quote(interpreter), sh_quote(runner),
    table.concat(quoted, " "))
  local p = assert(io.popen(cmd))
  local out = p:read("*a")
  p:close()
  for _, path in ipairs(paths) do os.remove(path) end
  local body, status = out:match("^(.*)exit=(%d+)%s*$")
  return body, tonumber(status)
end

local function last_line(s) return s:match("([^\n]*)\n$") end

test("all passing: exit 0 and the summary line", function()
  local out, status = run {[[
test("one", function() assert(1 + 1 == 2) end)
test("two", function() end)
return {three = function() end}
]]}
  equal(last_line(out), "3 passed, 0 failed")
  equal(status, 0)
end)

test("a failure prints the test's name and traceback and exits 1", function()
  local out, status = run {[[
test("good", function() end)
local function deeper() error("kaboom") end
test("bad", function() deeper() end)
]], [[
test("also good", function() end)
]]}
  equal(last_line(out), "2 passed, 1 failed")
  equal(status, 1)
  assert(out:find("FAIL", 1, true) and out:find(": bad", 1, true), out)
  assert(out:find("kaboom", 1, true), out)
  assert(out:find("stack traceback", 1, true) and out:find("in function 'deeper'", 1, true), out)
end)

test("a file that does not load counts as a failure", function()
  local out, status = run {"this is not lua", "test('fine', function() end)"}
  equal(last_line(out), "1 passed, 1 failed")
  equal(status, 1)
  assert(out:find("did not load", 1, true), out)
end)

test("each test starts from the same random state", function()
  local out, status = run {[[
local lt = require "lutra"
local first
test("a", function() first = lt.rand(3):tolist() end)
test("b", function() local again = lt.rand(3):tolist(); assert(again[1] == first[1] and again[3] == first[3]) end)
]]}
  equal(last_line(out), "2 passed, 0 failed")
  equal(status, 0)
end)

test("a skipped test is not a pass: counted, its reason printed, exit 77", function()
  local out, status = run {[[
test("runs", function() end)
test("cannot run here", function() skip("no frobnicator") end)
]], [[
local T = require "lutra.testing"
test("through lutra.testing", function() T.skip("no widget") end)
]]}
  equal(last_line(out), "1 passed, 0 failed, 2 skipped")
  equal(status, 77)
  assert(out:find("SKIP  .*: cannot run here: no frobnicator"), out)
  assert(out:find("SKIP  .*: through lutra.testing: no widget"), out)
end)

test("a failure wins over a skip: exit 1", function()
  local out, status = run {[[
test("skipped", function() skip("later") end)
test("broken", function() error("kaboom") end)
]]}
  equal(last_line(out), "0 passed, 1 failed, 1 skipped")
  equal(status, 1)
end)

test("skip at a file's top level skips the whole file", function()
  local out, status = run {[[
skip("needs a GPU")
test("never registered", function() error("must not run") end)
]]}
  equal(last_line(out), "0 passed, 0 failed, 1 skipped")
  equal(status, 77)
  assert(out:find("the whole file: needs a GPU", 1, true), out)
end)

test("need_python: skips without the module; LUTRA_REQUIRE_TORCH=1 makes that a failure", function()
  local src = [[
local T = require "lutra.testing"
test("needs it", function() T.need_python("lutra_no_such_module") end)
]]
  local out, status = run({src}, "LUTRA_REQUIRE_TORCH=0")
  equal(status, 77, out)
  assert(out:find("needs python3 with lutra_no_such_module", 1, true), out)
  out, status = run({src}, "LUTRA_REQUIRE_TORCH=1")
  equal(status, 1, out)
  assert(out:find("FAIL", 1, true) and out:find("LUTRA_REQUIRE_TORCH=1 makes this a failure", 1, true), out)
end)
