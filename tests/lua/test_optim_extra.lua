-- Adafactor and LAMB (lutra.optim.adafactor, lamb): a resumed run continues bitwise as an
-- uninterrupted one, state shapes (factored for 2+ dims), bf16 parameters through f32 and master
-- weights, and bad settings refused by name. Their arithmetic against the references:
-- test_optim_extra_torch.lua.
local lt = require "lutra"
local optim = require "lutra.optim"
local T = require "lutra.testing"
local close, equal, fails = T.assert_close, T.assert_equal, T.assert_error

local SHAPES = {{7}, {5, 6}, {3, 4, 5}}

local function run(name, opts, params, grads, from, to, opt)
  opt = opt or optim.create(name, params, opts)
  for k = from, to do
    local g = {}
    for i in ipairs(params) do g[i] = grads[k][i] end
    if k == 3 then g[2] = nil end -- one missing gradient on the way
    opt:step{grads = g}
  end
  return opt
end

local function resume(name, opts, dt)
  local init, grads = {}, {}
  for i, s in ipairs(SHAPES) do init[i] = lt.randn(s, {dtype = dt}) end
  for k = 1, 8 do
    grads[k] = {}
    for i, s in ipairs(SHAPES) do grads[k][i] = lt.randn(s, {dtype = dt}) end
  end
  local function copies() local l = {} for i, p in ipairs(init) do l[i] = p:clone() end return l end
  local straight, first = copies(), copies()
  run(name, opts, straight, grads, 1, 8)
  local b = run(name, opts, first, grads, 1, 4)
  local second = {}
  for i, p in ipairs(first) do second[i] = p:clone() end
  local c = optim.create(name, second, opts)
  c:load_state_dict(b:state_dict())
  run(name, opts, second, grads, 5, 8, c)
  for i = 1, #init do close(second[i], straight[i], {rtol = 0, atol = 0, msg = name .. " resumed param " .. i}) end
  return c
end

test("Adafactor and LAMB: a resumed run continues bitwise (f32, f64; with and without beta1)", function()
  for _, dt in ipairs{"f32", "f64"} do
    resume("adafactor", {}, dt)
    resume("adafactor", {lr = 1e-2, relative_step = false, beta1 = 0.9, weight_decay = 0.1}, dt)
    resume("lamb", {weight_decay = 0.01}, dt)
  end
end)

test("Adafactor: factored state for 2+ dims, transformers' names and shapes", function()
  local opt = resume("adafactor", {beta1 = 0.5}, "f32")
  local st = opt.state
  equal(st[1].exp_avg_sq.shape, {7})
  equal(st[1].exp_avg_sq_row, nil)
  equal(st[2].exp_avg_sq_row.shape, {5})
  equal(st[2].exp_avg_sq_col.shape, {6})
  equal(st[3].exp_avg_sq_row.shape, {3, 4})
  equal(st[3].exp_avg_sq_col.shape, {3, 5})
  equal(st[3].exp_avg.shape, {3, 4, 5})
  equal(st[1].step, 8)
  equal(st[2].step, 7) -- no gradient at step 3
end)

test("bf16 parameters step through f32 (as transformers), master weights step the f32 copy", function()
  for _, name in ipairs{"adafactor", "lamb"} do
    local p32 = lt.randn(4, 6)
    local p16 = p32:to("bf16")
    local g = lt.randn(4, 6):to("bf16"):to("f32") -- exact in bf16
    local ref = p16:to("f32")
    optim.create(name, {ref}, {}):step{grads = {g}}
    optim.create(name, {p16}, {}):step{grads = {g:to("bf16")}}
    close(p16:to("f32"), ref:to("bf16"):to("f32"), {rtol = 0, atol = 0, msg = name .. " bf16"})
    local pm = p32:to("bf16")
    local m = optim.create(name, {pm}, {master_weights = true})
    m:step{grads = {g}}
    equal(m.state[1].master.dtype, "f32")
    close(pm:to("f32"), m.state[1].master:to("bf16"):to("f32"), {rtol = 0, atol = 0, msg = name .. " master"})
  end
end)

