-- The multi-tensor paths of lutra.optim against the per-tensor ones, bit for bit on the CPU:
-- AdamW's update_group (lt_adamw_step_multi: one call per device and step count, master
-- weights inside it) against update tensor by tensor over several steps, with param groups
-- (weight decay off for some, another lr), bf16/f16 parameters with and without masters,
-- empty and one-element tensors, a parameter skipped for a step (its step count lags), and a
-- state_dict round trip; opt:step with the kind as built (multi-tensor when the driver has
-- update_group) against a per-tensor copy of the kind; clip_grads (multi-tensor sum of squares
-- and scale) against the per-tensor norms. (PyTorch's AdamW: test_optim_torch.lua.)
local lt = require "lutra"
local optim = require "lutra.optim"
local adamw = require "lutra.optim.adamw"
local T = require "lutra.testing"
local equal, close, fails = T.assert_equal, T.assert_close, T.assert_error

local function flat(t) return t:to("f64"):reshape(-1):tolist() end

-- a and b hold the same values (bitwise, for these dtypes: f64 holds every f32/bf16/f16 exactly).
local function same(a, b, what)
  equal(a.dtype, b.dtype, what .. " dtype")
  local x, y = flat(a), flat(b)
  equal(#x, #y, what .. " numel")
  for i = 1, #x do
    if x[i] ~= y[i] then error(string.format("%s: element %d is %.17g, per-tensor %.17g", what, i, x[i], y[i]), 2) end
  end
end

local SHAPES = {{4, 7}, {7}, {0}, {1}, {3, 5}, {5, 3}, {9}, {2, 2}, {33}, {1, 1}}
local DTYPES = {"f32", "f32", "f32", "f64", "f64", "bf16", "f16", "bf16", "f32", "f16"}

-- Two identical sets of parameters as groups: decayed matrices, no decay, another lr.
local function make_params(seed)
  lt.manual_seed(seed)
  local ps = {}
  for i, s in ipairs(SHAPES) do ps[i] = lt.randn(s, {dtype = DTYPES[i]}) end
  return ps
end
local GROUPS = {{1, 5, 6, 8}, {2, 3, 4, 7}, {9, 10}}
local ORDER = {1, 5, 6, 8, 2, 3, 4, 7, 9, 10} -- the optimizer's keys: positions in group order
local function groups_of(ps)
  local function pick(idx)
    local l = {}
    for j, i in ipairs(idx) do l[j] = ps[i] end
    return l
  end
  return {{params = pick(GROUPS[1]), weight_decay = 0.1}, {params = pick(GROUPS[2]), weight_decay = 0},
          {params = pick(GROUPS[3]), lr = 3e-3, weight_decay = 0.05}}
end

local function grads_for(ps, step)
  lt.manual_seed(1000 + step)
  local gs = {}
  for i, p in ipairs(ps) do
    -- bf16/f16 params get grads of their dtype or f32 in turn
    local dt = p.dtype
    if (dt == "bf16" or dt == "f16") and (i + step) % 2 == 0 then dt = "f32" end
    gs[i] = lt.randn(p.shape, {dtype = dt})
  end
  if step == 2 then gs[7] = nil end -- skipped: its step count lags behind the others'
  local keyed = {}
  for k, i in ipairs(ORDER) do keyed[k] = gs[i] end
  return keyed
end

-- One step of opt with grads by position, through update_group or update_one per item (the
-- optimizer driver's bookkeeping, as optimizer.lua does it).
local function drive(opt, gs, multi)
  local k = 0
  for _, g in ipairs(opt.param_groups) do
    local items = {}
    for _, p in ipairs(g.params) do
      k = k + 1
      local key = opt.keys[k]
      if gs[k] ~= nil then
        local st = opt.state[key]
        if st == nil then
          st = adamw.init(p, g)
          if opt.master_weights and (p.dtype == "bf16" or p.dtype == "f16") then st.master = p:to("f32") end
          opt.state[key] = st
        end
        items[#items + 1] = {p = p, grad = gs[k], st = st}
      end
    end
    if multi == "strict" then -- the multi-tensor call itself, never the per-tensor fallback
      local one = adamw.update_one
      adamw.update_one = function() error("update_group fell back to the per-tensor path") end
      local ok, err = pcall(adamw.update_group, items, g, g.lr)
      adamw.update_one = one
      if not ok then error(err, 0) end
    elseif multi then
      adamw.update_group(items, g, g.lr)
    else
      for _, it in ipairs(items) do adamw.update_one(it, g, g.lr) end
    end
  end
  opt.steps = opt.steps + 1
end

local function compare(opt_a, pa, opt_b, pb, tag)
  for i = 1, #pa do same(pa[i], pb[i], tag .. ": param " .. i) end
  local n = 0
  for _ in pairs(opt_a.state) do n = n + 1 end
  equal(n, #pa, tag .. ": every parameter has state")
  for key, sa in pairs(opt_a.state) do
    local sb = opt_b.state[key]
    equal(sa.step, sb.step, tag .. ": step of " .. tostring(key))
    same(sa.exp_avg, sb.exp_avg, tag .. ": exp_avg of " .. tostring(key))
    same(sa.exp_avg_sq, sb.exp_avg_sq, tag .. ": exp_avg_sq of " .. tostring(key))
    equal(sa.master ~= nil, sb.master ~= nil, tag .. ": master of " .. tostring(key))
    if sa.master then same(sa.master, sb.master, tag .. ": master of " .. tostring(key)) end
  end
end

for _, masters in ipairs {false, true} do
  test("adamw update_group equals the per-tensor update bitwise (master_weights " .. tostring(masters) .. ")", function()
    local pa, pb = make_params(7), make_params(7)
    local o = {lr = 1e-2, betas = {0.9, 0.95}, eps = 1e-6, weight_decay = 0.1, master_weights = masters}
    local opt_a, opt_b = optim.AdamW(groups_of(pa), o), optim.AdamW(groups_of(pb), o)
    for step = 1, 4 do
      drive(opt_a, grads_for(pa, step), "strict")
      drive(opt_b, grads_for(pb, step), false)
      compare(opt_a, pa, opt_b, pb, "step " .. step)
    end
    equal(opt_a.state[8].step, 3, "the skipped parameter lags one step")
    equal(opt_a.state[1].step, 4)
    if masters then equal(opt_a.state[3].master.dtype, "f32") end
    -- a state_dict round trip, then more steps on both
    local opt_c = optim.AdamW(groups_of(pa), o)
    opt_c:load_state_dict(opt_a:state_dict())
    for step = 5, 6 do
      drive(opt_c, grads_for(pa, step), "strict")
      drive(opt_b, grads_for(pb, step), false)
      compare(opt_c, pa, opt_b, pb, "after load, step " .. step)
    end
  end)
end

test("opt:step of AdamW (multi-tensor when the driver batches) equals a per-tensor copy of the kind", function()
  local per_tensor = setmetatable({update_group = false}, {__index = adamw})
  for _, masters in ipairs {false, true} do
    local pa, pb = make_params(11), make_params(11)
    local o = {lr = 2e-2, weight_decay = 0.1, master_weights = masters}
    local opt_a = optim.AdamW(groups_of(pa), o)
    local opt_b = optim.Optimizer.new(per_tensor, groups_of(pb), o)
    for step = 1, 3 do
      opt_a:step{grads = grads_for(pa, step)}
      opt_b:step{grads = grads_for(pb, step)}
      compare(opt_a, pa, opt_b, pb, "opt:step " .. step)
    end
  end
end)

test("adamw update_group: a refused call falls back to the per-tensor errors", function()
  local p = lt.randn({3})
  local opt = optim.AdamW({p})
  fails("adamw: grad is [2] f32 cpu, expected 3 elements", function() drive(opt, {lt.ones(2)}, true) end)
  fails("expected f32", function() drive(opt, {lt.ones(3, {dtype = "f64"})}, true) end)
end)

test("lt_adamw_step_multi from the FFI: empty list, NULL masters", function()
  local C = require("lutra.ffi").C
  equal(C.lt_adamw_step_multi(0, nil, nil, nil, nil, nil, 1e-3, 0.9, 0.999, 1e-8, 0, 1), 0)
  local ffi = require "ffi"
  local p, g = lt.randn({5}), lt.randn({5})
  local m, v = lt.zeros({5}), lt.zeros({5})
  local q, m2, v2 = p:clone(), lt.zeros({5}), lt.zeros({5})
  local arr = function(t) return ffi.new("lt_tensor*[1]", t) end
  equal(C.lt_adamw_step_multi(1, arr(p), arr(g), arr(m), arr(v), nil, 1e-3, 0.9, 0.999, 1e-8, 0.1, 1), 0)
  equal(C.lt_adamw_step(q, g, m2, v2, 1e-3, 0.9, 0.999, 1e-8, 0.1, 1), 0)
  same(p, q, "multi vs single")
end)

-- ---- clipping ---------------------------------------------------------------------------------

-- The norm in Lua doubles from the values, and the gradients scaled by torch's coefficient
-- through the per-tensor op. (The per-tensor path clip_grads took before rounded each tensor's
-- norm to f32: it agrees to ~1e-8 only.)
local function reference_clip(grads, max_norm)
  local total = 0
  for _, g in ipairs(grads) do
    for _, x in ipairs(flat(g)) do total = total + x * x end
  end
  total = math.sqrt(total)
  local coef = max_norm / (total + 1e-6)
  if coef < 1 then
    for _, g in ipairs(grads) do lt.mul(g, coef, g) end
  end
  return total
end

-- one ulp of each dtype: the coefficient may differ in its last double bit (another order of the sum)
local ULP = {f64 = 1e-14, f32 = 2 ^ -22, bf16 = 2 ^ -7, f16 = 2 ^ -10}

test("clip_grads: the multi-tensor norm and scale against the per-tensor path", function()
  for _, max_norm in ipairs {1e9, 0.5} do
    lt.manual_seed(3)
    local a, b = {}, {}
    for i, s in ipairs(SHAPES) do
      a[i] = lt.randn(s, {dtype = DTYPES[i]}) * 3
      b[i] = a[i]:clone()
    end
    local norm = optim.clip_grads(a, max_norm)
    local want = reference_clip(b, max_norm)
    close(norm, want, {rtol = 1e-13})
    for i = 1, #a do
      if a[i]:numel() > 0 then close(a[i]:to("f64"), b[i]:to("f64"), {rtol = ULP[a[i].dtype], atol = 0}) end
    end
    if max_norm > 1e6 then for i = 1, #a do same(a[i], b[i], "not clipped: untouched " .. i) end end
  end
  -- nil entries are skipped, an infinite norm leaves the gradients alone
  local g = {lt.tensor({3, 4}), nil, lt.tensor({0})}
  close(optim.clip_grads(g, 1, nil, 3), 5, {rtol = 1e-15})
  close(g[1], lt.tensor({3, 4}) * (1 / (5 + 1e-6)), {rtol = 1e-7})
  local inf = {lt.tensor({math.huge, 1})}
  equal(optim.clip_grads(inf, 1), math.huge)
  equal(inf[1]:tolist()[2], 1)
end)

test("grad_norm (multi-tensor) groups tensors by device and dtype", function()
  local gs = {lt.tensor({1, 2}, {dtype = "f64"}), lt.tensor({2}, {dtype = "bf16"}), lt.tensor({4}, {dtype = "f16"})}
  close(require("lutra.optim.clip").total_norm(gs, 2, 3), math.sqrt(1 + 4 + 4 + 16), {rtol = 1e-15})
end)
