-- The activation modules against PyTorch's: tests/py/ref_activation.py runs nn.GELU (exact and
-- tanh), SiLU, ReLU, Tanh, Sigmoid and Identity on odd shapes, x contiguous and transposed, in
-- f32, f64, bf16 and f16, with the gradient of sum(y * gout); the same modules here must match.
-- Both sides compute each element from x in the dtype (bf16/f16 in f32, rounded once: the script
-- runs torch in f32 for them, as torch 2 computes them), so they differ by the libraries' own ulps
-- (erf, exp, tanh within 1-2 ulp): the tolerance (TOL, relative to the largest value) leaves one
-- unit of the 16-bit types for an f32 value on the other side of a rounding boundary, ~8 ulp in
-- f32 and ~45 in f64. GELU's tanh form differs from the exact one by up to 5e-4 of the
-- scale, far outside f32's and f64's tolerances. Skipped without python3 and torch (a failure
-- where LUTRA_REQUIRE_TORCH=1).
local lt = require "lutra"
local nn = lt.nn
local T = require "lutra.testing"

local TOL = {f64 = 1e-14, f32 = 1e-6, bf16 = 8e-3, f16 = 1e-3}

local here = debug.getinfo(1, "S").source:match("^@(.*)[/\\][^/\\]+$") or "tests/lua"
local SCRIPT = here .. "/../py/ref_activation.py"

local MODULES = {
  gelu = function() return nn.GELU() end,
  gelu_tanh = function() return nn.GELU{approximate = "tanh"} end,
  silu = nn.SiLU, relu = nn.ReLU, tanh = nn.Tanh, sigmoid = nn.Sigmoid, identity = nn.Identity,
}

local function reference() return T.torch_reference(SCRIPT) end

local function parse(path)
  local cases, case = {}, nil
  for line in io.lines(path) do
    local tag, rest = line:match("^(%S+)%s*(.*)$")
    if tag == "case" then
      local name, dt, tr = rest:match("^(%S+) (%S+) (%S+)$")
      case = {name = name, dtype = dt, transpose = tr == "1", t = {}}
      cases[#cases + 1] = case
    elseif tag == "tensor" then
      local w = {}
      for x in rest:gmatch("%S+") do w[#w + 1] = x end
      local nd = tonumber(w[3])
      local shape, vals = {}, {}
      for d = 1, nd do shape[d] = tonumber(w[3 + d]) end
      for k = 4 + nd, #w do vals[#vals + 1] = tonumber(w[k]) end
      case.t[w[1]] = lt.tensor(vals, {dtype = "f64"}):reshape(shape)
    end
  end
  return cases
end

-- max |a - b| over max |b|
local function rel_diff(a, b)
  local d = (a:to("f64") - b):abs():max():item()
  local m = b:abs():max():item()
  return d / (m > 0 and m or 1)
end

test("activation modules match PyTorch: values and gradients, every float dtype", function()
  local path = reference()
  local cases = parse(path)
  os.remove(path)
  T.assert_equal(#cases, 7 * 4 * 2)
  local worst = {}
  for _, c in ipairs(cases) do
    local dt = c.dtype
    local base = c.t.base:to(dt)
    local x = (c.transpose and base:transpose(-1, -2) or base):detach():requires_grad_()
    assert(x:is_contiguous() ~= c.transpose)
    local y = MODULES[c.name]()(x)
    T.assert_equal(y.dtype, dt)
    T.assert_equal(y.shape, c.t.y.shape)
    local what = string.format("%s %s%s", c.name, dt, c.transpose and " transposed" or "")
    local ey = rel_diff(y, c.t.y)
    assert(ey <= TOL[dt], what .. ": y differs by " .. ey .. " of the scale")
    local loss = (y * c.t.gout:to(dt)):sum()
    loss:backward()
    local ed = rel_diff(x.grad, c.t.dx)
    assert(ed <= TOL[dt], what .. ": dx differs by " .. ed .. " of the scale")
    local key = c.name .. " " .. dt
    worst[key] = math.max(worst[key] or 0, ey, ed)
  end
  if os.getenv("LUTRA_VERBOSE") then
    for k, v in pairs(worst) do print(string.format("  %-20s %.2e", k, v)) end
  end
end)
