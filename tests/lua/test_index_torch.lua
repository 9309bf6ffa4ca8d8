-- The indexing ops against PyTorch: tests/py/ref_index.py runs gather, scatter, scatter_add,
-- index_select, index_add, index_copy, scatter_reduce (sum, mean, amax, amin; with and without
-- x's own values) and masked_fill on odd shapes, x contiguous and transposed,
-- in f32, f64, bf16 and f16, with the gradients of sum(y * gout); the same here must match.
-- Copies (gather, index_select, scatter, index_copy, masked_fill) and their gradients are exact;
-- sums (scatter_add, index_add and the backward of gather / index_select) add in index order with
-- the dtype's rounding after each addition, as torch's CPU loops do, so they are exact too; the
-- tolerance (TOL) leaves one rounding of the dtype for a different order. Skipped without python3
-- and torch (a failure where LUTRA_REQUIRE_TORCH=1).
local lt = require "lutra"
local T = require "lutra.testing"

local TOL = {f64 = 1e-15, f32 = 1e-6, bf16 = 8e-3, f16 = 1e-3} -- relative to the largest value

local here = debug.getinfo(1, "S").source:match("^@(.*)[/\\][^/\\]+$") or "tests/lua"
local SCRIPT = here .. "/../py/ref_index.py"

local function reference() return T.torch_reference(SCRIPT) end

local function parse(path)
  local cases, case = {}, nil
  for line in io.lines(path) do
    local tag, rest = line:match("^(%S+)%s*(.*)$")
    if tag == "case" then
      local name, op, dt, dim, tr = rest:match("^(%S+) (%S+) (%S+) (%S+) (%S+)$")
      case = {name = name, op = op, dtype = dt, dim = tonumber(dim), transpose = tr == "1", t = {}}
      cases[#cases + 1] = case
    elseif tag == "tensor" then
      local w = {}
      for x in rest:gmatch("%S+") do w[#w + 1] = x end
      local key, dt, nd = w[1], w[2], tonumber(w[3])
      local shape, vals = {}, {}
      for d = 1, nd do shape[d] = tonumber(w[3 + d]) end
      for k = 4 + nd, #w do vals[#vals + 1] = dt == "bool" and w[k] == "1" or tonumber(w[k]) end
      case.t[key] = {dtype = dt, shape = shape, vals = vals}
    end
  end
  return cases
end

local function make(spec, dt)
  local t = lt.tensor(spec.vals, {dtype = spec.dtype == "f64" and "f64" or spec.dtype})
  t = t:reshape(spec.shape)
  if spec.dtype == "f64" and dt ~= "f64" then t = t:to(dt) end
  return t
end

-- max |a - b| over max |b|
local function rel_diff(a, b)
  local d = (a:to("f64") - b:to("f64")):abs():max():item()
  local m = b:to("f64"):abs():max():item()
  return d / (m > 0 and m or 1)
end

test("indexing ops match PyTorch: values and gradients, every float dtype", function()
  local path = reference()
  local cases = parse(path)
  os.remove(path)
  assert(#cases >= 144, "ref_index.py wrote " .. #cases .. " cases")
  local worst = {}
  for _, c in ipairs(cases) do
    local dt = c.dtype
    local base = make(c.t.base, dt)
    local x = (c.transpose and base:transpose(-1, -2) or base):detach():requires_grad_()
    local index = c.t.index and make(c.t.index)
    local src = c.t.src and make(c.t.src, dt):requires_grad_()
    local y
    local reduce, include = c.op:match("^scatter_reduce:(%a+):(%d)$")
    if reduce then
      y = x:scatter_reduce(c.dim, index, src, reduce, {include_self = include == "1"})
    elseif c.op == "masked_fill" then
      y = x:masked_fill(make(c.t.mask), -2.5)
    elseif src then
      y = x[c.op](x, c.dim, index, src)
    else
      y = x[c.op](x, c.dim, index)
    end
    (y * make(c.t.gout, dt)):sum():backward()
    local label = c.name .. " " .. dt .. (c.transpose and " transposed" or "")
    for _, pair in ipairs {{"y", y}, {"dx", x.grad}, {"dsrc", src and src.grad}} do
      local want = c.t[pair[1]]
      if want then
        assert(pair[2] ~= nil, label .. ": no " .. pair[1])
        local r = rel_diff(pair[2], make(want, dt))
        worst[dt] = math.max(worst[dt] or 0, r)
        assert(r <= TOL[dt], string.format("%s %s: relative difference %.3g", label, pair[1], r))
      end
    end
  end
  for _, dt in ipairs {"f32", "f64", "bf16", "f16"} do
    print(string.format("  %s: max relative difference %.3g", dt, worst[dt]))
  end
end)
