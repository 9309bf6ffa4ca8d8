-- Checks of the resharding matrix (tests/dist/test_ckpt_reshard.sh), one process for all:
--   lutra state_compare.lua LIST
-- LIST has one check a line:
--   state A B SAME     the state dumps A and B (ckpt_reshard.lua) are bitwise equal: every
--                      tensor, the step, the optimizer's numbers, and on every rank of B the
--                      RNG and loader position of A's same rank (SAME = 1: the same layout)
--                      or of A's rank 0 (another layout: the trainer's rule)
--   final A B          parameters A.safetensors within 1e-9 relative of B.safetensors (f64)
--   losses A B         the losses A within 1e-9 relative of B's for the same steps
-- Prints "ok ..." or "FAIL ..." for each; exits 1 when one failed.
local lt = require "lutra"
local json = require "lutra.json"

local REL = 1e-9 -- f64: the same math in another order agrees to ~1e-12
local failed, passed = 0, 0

local function read_json(p)
  local ok, v = pcall(json.read_file, p)
  return ok and v or nil
end

local function rank_files(prefix)
  local out = {}
  for r = 0, 64 do
    local v = read_json(string.format("%s.r%d.json", prefix, r))
    if not v then break end
    out[r] = v
  end
  return out
end

local function same_value(a, b) return json.encode(a) == json.encode(b) end

-- every rank's numbers for each optimizer key, merged (a key on several ranks must agree)
local function merged_numbers(ranks)
  local out = {}
  for r = 0, #ranks do
    local o = ranks[r].optim
    if type(o) == "table" then
      for key, fields in pairs(o.numbers or {}) do
        if out[key] ~= nil and not same_value(out[key], fields) then
          return nil, string.format("ranks disagree on the optimizer numbers of %s", key)
        end
        out[key] = fields
      end
    end
  end
  return out
end

local function check_state(a, b, same)
  local ta, tb = lt.safetensors.load(a .. ".safetensors"), lt.safetensors.load(b .. ".safetensors")
  for name, t in pairs(ta) do
    local u = tb[name]
    if u == nil then return false, "no " .. name .. " after loading" end
    if not same_value(t.shape, u.shape) then return false, name .. ": another shape" end
    local d = (t - u):abs():max():item()
    if d ~= 0 then return false, string.format("%s differs by %.3g", name, d) end
  end
  for name in pairs(tb) do
    if ta[name] == nil then return false, "a tensor the save did not have: " .. name end
  end
  local ra, rb = rank_files(a), rank_files(b)
  if ra[0] == nil or rb[0] == nil then return false, "a rank's state file is missing" end
  for r = 0, #rb do
    local want = ra[same and r or 0]
    if want == nil then return false, "no state of rank " .. r .. " in the save" end
    local got = rb[r]
    if got.step ~= want.step then return false, string.format("rank %d: step %s, saved %s", r, got.step, want.step) end
    if not same_value(got.rng, want.rng) then
      return false, string.format("rank %d: RNG %s, saved %s", r, json.encode(got.rng), json.encode(want.rng))
    end
    if not same_value(got.loader, want.loader) then
      return false, string.format("rank %d: loader %s, saved %s", r, json.encode(got.loader), json.encode(want.loader))
    end
  end
  local na, ea = merged_numbers(ra)
  local nb, eb = merged_numbers(rb)
  if not na or not nb then return false, ea or eb end
  if not same_value(na, nb) then return false, "the optimizer's numbers differ" end
  local sa, sb = ra[0].optim, rb[0].optim
  if type(sa) == "table" and type(sb) == "table" and sa.steps ~= sb.steps then
    return false, string.format("optimizer steps %s, saved %s", tostring(sb.steps), tostring(sa.steps))
  end
  return true, string.format("%d tensors bitwise, step %d, RNG and loader of %d ranks", (function()
    local n = 0
    for _ in pairs(ta) do n = n + 1 end
    return n
  end)(), ra[0].step, #rb + 1)
end

local function check_final(a, b)
  local ta, tb = lt.safetensors.load(a), lt.safetensors.load(b)
  local worst, where = 0, "-"
  for name, t in pairs(tb) do
    local u = ta[name]
    if u == nil then return false, "no " .. name end
    local scale = t:abs():max():item()
    local d = (u - t):abs():max():item()
    if not (d <= REL * scale) then return false, string.format("%s differs by %.3g of its scale", name, d / scale) end
    if scale > 0 and d / scale > worst then worst, where = d / scale, name end
  end
  return true, string.format("worst rel diff %.1e (%s)", worst, where)
end

local function check_losses(a, b)
  local want = {}
  for line in io.lines(b) do
    local s, v = line:match("^(%d+) (%S+)$")
    want[tonumber(s)] = tonumber(v)
  end
  local n, worst = 0, 0
  for line in io.lines(a) do
    local s, v = line:match("^(%d+) (%S+)$")
    s, v = tonumber(s), tonumber(v)
    local w = want[s]
    if w == nil then return false, "no step " .. s .. " in " .. b end
    local rel = math.abs(v - w) / math.abs(w)
    if not (rel <= REL) then return false, string.format("step %d: loss %.17g vs %.17g", s, v, w) end
    worst, n = math.max(worst, rel), n + 1
  end
  if n == 0 then return false, "no losses in " .. a end
  return true, string.format("%d losses, worst rel diff %.1e", n, worst)
end

local list = assert(arg[1], "usage: state_compare.lua LIST")
for line in io.lines(list) do
  local kind, a, b, same = line:match("^(%S+) (%S+) (%S+) ?(%S*)$")
  local ok, res, msg = pcall(function()
    if kind == "state" then return check_state(a, b, same == "1") end
    if kind == "final" then return check_final(a, b) end
    if kind == "losses" then return check_losses(a, b) end
    error("unknown check: " .. line)
  end)
  if ok and res then
    passed = passed + 1
    print(string.format("ok    %-6s %s  %s", kind, kind == "state" and b or a, msg))
  else
    failed = failed + 1
    print(string.format("FAIL  %-6s %s vs %s: %s", kind, a, b, tostring(ok and msg or res)))
  end
end
print(string.format("state_compare: %d checks passed, %d failed", passed, failed))
os.exit(failed == 0 and 0 or 1)