test("bad settings are refused, naming the setting", function()
  local p = lt.randn(3, 2)
  fails("lr cannot be combined with relative_step = true", optim.Adafactor, {p}, {lr = 1e-3})
  fails("lr is required with relative_step = false", optim.Adafactor, {p}, {relative_step = false})
  fails("warmup_init = true requires relative_step = true", optim.Adafactor, {p},
    {lr = 1, relative_step = false, warmup_init = true})
  fails("eps must be a list of two numbers", optim.Adafactor, {p}, {eps = 1e-3})
  fails("clip_threshold must be > 0", optim.Adafactor, {p}, {clip_threshold = 0})
  fails("decay_rate must be <= 0", optim.Adafactor, {p}, {decay_rate = 0.5})
  fails("beta1 must be < 1", optim.Adafactor, {p}, {beta1 = 1})
  fails("scale_parameter must be a boolean", optim.Adafactor, {p}, {scale_parameter = 1})
  fails("unknown option 'betas'", optim.Adafactor, {p}, {betas = {0.9, 0.99}})
  local opt = optim.Adafactor({p}, {})
  fails("cannot be combined with relative_step = true", opt.step, opt, {grads = {lt.randn(3, 2)}, lr = 0.1})
  fails("betas[2] must be in [0, 1)", optim.LAMB, {p}, {betas = {0.9, 1}})
  fails("weight_decay must be >= 0", optim.LAMB, {p}, {weight_decay = -1})
  fails("unknown option 'beta1'", optim.LAMB, {p}, {beta1 = 0.9})
  fails("unknown optimizer lamb2", optim.create, "lamb2", {p}, {})
  local sd = optim.LAMB({p}, {}):state_dict()
  fails("the state is for optimizer 'lamb', this one is 'adafactor'", function() opt:load_state_dict(sd) end)
end)

-- Through the trainer's checkpoint (lutra.ckpt.train_state, sharded files on disk): 3 steps,
-- save, 3 more; a fresh optimizer and parameters restored from the files and stepped 3 times
-- land bitwise on the same parameters and state.
test("Adafactor and LAMB resume bitwise through a checkpoint on disk (factored moments included)", function()
  local ckpt = require "lutra.ckpt"
  local ts = require "lutra.ckpt.train_state"
  local root = os.tmpname()
  os.remove(root)
  for _, case in ipairs{{"adafactor", {beta1 = 0.9, weight_decay = 0.01}}, {"lamb", {weight_decay = 0.01}}} do
    local name, opts = case[1], case[2]
    local grads = {}
    for k = 1, 6 do grads[k] = {w = lt.randn(5, 6), b = lt.randn(6), t = lt.randn(2, 3, 4)} end
    local function fresh()
      return {w = lt.randn(5, 6), b = lt.randn(6), t = lt.randn(2, 3, 4)}
    end
    local function model_of(ps)
      return {named_parameters = function() return {{"w", ps.w}, {"b", ps.b}, {"t", ps.t}} end}
    end
    local function named(ps) return {{name = "b", tensor = ps.b}, {name = "t", tensor = ps.t}, {name = "w", tensor = ps.w}} end
    local ps = fresh()
    local opt = optim.create(name, model_of(ps), opts)
    for k = 1, 3 do opt:step{grads = grads[k]} end
    local tensors, extra = ts.collect(named(ps), opt)
    local dir = root .. "/" .. name .. "/step_000003"
    ckpt.save(dir, {step = 3, tensors = tensors, extra = {optim = extra}})
    for k = 4, 6 do opt:step{grads = grads[k]} end
    local ps2 = fresh()
    local opt2 = optim.create(name, model_of(ps2), opts)
    ts.restore(ckpt.load(dir), named(ps2), opt2)
    equal(opt2.steps, 3)
    for k = 4, 6 do opt2:step{grads = grads[k]} end
    for key, p in pairs(ps) do
      close(ps2[key], p, {rtol = 0, atol = 0, msg = name .. " param " .. key})
      for f, v in pairs(opt.state[key]) do
        if type(v) == "number" then equal(opt2.state[key][f], v) else
          close(opt2.state[key][f], v, {rtol = 0, atol = 0, msg = name .. " state " .. key .. "." .. f})
        end
      end
    end
  end
end)

