-- einsum, split, chunk, unbind, cat, stack, clamp (number and tensor bounds, clamp_min, clamp_max, clip),
-- repeat_interleave, bincount and histc against PyTorch: tests/py/ref_shape_ops.py runs each on odd
-- shapes, transposed (non-contiguous) inputs and every float dtype, with the gradients of
-- sum_k sum(y_k * gout_k); the same here must give the same results and input gradients.
-- Data movement (split, chunk, unbind, cat, stack, clamp: one of the inputs' values, and their
-- gradients), repeat_interleave (its gradient adds the copies in order, in the dtype, as torch's
-- index_add) and the counts of bincount and histc are exact: equal bit for bit, NaN meeting NaN.
-- einsum runs as batched matmuls: its results and gradients may differ from torch's by the
-- dtype's rounding of a dot product (its sums in another order), within TOL of the largest sum of
-- |products|; the gradient of a clamp input that broadcast (a sum over the broadcast dims) may differ
-- by a rounding, within TOL of the largest value.
-- Skipped without python3 and torch (a failure where LUTRA_REQUIRE_TORCH=1).
local lt = require "lutra"
local T = require "lutra.testing"

local here = debug.getinfo(1, "S").source:match("^@(.*)[/\\][^/\\]+$") or "tests/lua"
local SCRIPT = here .. "/../py/ref_shape_ops.py"
-- einsum, relative to the largest of the same sums over |products| (s_y1, s_dk: the scale of every
-- rounding on the way): f64 and f32, a dot product's sums in another order; bf16 and f16, up to four
-- roundings of the dtype (the reference rounds torch's f32 result once; lutra's einsum rounds each
-- pairwise contraction and a sum before it)
local TOL = {f64 = 2e-15, f32 = 1e-6, bf16 = 4 * 2 ^ -8, f16 = 4 * 2 ^ -11}
local DTYPE = {int64 = "i64", float32 = "f32", float64 = "f64", bfloat16 = "bf16", float16 = "f16"}

local function reference() return T.torch_reference(SCRIPT) end

