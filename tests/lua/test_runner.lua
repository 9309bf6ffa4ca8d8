-- run.lua itself: runs registered and returned tests, reports failures with a
-- traceback, ends with "N passed, N failed" and exits 1 on any failure. Runs the
-- runner in a child process with the same interpreter (lutra or luajit).
local T = require "lutra.testing"
local equal = T.assert_equal

local interpreter, runner = arg[-1], arg[0]

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Runs the runner on files written from `sources`; returns its output and exit status.
local function run(sources)
  local paths = {}
  for i, src in ipairs(sources) do
    paths[i] = os.tmpname()
    local f = assert(io.open(paths[i], "w"))
    f:write(src)
    f:close()
  end
  local quoted = {}
  for i, p in ipairs(paths) do quoted[i] = sh_quote(p) end
  local cmd = string.format("%s %s %s 2>&1; echo \"exit=$?\"", sh_quote(interpreter), sh_quote(runner),
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