test("the C steps refuse bad operands, naming them", function()
  local C = require("lutra.ffi").C
  local ffi = require "ffi"
  local function refused(pattern, rc)
    equal(rc, -1)
    local msg = ffi.string(C.lt_last_error())
    if not msg:find(pattern, 1, true) then error("expected '" .. pattern .. "', got: " .. msg, 2) end
  end
  local p, g = lt.randn(4, 6), lt.randn(4, 6)
  local row, col, v = lt.zeros(4), lt.zeros(6), lt.zeros(24)
  refused("adafactor: param is bf16, expected f32 or f64",
    C.lt_adafactor_step(p:to("bf16"), g, nil, row, col, nil, 1e-2, 1, 1e-30, 1e-3, 1, 0.5, 0, 0))
  refused("adafactor: col is", C.lt_adafactor_step(p, g, nil, row, lt.zeros(5), nil, 1e-2, 1, 1e-30, 1e-3, 1, 0.5, 0, 0))
  refused("adafactor: v must be NULL for this param",
    C.lt_adafactor_step(p, g, nil, row, col, v, 1e-2, 1, 1e-30, 1e-3, 1, 0.5, 0, 0))
  refused("adafactor: v is NULL", C.lt_adafactor_step(lt.randn(24), lt.randn(24), nil, nil, nil, nil, 1e-2, 1, 1e-30,
    1e-3, 1, 0.5, 0, 0))
  refused("adafactor: beta2t must be in [0, 1)",
    C.lt_adafactor_step(p, g, nil, row, col, nil, 1e-2, 1, 1e-30, 1e-3, 1, 1, 0, 0))
  refused("adafactor: grad is", C.lt_adafactor_step(p, lt.randn(4, 5), nil, row, col, nil, 1e-2, 1, 1e-30, 1e-3, 1, 0.5,
    0, 0))
  refused("lamb: step must be >= 1", C.lt_lamb_step(p, g, lt.zeros(4, 6), lt.zeros(4, 6), 1e-3, 0.9, 0.99, 1e-6, 0, 0))
  refused("lamb: m, v and param must not share memory", C.lt_lamb_step(p, g, p, lt.zeros(4, 6), 1e-3, 0.9, 0.99, 1e-6,
    0, 1))
  refused("expected f32 for param", C.lt_lamb_step(p, g, lt.zeros(4, 6), lt.zeros({4, 6}, {dtype = "f64"}), 1e-3, 0.9, 0.99,
    1e-6, 0, 1))
end)

test("a large parameter steps the same over 1 and 2 threads (sums in fixed runs), bitwise", function()
  local before = lt.get_num_threads()
  local init = lt.randn(300, 257)
  local grads = {lt.randn(300, 257), lt.randn(300, 257)}
  for _, name in ipairs{"adafactor", "lamb"} do
    local out = {}
    for threads = 1, 2 do
      lt.set_num_threads(threads)
      local p = init:clone()
      local opt = optim.create(name, {p}, {weight_decay = 0.01})
      for k = 1, 2 do opt:step{grads = {grads[k]}} end
      out[threads] = p
    end
    close(out[2], out[1], {rtol = 0, atol = 0, msg = name .. " 1 vs 2 threads"})
  end
  lt.set_num_threads(before)
end)

test("LAMB steps a group in one call (lt_lamb_step_multi): per tensor bitwise what lt_lamb_step gives", function()
  local C = require("lutra.ffi").C
  local ffi = require "ffi"
  -- mixed dtypes and sizes (empty, one element, past one run of the norms), a bf16 with and
  -- without master weights, a tensor without a gradient at step 2
  local shapes = {{7}, {0}, {1}, {70, 90}, {5, 6}, {3, 4, 5}}
  local dts = {"f32", "f64", "f32", "f32", "bf16", "bf16"}
  local params, ref, grads = {}, {}, {}
  for i, s in ipairs(shapes) do
    params[i] = lt.randn(s):to(dts[i])
    ref[i] = params[i]:to(dts[i] == "f64" and "f64" or "f32")
    grads[i] = {lt.randn(s):to(dts[i]), lt.randn(s):to(dts[i])}
  end
  local groups = {{params = {params[1], params[2], params[3], params[4], params[5]}}, {params = {params[6]}}}
  local opt = optim.create("lamb", groups, {lr = 1e-2, weight_decay = 0.01, master_weights = true})
  local state = {}
  for i, p in ipairs(ref) do
    state[i] = {m = lt.zeros_like(p), v = lt.zeros_like(p), step = 0}
  end
  for step = 1, 2 do
    local gs = {}
    for i = 1, #params do gs[i] = (step == 1 or i ~= 3) and grads[i][step] or nil end
    opt:step{grads = gs}
    for i, p in ipairs(ref) do
      if gs[i] then
        local st = state[i]
        st.step = st.step + 1
        equal(C.lt_lamb_step(p, gs[i]:to(p.dtype), st.m, st.v, 1e-2, 0.9, 0.999, 1e-6, 0.01, st.step), 0)
      end
    end
    for i, p in ipairs(params) do
      close(p, ref[i]:to(p.dtype), {rtol = 0, atol = 0, msg = "lamb group step " .. step .. " tensor " .. i})
    end
  end
  -- the multi call's own refusals name the tensor
  local held = {lt.randn(4), lt.randn(5), lt.randn(4), lt.randn(6), lt.zeros(4), lt.zeros(5), lt.zeros(4), lt.zeros(5)}
  local a = ffi.new("lt_tensor*[2]", {held[1], held[2]})
  local g = ffi.new("lt_tensor*[2]", {held[3], held[4]})
  local m = ffi.new("lt_tensor*[2]", {held[5], held[6]})
  local v = ffi.new("lt_tensor*[2]", {held[7], held[8]})
  equal(C.lt_lamb_step_multi(2, a, g, m, v, 1e-3, 0.9, 0.99, 1e-6, 0, 1), -1)
  local msg = ffi.string(C.lt_last_error())
  assert(msg:find("lamb_multi: grads[1]", 1, true), msg)
  equal(C.lt_lamb_step_multi(0, nil, nil, nil, nil, 1e-3, 0.9, 0.99, 1e-6, 0, 1), 0)
end)