local function arg_value(w)
  if w == "nil" then return nil end
  local list = w:match("^%[(.*)%]$")
  if list then
    local l = {}
    for v in list:gmatch("[^,]+") do l[#l + 1] = tonumber(v) end
    return l
  end
  return tonumber(w) or w
end

local function parse(path)
  local cases, case = {}, nil
  for line in io.lines(path) do
    local tag, rest = line:match("^(%S+)%s*(.*)$")
    if tag == "case" then
      local w = {}
      for x in rest:gmatch("%S+") do w[#w + 1] = x end
      case = {name = w[1], op = w[2], dtype = w[3], args = {}, n = #w - 3, t = {}, dtypes = {}}
      for i = 4, #w do case.args[i - 3] = arg_value(w[i]) end
      cases[#cases + 1] = case
    elseif tag == "tensor" then
      local w = {}
      for x in rest:gmatch("%S+") do w[#w + 1] = x end
      local key, dt, tr, nd = w[1], w[2], w[3] == "1", tonumber(w[4])
      local shape, vals = {}, {}
      for d = 1, nd do shape[d] = tonumber(w[4 + d]) end
      for k = 5 + nd, #w do vals[#vals + 1] = tonumber(w[k]) or (w[k]:find("nan") and 0 / 0) end
      case.t[key] = {dtype = dt, transposed = tr, shape = shape, vals = vals}
    elseif tag == "dtype" then
      local key, dt = rest:match("^(%S+) (%S+)$")
      case.dtypes[key] = DTYPE[dt]
    end
  end
  return cases
end

-- the tensor as written, in dt (float values) or its own integer dtype
local function make(spec, dt)
  local t = lt.tensor(#spec.vals > 0 and spec.vals or {0}, {dtype = spec.dtype == "f64" and "f64" or spec.dtype})
  t = #spec.vals > 0 and t:reshape(spec.shape) or t:narrow(0, 0, 0):reshape(spec.shape)
  if spec.dtype == "f64" and dt ~= "f64" then t = t:to(dt) end
  return t
end

local function run(c, xs)
  local op, a, x = c.op, c.args, xs[1]
  if op == "einsum" then return {lt.einsum(a[1], xs)} end
  if op == "split" or op == "chunk" or op == "unbind" then return x[op](x, unpack(a, 1, c.n)) end
  if op == "cat" or op == "stack" then return {lt[op](xs, a[1])} end
  if op == "clamp_tn" then return {x:clamp(xs[2], a[1])} end
  if op == "clamp" or op == "clip" then
    if #xs == 1 then return {x[op](x, a[1], a[2])} end
    return {x[op](x, xs[2], xs[3])}
  end
  if op == "clamp_min" or op == "clamp_max" then return {x[op](x, xs[2] or a[1])} end
  if op == "repeat_interleave" then
    if xs[2] then return {x:repeat_interleave(xs[2], a[1])} end
    return {x:repeat_interleave(a[1], a[2])}
  end
  if op == "bincount" then return {lt.bincount(x, xs[2], a[1])} end
  if op == "histc" then return {lt.histc(x, a[1], a[2], a[3])} end
  error("unknown op " .. op)
end

-- max |got - want| over max |want| (0 where equal bit for bit as f64 values; NaN must meet NaN), or over
-- max |scale| when given
local function rel_diff(what, got, want, scale)
  T.assert_equal(table.concat(got.shape, ","), table.concat(want.shape, ","), what .. ": shape")
  local g, w = got:to("f64"):contiguous():view(-1):tolist(), want:to("f64"):contiguous():view(-1):tolist()
  local worst, big = 0, 0
  for i = 1, #w do
    if (g[i] ~= g[i]) ~= (w[i] ~= w[i]) or ((w[i] == math.huge or w[i] == -math.huge) and g[i] ~= w[i]) then
      error(string.format("%s[%d]: got %s, torch %s", what, i - 1, g[i], w[i]))
    end
    if w[i] == w[i] then
      worst, big = math.max(worst, math.abs(g[i] - w[i])), math.max(big, math.abs(w[i]))
    end
  end
  if scale ~= nil then big = scale:abs():max():item() end
  return worst / (big > 0 and big or 1), worst
end

test("einsum, split, chunk, unbind, cat, stack, clamp, repeat_interleave, bincount, histc match PyTorch", function()
  local path = reference()
  local cases = parse(path)
  os.remove(path)
  assert(#cases >= 200, "ref_shape_ops.py wrote " .. #cases .. " cases")
  local worst, keys = {}, {}
  for _, c in ipairs(cases) do
    local dt, label = c.dtype, c.name .. " " .. c.dtype
    local xs, leaves = {}, {}
    for k = 1, 8 do
      local spec = c.t["x" .. k]
      if spec == nil then break end
      local base = make(spec, dt)
      if c.t["d" .. k] then
        base = base:requires_grad_()
        leaves[k] = base
      end
      xs[k] = spec.transposed and base:transpose(-1, -2) or base
    end
    local ys = run(c, xs)
    local loss
    local exact = c.op ~= "einsum"
    local key = c.op:gsub("_tn$", "") .. " " .. dt
    if not worst[key] then
      worst[key], keys[#keys + 1] = {0, 0, 0, 0}, key
    end
    for k = 1, 64 do
      local want = c.t["y" .. k]
      if want == nil then
        T.assert_equal(#ys, k - 1, label .. ": number of results")
        break
      end
      local y = ys[k]
      assert(y ~= nil, label .. ": no result " .. k)
      if c.dtypes["y" .. k] then T.assert_equal(y.dtype, c.dtypes["y" .. k], label .. " y" .. k .. " dtype") end
      local scale = c.t["s_y" .. k] and make(c.t["s_y" .. k], "f64")
      local r, abs = rel_diff(label .. " y" .. k, y, make(want, c.dtypes["y" .. k] or dt), scale)
      assert(r <= (exact and 0 or TOL[dt]), string.format("%s y%d: relative difference %.3g", label, k, r))
      worst[key][1], worst[key][3] = math.max(worst[key][1], r), math.max(worst[key][3], abs)
      if c.t["gout" .. k] then
        local term = (y * make(c.t["gout" .. k], dt)):sum()
        loss = loss and loss + term or term
      end
    end
    if loss then loss:backward() end
    for k, leaf in pairs(leaves) do
      assert(leaf.grad ~= nil, label .. ": no gradient for input " .. k)
      local grad = c.t["x" .. k].transposed and leaf.grad:transpose(-1, -2) or leaf.grad -- the op's input's
      local scale = c.t["s_d" .. k] and make(c.t["s_d" .. k], "f64")
      local r, abs = rel_diff(label .. " d" .. k, grad, make(c.t["d" .. k], dt), scale)
      -- a clamp bound (or x) that broadcast gets a sum of gradients: torch adds in another order
      local summed = c.op:match("^clamp") and grad:numel() < ys[1]:numel()
      local tol = (exact and not summed) and 0 or TOL[dt]
      assert(r <= tol, string.format("%s d%d: relative difference %.3g (tolerance %g)", label, k, r, tol))
      worst[key][2], worst[key][4] = math.max(worst[key][2], r), math.max(worst[key][4], abs)
    end
  end
  table.sort(keys)
  for _, key in ipairs(keys) do
    local w = worst[key] -- relative (as checked) and absolute
    print(string.format("  %-22s values %.3g (abs %.3g)  grads %.3g (abs %.3g)", key, w[1], w[3], w[2], w[4]))
  end
end)
