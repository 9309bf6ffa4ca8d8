-- lutra.testing — assertions for tests, as torch.testing: assert_close compares
-- tensors, numbers and nested lists elementwise; assert_error checks that a call
-- fails with a message; a small xorshift generator makes inputs independent of
-- lutra's own random numbers. Failures are raised at the test's line.
local errors = require "lutra.errors"
local atomic_file = require "lutra.atomic_file"
local ops = require "lutra.ops"
local dtype = require "lutra.dtype"
local fields = require "lutra.tensor.fields"

local M = {}

local raise, is_tensor = errors.raise, ops.is_tensor

-- Default tolerances by dtype (torch.testing's), exact for integers and bools.
local TOL = {f32 = {1.3e-6, 1e-5}, f64 = {1e-7, 1e-7}, bf16 = {1.6e-2, 1e-5}, f16 = {1e-3, 1e-5}}

local function shape_of(x)
  local s = {}
  while type(x) == "table" do
    s[#s + 1] = #x
    x = x[1]
  end
  return s
end

local function flat(x, out)
  if type(x) == "table" then
    for i = 1, #x do flat(x[i], out) end
  else
    out[#out + 1] = x
  end
  return out
end

local function index_of(shape, k) -- flat position k (1-based) -> "[i, j]" (0-based)
  local idx, r = {}, k - 1
  for d = #shape, 1, -1 do
    idx[d] = r % shape[d]
    r = math.floor(r / shape[d])
  end
  return "[" .. table.concat(idx, ", ") .. "]"
end

-- assert_close(actual, expected, {rtol=, atol=, equal_nan=true, msg=}): shapes must
-- match; |a - e| <= atol + rtol * |e| elementwise. Booleans compare exactly.
function M.assert_close(actual, expected, opts)
  opts = opts or {}
  local rtol, atol = opts.rtol, opts.atol
  local dt = is_tensor(actual) and actual.dtype or (is_tensor(expected) and expected.dtype)
  local tol = TOL[dt] or {0, 0}
  if not is_tensor(actual) and not is_tensor(expected) then tol = {1.3e-6, 1e-5} end
  rtol, atol = rtol or tol[1], atol or tol[2]
  local prefix = opts.msg and (opts.msg .. ": ") or ""
  if is_tensor(actual) then actual = actual:tolist() end
  if is_tensor(expected) then expected = expected:tolist() end
  local sa, se = shape_of(actual), shape_of(expected)
  if table.concat(sa, ",") ~= table.concat(se, ",") then
    raise(string.format("%sassert_close: shape [%s] differs from the expected [%s]", prefix, table.concat(sa, ", "),
      table.concat(se, ", ")))
  end
  local fa, fe = flat(actual, {}), flat(expected, {})
  for k = 1, #fe do
    local a, e = fa[k], fe[k]
    local ok
    if type(a) == "boolean" or type(e) == "boolean" then
      ok = a == e
    elseif type(a) ~= "number" then
      ok = false
    elseif a ~= a or e ~= e then
      ok = opts.equal_nan ~= false and a ~= a and e ~= e
    elseif a == e then
      ok = true
    else
      ok = math.abs(a - e) <= atol + rtol * math.abs(e)
    end
    if not ok then
      raise(string.format("%sassert_close: at %s got %s, expected %s (rtol %g, atol %g)", prefix, index_of(se, k),
        tostring(a), tostring(e), rtol, atol))
    end
  end
end

-- Deep equality of Lua values (tables compared by contents).
local function equal(a, b)
  if type(a) ~= "table" or type(b) ~= "table" then return a == b end
  for k, v in pairs(a) do if not equal(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end
M.equal = equal

local function show(v)
  if type(v) ~= "table" then return type(v) == "string" and string.format("%q", v) or tostring(v) end
  local parts = {}
  for i = 1, #v do parts[i] = show(v[i]) end
  for k, x in pairs(v) do
    if type(k) ~= "number" or k < 1 or k > #v or k ~= math.floor(k) then parts[#parts + 1] = tostring(k) .. "=" .. show(x) end
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end
M.show = show

function M.assert_equal(actual, expected, msg)
  if not equal(actual, expected) then
    raise(string.format("%sassert_equal: got %s, expected %s", msg and (msg .. ": ") or "", show(actual), show(expected)))
  end
end

-- Runs fn(...) expecting an error whose message contains `fragment` (plain text).
-- Returns the message.
function M.assert_error(fragment, fn, ...)
  local ok, err = pcall(fn, ...)
  if ok then raise("assert_error: expected an error containing '" .. fragment .. "', but the call succeeded") end
  err = tostring(err)
  if not err:find(fragment, 1, true) then
    raise("assert_error: expected an error containing '" .. fragment .. "', got: " .. err)
  end
  return err
end

-- ---- tests that cannot run here ------------------------------------------------------------

-- skip(reason): ends the running test as skipped (at a file's top level: the whole file).
-- tests/lua/run.lua counts it and exits 77, ctest's skip, unless something failed: a test
-- that cannot run is reported as not run, never as passed. The error value is the
-- runner's skip shape, {lutra_skip = reason}.
local SKIP_MT = {__tostring = function(e) return "skipped: " .. e.lutra_skip end}
function M.skip(reason)
  error(setmetatable({lutra_skip = tostring(reason or "no reason given")}, SKIP_MT), 0)
end

local function shell_ok(cmd)
  local r = os.execute(cmd)
  return r == 0 or r == true
end

-- need_python(module): the interpreter that imports `module` ("torch", "json"), from
-- $LUTRA_PYTHON, /usr/bin/python3 and python3 (first that works, remembered). Without one
-- the test is skipped, or fails where LUTRA_REQUIRE_TORCH=1 (CI, which installs
-- python3-torch: there a missing reference must not pass as a skip).
local pythons = {}
function M.need_python(module)
  module = module or "torch"
  if pythons[module] then return pythons[module] end
  local tried = {}
  for _, py in ipairs {os.getenv("LUTRA_PYTHON") or "/usr/bin/python3", "python3"} do
    if not tried[py] then
      tried[#tried + 1], tried[py] = py, true
      if shell_ok(string.format("%s -c 'import %s' >/dev/null 2>&1", py, module)) then
        pythons[module] = py
        return py
      end
    end
  end
  local why = string.format("needs python3 with %s (%s cannot import it; apt-get install python3-torch)", module,
                            table.concat(tried, ", "))
  local req = os.getenv("LUTRA_REQUIRE_TORCH")
  if req and req ~= "" and req ~= "0" then raise(why .. "; LUTRA_REQUIRE_TORCH=1 makes this a failure") end
  M.skip(why)
end

-- torch_reference(script, ...) -> the path of the file that `python3 script OUT ...` wrote (the
-- interpreter of need_python("torch"); skipped as that says). A script that fails raises with
-- its exit status and what it printed on stderr.
function M.torch_reference(script, ...)
  local py = M.need_python("torch")
  local out, err = os.tmpname(), os.tmpname()
  local args = {}
  for i, a in ipairs {...} do args[i] = string.format("'%s'", tostring(a)) end
  local ok, _, code = os.execute(string.format("%s '%s' '%s' %s 2>'%s'", py, script, out, table.concat(args, " "), err))
  local f = io.open(err)
  local msg = f and f:read("*a") or ""
  if f then f:close() end
  os.remove(err)
  if ok ~= true and ok ~= 0 then -- LuaJIT: the wait status, or (as 5.2) false, "exit", code
    local status = type(ok) == "number" and (ok >= 256 and math.floor(ok / 256) or ok) or code
    raise(string.format("%s failed (exit %s):\n%s", script, tostring(status), msg))
  end
  return out
end

-- need_gpu(): skips the running file (or test) where there is no GPU to test; a driver that is
-- there but broken fails, and so does no GPU where LUTRA_REQUIRE_GPU=1 (GPU machines), as
-- `lutra selftest` does.
function M.need_gpu()
  local cuda = require "lutra.cuda"
  local availability, status = cuda.availability(), cuda.status()
  local require_gpu = os.getenv("LUTRA_REQUIRE_GPU")
  local required = require_gpu and require_gpu ~= "" and require_gpu ~= "0"
  if availability == "broken" or (availability ~= "ready" and required) then
    raise("no usable GPU (" .. status .. ")" .. (availability == "broken" and "" or " and LUTRA_REQUIRE_GPU=" .. require_gpu))
  end
  if availability ~= "ready" then M.skip("no GPU to test (" .. status .. ")") end
end

-- ---- inputs ------------------------------------------------------------------------------

local state = 88172645463325252ULL

function M.seed(s) state = 88172645463325252ULL + (s or 0) end

-- Uniform in [0, 1) from xorshift64.
function M.uniform()
  local x = state
  x = bit.bxor(x, bit.lshift(x, 13))
  x = bit.bxor(x, bit.rshift(x, 7))
  x = bit.bxor(x, bit.lshift(x, 17))
  state = x
  return tonumber(bit.rshift(x, 11)) / 9007199254740992
end

function M.randint(lo, hi) return lo + math.floor(M.uniform() * (hi - lo)) end

-- Nested lists of the given shape (a list of sizes) holding gen() values
-- (default: uniform in [-1, 1)).
function M.random_list(shape, gen)
  gen = gen or function() return M.uniform() * 2 - 1 end
  local function build(d)
    if d > #shape then return gen() end
    local l = {}
    for i = 1, shape[d] do l[i] = build(d + 1) end
    return l
  end
  return build(1)
end

-- An f64 leaf tensor that requires grad, filled from the testing generator; with
-- noncontig (and 2+ dims) it is a permuted view of a tensor laid out in reverse dim order.
function M.random_leaf(shape, noncontig)
  local lt = require "lutra"
  local t
  if noncontig and #shape >= 2 then
    local rev, dims = {}, {}
    for i = #shape, 1, -1 do
      rev[#rev + 1] = shape[i]
      dims[#dims + 1] = i - 1
    end
    t = lt.tensor(M.random_list(rev), {dtype = "f64"}):permute(dims)
  else
    t = lt.tensor(M.random_list(shape), {dtype = "f64"})
  end
  return t:requires_grad_()
end

-- Applies fn to every leaf of nested lists (several lists of one shape).
function M.map(fn, a, ...)
  if type(a) ~= "table" then return fn(a, ...) end
  local out, rest = {}, {...}
  for i = 1, #a do
    local args = {}
    for k = 1, #rest do args[k] = rest[k][i] end
    out[i] = M.map(fn, a[i], unpack(args, 1, #rest))
  end
  return out
end

-- ---- gradient checks -------------------------------------------------------------------

-- gradcheck(fn, inputs, {eps=, atol=, rtol=, msg=}): lt.gradcheck (lutra.gradcheck) on the inputs
-- as given (f64 in tests: no cast), raising with the worst element. Returns true.
function M.gradcheck(fn, inputs, opts)
  local o = {cast = false}
  for k, v in pairs(opts or {}) do o[k] = v end
  require "lutra.gradcheck"(fn, inputs, o)
  return true
end

-- Rounds v as f32 does (for building f32 references from doubles).
local ffi = require "ffi"
local f32 = ffi.new("float[1]")
function M.f32(v)
  f32[0] = v
  return f32[0]
end

-- Writes a text of n words drawn from `words` by a fixed linear congruential sequence from
-- seed (the same text on every machine and rank): corpora for tests and benchmarks.
-- Returns path.
function M.word_corpus(path, words, n, seed)
  local parts, x = {}, seed
  for i = 1, n do
    x = (x * 1103515245 + 12345) % 2147483648
    parts[i] = words[x % #words + 1]
  end
  assert(atomic_file.write(path, table.concat(parts, " ")))
  return path
end

return M
