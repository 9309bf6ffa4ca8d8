-- Adafactor and LAMB against tests/py/ref_optim_extra.py: transformers' Adafactor written in
-- torch ops (checked against transformers itself: --check-transformers, difference 0) and the
-- LAMB paper's update in torch ops, 10 steps over parameters of 1, 2 and 3 dims, a [1, 9] one
-- and a zero one (rms 0, ||p|| 0), with an all-zero gradient on the way. The parameters after
-- every step agree within 1e-12 (f64) and 2e-6 (f32) of each tensor's largest value. Skipped
-- without python3 and torch (a failure where LUTRA_REQUIRE_TORCH=1).
local lt = require "lutra"
local optim = require "lutra.optim"
local T = require "lutra.testing"

local TOL = {f64 = 1e-12, f32 = 2e-6}

local here = debug.getinfo(1, "S").source:match("^@(.*)[/\\][^/\\]+$") or "tests/lua"
local SCRIPT = here .. "/../py/ref_optim_extra.py"

local function reference() return T.torch_reference(SCRIPT) end

local function numbers(rest)
  local l = {}
  for w in rest:gmatch("%S+") do l[#l + 1] = tonumber(w) end
  return l
end

local function parse(path)
  local cases, case = {}, nil
  for line in io.lines(path) do
    local tag, rest = line:match("^(%S+)%s*(.*)$")
    if tag == "case" then
      local name, kind, dt, steps = rest:match("^(%S+) (%S+) (%S+) (%d+)$")
      case = {name = name, kind = kind, dtype = dt, nsteps = tonumber(steps), settings = {}, params = {}, steps = {}}
      cases[#cases + 1] = case
    elseif tag == "setting" then
      local key, vals = rest:match("^(%S+) (.*)$")
      if vals == "true" or vals == "false" then
        case.settings[key] = vals == "true"
      else
        local l = numbers(vals)
        case.settings[key] = (key == "eps" and #l == 2 or key == "betas") and l or l[1]
      end
    elseif tag == "param" then
      local l = numbers(rest)
      case.params[l[1]] = {shape = {unpack(l, 3)}}
    elseif tag == "init" then
      local l = numbers(rest)
      case.params[table.remove(l, 1)].init = l
    elseif tag == "grad" or tag == "after" then
      local l = numbers(rest)
      local s, i = table.remove(l, 1) + 1, table.remove(l, 1)
      case.steps[s] = case.steps[s] or {grads = {}, after = {}}
      case.steps[s][tag == "grad" and "grads" or "after"][i] = l
    end
  end
  return cases
end

local path
local function cases()
  path = path or reference()
  return parse(path)
end

test("Adafactor and LAMB follow the reference step by step (f64 and f32, 1-d, 2-d, 3-d, zero)", function()
  local report = {}
  for _, case in ipairs(cases()) do
    local params = {}
    for i, p in ipairs(case.params) do params[i] = lt.tensor(p.init, {dtype = case.dtype}):view(p.shape) end
    local opt = optim.create(case.kind, params, case.settings)
    local worst = 0
    for s, st in ipairs(case.steps) do
      local grads = {}
      for i, p in ipairs(case.params) do grads[i] = lt.tensor(st.grads[i], {dtype = case.dtype}):view(p.shape) end
      opt:step{grads = grads}
      for i, t in ipairs(params) do
        local got, want = t:reshape(-1):tolist(), st.after[i]
        local diff, scale = 0, 0
        for e = 1, #want do
          diff = math.max(diff, math.abs(got[e] - want[e]))
          scale = math.max(scale, math.abs(want[e]))
        end
        local rel = scale > 0 and diff / scale or diff
        worst = math.max(worst, rel)
        if rel > TOL[case.dtype] then
          error(string.format("%s %s step %d param %d: relative difference %.3g > %g", case.name, case.dtype, s, i,
            rel, TOL[case.dtype]))
        end
      end
    end
    report[#report + 1] = string.format("%s/%s %.2g", case.name, case.dtype, worst)
  end
  print("  max relative difference: " .. table.concat(report, ", "))
end)
