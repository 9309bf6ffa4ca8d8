-- lutra.optim against PyTorch's trajectories: tests/py/ref_optim.py runs torch.optim.AdamW,
-- torch.optim.SGD, lucidrains' Lion (in torch ops) and clip_grad_norm_ on fixed parameters
-- and gradients; the same steps here must give the same parameters after every step
-- (within 1e-6 of each tensor's largest value; AdamW and Lion come out bitwise equal, SGD
-- differs by an ulp where torch's add(alpha=) fuses the multiply-add). Skipped without
-- python3 and torch (a failure where LUTRA_REQUIRE_TORCH=1). LUTRA_PYTHON names the
-- interpreter (default /usr/bin/python3, then python3).
local lt = require "lutra"
local optim = require "lutra.optim"
local T = require "lutra.testing"
local equal = T.assert_equal

local REL_TOL = 1e-6

-- tests/py/ref_optim.py, found from this file's path (any working directory)
local here = debug.getinfo(1, "S").source:match("^@(.*)[/\\][^/\\]+$") or "tests/lua"
local SCRIPT = here .. "/../py/ref_optim.py"

local function exit_code(a, _, c)
  if type(a) == "number" then return a >= 256 and math.floor(a / 256) or a end
  return a and 0 or (c or 1)
end

local function tmpname()
  local name = os.tmpname()
  os.remove(name)
  return name
end

-- The reference file's path (written once); skips the test without python3 and torch.
local reference_file
local function reference()
  if reference_file then return reference_file end
  local py = T.need_python("torch")
  local out, err = tmpname(), tmpname()
  local code = exit_code(os.execute(string.format("%s '%s' %s 2>%s", py, SCRIPT, out, err)))
  local f = io.open(err)
  local msg = f and f:read("*a") or ""
  if f then f:close() end
  os.remove(err)
  if code ~= 0 then error(SCRIPT .. " failed (exit " .. code .. "):\n" .. msg) end
  reference_file = out
  return out
end

local function numbers(rest)
  local l = {}
  for w in rest:gmatch("%S+") do l[#l + 1] = tonumber(w) end
  return l
end

-- The cases of the reference file: {name, kind, dtype, steps, clip, settings, params, steps = {...}}.
local function parse(path)
  local cases, case = {}, nil
  for line in io.lines(path) do
    local tag, rest = line:match("^(%S+)%s*(.*)$")
    if tag == "case" then
      local name, kind, dt, steps, clip = rest:match("^(%S+) (%S+) (%S+) (%d+) (%S+)$")
      case = {name = name, kind = kind, dtype = dt, nsteps = tonumber(steps), clip = tonumber(clip), settings = {},
              params = {}, steps = {}}
      cases[#cases + 1] = case
    elseif tag == "setting" then
      local key, vals = rest:match("^(%S+) (.*)$")
      if vals == "true" or vals == "false" then
        case.settings[key] = vals == "true"
      else
        local l = numbers(vals)
        case.settings[key] = #l == 1 and l[1] or l
      end
    elseif tag == "schedule" then
      local l = numbers(rest:match("^cosine (.*)$"))
      case.schedule = optim.schedule.cosine{lr = l[1], min_lr = l[2], warmup = l[3], total = l[4]}
    elseif tag == "param" then
      local l = numbers(rest)
      local shape = {}
      for d = 1, l[4] do shape[d] = l[4 + d] end
      case.params[l[1]] = {group = l[2], wd = l[3], shape = shape}
    elseif tag == "init" then
      local l = numbers(rest)
      case.params[table.remove(l, 1)].init = l
    elseif tag == "lr" or tag == "norm" then
      local l = numbers(rest)
      local s = case.steps[l[1] + 1] or {grads = {}, after = {}}
      case.steps[l[1] + 1] = s
      s[tag] = l[2]
    elseif tag == "grad" or tag == "after" then
      local l = numbers(rest)
      local s = case.steps[table.remove(l, 1) + 1]
      s[tag == "grad" and "grads" or "after"][table.remove(l, 1)] = l
    elseif tag ~= "end" then
      error("ref_optim output: unexpected line " .. line:sub(1, 40))
    end
  end
  return cases
end

-- Replays one case; returns the largest difference to torch's parameters relative to the
-- tensor's scale (max |ours - torch| / max |torch|, per tensor and step), and how many
-- values were bitwise equal.
local function replay(case)
  local tensors, groups = {}, {{params = {}}, {params = {}}}
  local order = {} -- optimizer position -> file index
  for gi = 1, 2 do
    for i, p in ipairs(case.params) do
      if p.group == gi then
        tensors[i] = lt.tensor(p.init, {dtype = case.dtype}):view(p.shape)
        groups[gi].params[#groups[gi].params + 1] = tensors[i]
        groups[gi].weight_decay = p.wd
        order[#order + 1] = i
      end
    end
  end
  local opts = {}
  for k, v in pairs(case.settings) do opts[k] = v end
  if case.schedule then
    opts.lr = nil
    opts.schedule = case.schedule
  end
  local opt = optim.create(case.kind, groups, opts)
  local worst, equal_count, total, norm_worst = 0, 0, 0, 0
  for it, s in ipairs(case.steps) do
    equal(opt:get_lr(), s.lr, case.name .. " lr at step " .. (it - 1)) -- the schedule, bit for bit
    local grads, by_file = {}, {}
    for k, i in ipairs(order) do
      if s.grads[i] then
        grads[k] = lt.tensor(s.grads[i], {dtype = case.dtype}):view(case.params[i].shape)
        by_file[#by_file + 1] = grads[k]
      end
    end
    if case.clip > 0 then
      local norm = optim.clip_grads(grads, case.clip, nil, #order)
      local rel = math.abs(norm - s.norm) / s.norm
      norm_worst = math.max(norm_worst, rel)
      if rel > REL_TOL then error(string.format("%s step %d: norm %.9g, torch %.9g", case.name, it - 1, norm, s.norm)) end
    end
    opt:step{grads = grads}
    for i, t in ipairs(tensors) do
      local got, want = t:reshape(-1):tolist(), s.after[i]
      local diff, scale = 0, 0
      for e = 1, #want do
        diff = math.max(diff, math.abs(got[e] - want[e]))
        scale = math.max(scale, math.abs(want[e]))
        total = total + 1
        if got[e] == want[e] then equal_count = equal_count + 1 end
      end
      worst = math.max(worst, diff / scale)
    end
  end
  return worst, equal_count, total, case.clip > 0 and norm_worst or nil
end

test("AdamW, SGD, Lion and clip_grad_norm follow PyTorch's trajectories", function()
  local path = reference()
  local cases = parse(path)
  equal(#cases, 10)
  local lines, bad = {}, {}
  for _, case in ipairs(cases) do
    local worst, same, total, norm = replay(case)
    lines[#lines + 1] = string.format("  %-18s %2d steps: max rel diff %.2e, %d/%d values bitwise equal%s", case.name,
      case.nsteps, worst, same, total, norm and string.format("; clip norm rel diff %.2e", norm) or "")
    if worst > REL_TOL then bad[#bad + 1] = case.name end
  end
  if os.getenv("LUTRA_TEST_VERBOSE") or #bad > 0 then print("optimizers vs torch:\n" .. table.concat(lines, "\n")) end
  if #bad > 0 then error("parameters differ from torch's by more than " .. REL_TOL .. ": " .. table.concat(bad, ", ")) end
  os.remove(path)
end)
