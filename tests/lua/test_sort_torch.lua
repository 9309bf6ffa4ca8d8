-- topk, sort, argsort, cumsum, cumprod, tril, triu, logsumexp, nan_to_num and isnan against
-- PyTorch: tests/py/ref_sort.py runs each on odd shapes, transposed (non-contiguous) inputs and
-- every float dtype torch 1.13 runs on the CPU, with a given gradient for the first result;
-- here the same inputs must give the same values, indices and input gradients. Sorted values,
-- indices, tril/triu and nan_to_num are exact; sums and products within the tolerances below
-- (of the largest magnitude). Skipped without python3 and torch (a failure where
-- LUTRA_REQUIRE_TORCH=1). LUTRA_PYTHON names the interpreter (default /usr/bin/python3).
local lt = require "lutra"
local T = require "lutra.testing"

local here = debug.getinfo(1, "S").source:match("^@(.*)[/\\][^/\\]+$") or "tests/lua"
local SCRIPT = here .. "/../py/ref_sort.py"
-- relative to the largest magnitude of torch's result: the dtype's rounding of a few steps
local TOL = {f64 = 1e-12, f32 = 2e-6, bf16 = 1.6e-2, f16 = 2e-3}
local EXACT = {topk = true, sort = true, argsort = true, tril = true, triu = true, nan_to_num = true, isnan = true}

local function number(w)
  if w == "nan" or w == "-nan" then return 0 / 0 end
  if w == "inf" then return math.huge end
  if w == "-inf" then return -math.huge end
  return tonumber(w)
end

local function parse(path)
  local cases, case = {}, nil
  for ln in io.lines(path) do
    local tag, rest = ln:match("^(%S+)%s*(.*)$")
    if tag == "case" then
      local name, op, dt, tr, args = rest:match("^(%S+) (%S+) (%S+) (%d) ?(.*)$")
      case = {name = name, op = op, dtype = dt, transpose = tr == "1", args = {}}
      for k, v in args:gmatch("(%w+)=(%-?%d+)") do case.args[k] = tonumber(v) end
    elseif tag == "end" then
      cases[#cases + 1] = case
    else
      local l = {}
      for w in rest:gmatch("%S+") do l[#l + 1] = number(w) end
      case[tag] = l
    end
  end
  return cases
end

local function run(case, x)
  local a = case.args
  local op = case.op
  if op == "topk" then return x:topk(a.k, a.dim, a.largest == 1) end
  if op == "sort" then return x:sort(a.dim, a.descending == 1) end
  if op == "argsort" then return nil, x:argsort(a.dim, a.descending == 1) end
  if op == "cumsum" or op == "cumprod" then return x[op](x, a.dim) end
  if op == "tril" or op == "triu" then return x[op](x, a.diagonal) end
  if op == "logsumexp" then return x:logsumexp(a.dim, a.keepdim == 1) end
  if op == "nan_to_num" then return x:nan_to_num() end
  if op == "isnan" then return nil, x:isnan():to("i64") end
  error("unknown op " .. op)
end

local function flat(t)
  local l = t:contiguous():view(-1):to(t.dtype == "i64" and "i64" or "f64"):tolist()
  return l
end

-- max |got - want| over the largest |want|; NaN must meet NaN
local function rel_diff(what, got, want)
  T.assert_equal(#got, #want, what .. ": element count")
  local worst, big = 0, 0
  for i = 1, #want do
    local g, w = got[i], want[i]
    if w ~= w or g ~= g then
      if not (w ~= w and g ~= g) then error(string.format("%s[%d]: got %s, torch %s", what, i - 1, g, w)) end
    elseif w == math.huge or w == -math.huge or g == math.huge or g == -math.huge then
      if g ~= w then error(string.format("%s[%d]: got %s, torch %s", what, i - 1, g, w)) end
    else
      worst, big = math.max(worst, math.abs(g - w)), math.max(big, math.abs(w))
    end
  end
  return worst / math.max(big, 1e-300)
end

local worst = {}

test("the ops along a dim match torch: values, indices and gradients, every float dtype", function()
  local py = T.need_python("torch")
  local path = os.tmpname()
  local err = os.tmpname()
  local ok = os.execute(string.format("%s '%s' %s 2>%s", py, SCRIPT, path, err))
  if not (ok == 0 or ok == true) then
    local f = io.open(err)
    error(SCRIPT .. " failed:\n" .. (f and f:read("*a") or ""))
  end
  os.remove(err)
  local cases = parse(path)
  os.remove(path)
  T.assert_equal(#cases >= 60, true, "torch gave the reference cases")
  for _, case in ipairs(cases) do
    local label = case.name .. " " .. case.dtype
    local base = lt.tensor(case.x, {dtype = "f64"}):view(case.shape):to(case.dtype)
    local leaf = base:requires_grad_(case.gout ~= nil)
    local x = case.transpose and leaf:transpose(0, 1) or leaf
    local values, indices = run(case, x)
    local key = case.op .. " " .. case.dtype
    if case.values then
      worst[key] = worst[key] or {0, 0}
      local d = rel_diff(label .. " values", flat(values), case.values)
      local g = lt.tensor(case.gout, {dtype = "f64"}):view(values.shape):to(case.dtype)
      values:backward(g)
      local dg = rel_diff(label .. " grad", flat(leaf.grad), case.grad)
      local tol = EXACT[case.op] and 0 or TOL[case.dtype]
      if not (d <= tol and dg <= math.max(tol, EXACT[case.op] and 0 or tol)) then
        error(string.format("%s: values differ by %.3g, gradients by %.3g (tolerance %g)", label, d, dg, tol))
      end
      worst[key] = {math.max(worst[key][1], d), math.max(worst[key][2], dg)}
    end
    if case.indices then T.assert_equal(flat(indices), case.indices, label .. " indices") end
  end
  local keys = {}
  for k in pairs(worst) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do -- the largest relative differences (argsort, isnan: indices, equal above)
    io.write(string.format("  %-20s values %.3g  grad %.3g\n", k, worst[k][1], worst[k][2]))
  end
end)