test("Adafactor steps a group in one call (lt_adafactor_step_multi): per tensor bitwise what lt_adafactor_step gives",
  function()
  local C = require("lutra.ffi").C
  local ffi = require "ffi"
  -- factored 2-d and 3-d, 1-d, empty, f64, bf16 with master weights; beta1 and weight decay;
  -- a tensor without a gradient at step 2 (its step count falls behind: a call of its own)
  local shapes = {{7}, {0}, {5, 6}, {3, 4, 5}, {70, 90}, {4, 6}}
  local dts = {"f32", "f32", "f64", "f32", "f32", "bf16"}
  local params, ref, grads = {}, {}, {}
  for i, s in ipairs(shapes) do
    params[i] = lt.randn(s):to(dts[i])
    ref[i] = params[i]:to(dts[i] == "f64" and "f64" or "f32")
    grads[i] = {lt.randn(s):to(dts[i]), lt.randn(s):to(dts[i])}
  end
  local opts = {beta1 = 0.9, weight_decay = 0.01, master_weights = true}
  local opt = optim.create("adafactor", params, opts)
  local state = {}
  for i, p in ipairs(ref) do
    local st = {m = lt.zeros_like(p), step = 0}
    if #p.shape >= 2 then
      local kind = require "lutra.optim.adafactor"
      st.row = lt.zeros(kind.state_shape(p.shape, "exp_avg_sq_row"), {dtype = p.dtype})
      st.col = lt.zeros(kind.state_shape(p.shape, "exp_avg_sq_col"), {dtype = p.dtype})
    else
      st.v = lt.zeros_like(p)
    end
    state[i] = st
  end
  for step = 1, 2 do
    local gs = {}
    for i = 1, #params do gs[i] = (step == 1 or i ~= 4) and grads[i][step] or nil end
    opt:step{grads = gs}
    for i, p in ipairs(ref) do
      if gs[i] then
        local st = state[i]
        st.step = st.step + 1
        local t = st.step
        equal(C.lt_adafactor_step(p, gs[i]:to(p.dtype), st.m, st.row, st.col, st.v, math.min(1e-2, 1 / math.sqrt(t)), 1,
          1e-30, 1e-3, 1, 1 - t ^ -0.8, 0.9, 0.01), 0)
      end
    end
    for i, p in ipairs(params) do
      close(p, ref[i]:to(p.dtype), {rtol = 0, atol = 0, msg = "adafactor group step " .. step .. " tensor " .. i})
    end
  end
  -- the multi call's own refusals name the tensor
  local held = {lt.randn(4, 6), lt.randn(4, 6), lt.zeros(4), lt.zeros(5)}
  local p = ffi.new("lt_tensor*[1]", {held[1]})
  local g = ffi.new("lt_tensor*[1]", {held[2]})
  local rows, cols = ffi.new("lt_tensor*[1]", {held[3]}), ffi.new("lt_tensor*[1]", {held[4]})
  equal(C.lt_adafactor_step_multi(1, p, g, nil, rows, cols, nil, 1e-2, 1, 1e-30, 1e-3, 1, 0.5, 0, 0), -1)
  local msg = ffi.string(C.lt_last_error())
  assert(msg:find("adafactor_multi: cols[0]", 1, true), msg)
  equal(C.lt_adafactor_step_multi(0, nil, nil, nil, nil, nil, nil, 1e-2, 1, 1e-30, 1e-3, 1, 0.5, 0, 0), 0)
end)
