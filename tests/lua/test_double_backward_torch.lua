-- Gradients of gradients against PyTorch: tests/py/ref_double_backward.py runs each op (the fused
-- ones too: F.scaled_dot_product_attention with GQA, a window, segments; F.add_layer_norm,
-- F.add_rms_norm, against their definitions; and an MLP, causal attention composed from matmul and
-- softmax, a LayerNorm-GELU-cross-entropy block, a SwiGLU with RMSNorm, an embedding) in f64 with random inputs, takes L = sum(w y^3), the first
-- gradients G = dL/dx with create_graph, then P = sum(G v) (a Hessian-vector product) or
-- P = ||dL/dx||^2 (a gradient penalty) and its gradients H = dP/dx. The same here must match:
-- G and H within 1e-12 of the largest value (f64: a few roundings of a different order of the
-- same sums). Skipped without python3 and torch (a failure where LUTRA_REQUIRE_TORCH=1).
local lt = require "lutra"
local T = require "lutra.testing"
local F = lt.F

local TOL = 1e-12 -- relative to the largest value

local here = debug.getinfo(1, "S").source:match("^@(.*)[/\\][^/\\]+$") or "tests/lua"
local SCRIPT = here .. "/../py/ref_double_backward.py"

local function reference()
  local py = T.need_python("torch")
  local out = os.tmpname()
  local ok = os.execute(string.format("%s '%s' %s", py, SCRIPT, out))
  if ok ~= true and ok ~= 0 then error(SCRIPT .. " failed") end
  return out
end

local function parse(path)
  local cases, case = {}, nil
  for line in io.lines(path) do
    local tag, rest = line:match("^(%S+)%s*(.*)$")
    if tag == "case" then
      local name, mode = rest:match("^(%S+) (%S+)$")
      case = {name = name, mode = mode, t = {}, diff = {}}
      cases[#cases + 1] = case
    elseif tag == "diff" then
      for n in rest:gmatch("%S+") do case.diff[#case.diff + 1] = n end
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

local function make(spec)
  if #spec.shape == 0 then return lt.tensor(spec.vals[1], {dtype = spec.dtype}) end
  return lt.tensor(spec.vals, {dtype = spec.dtype}):reshape(spec.shape)
end

-- max |a - b| over max |b|
local function rel_diff(a, b)
  local d = (a - b):abs():max():item()
  local m = b:abs():max():item()
  return d / (m > 0 and m or 1)
end

local function gelu(x) return x:gelu() end

local function rms_norm(x, w) return (F.rms_norm(x, w, 1e-6)) end

local function attention(a) -- (B, T, D), causal, composed
  local q, k, v = a.q, a.k, a.v
  local s = q:matmul(k:transpose(-1, -2)) / math.sqrt(q:size(-1))
  local n = s:size(-1)
  local mask = F.triu(lt.ones(n, n), 1):ne(0)
  return lt.softmax(F.masked_fill(s, mask, -math.huge), -1):matmul(v)
end

local function mlp(a) return F.linear(F.linear(a.x, a.w1, a.b1):tanh(), a.w2, a.b2) end

-- name -> f(inputs) -> y, as the reference's
local CASES = {
  add = function(a) return a.a + a.b end,
  sub = function(a) return a.a - a.b end,
  mul = function(a) return a.a * a.b end,
  div = function(a) return a.a / a.b end,
  neg = function(a) return -a.a end,
  pow = function(a) return a.a ^ a.b end,
  pow_scalar = function(a) return a.a ^ 3 end,
  rpow = function(a) return 2.0 ^ a.a end,
  rdiv = function(a) return 1.5 / a.a end,
  scalars = function(a) return (a.a * 2.5 + 1) - 0.5 end,
  maximum = function(a) return lt.maximum(a.a, a.b) end,
  clamp = function(a) return a.a:clamp(-0.5, 0.5) end,
  sum_dim = function(a) return a.a:sum(1) end,
  mean_keepdim = function(a) return a.a:mean({0, 2}, true) end,
  var = function(a) return a.a:var(-1) end,
  std = function(a) return a.a:std(0) end,
  amax = function(a) return (a.a:max({1})) end,
  prod = function(a) return a.a:prod(1) end,
  matmul = function(a) return a.a:matmul(a.b) end,
  bmm = function(a) return a.a:matmul(a.b) end,
  linear = function(a) return F.linear(a.x, a.w, a.b) end,
  reshape = function(a) return a.a:reshape(2, 6) end,
  transpose = function(a) return a.a:transpose(0, 2) end,
  permute = function(a) return a.a:permute(2, 0, 1) end,
  narrow = function(a) return a.a:narrow(0, 1, 3) end,
  select = function(a) return a.a:select(1, 2) end,
  expand = function(a) return a.a:expand(3, 4) end,
  slice_step = function(a) return a.a:slice(0, 1, 6, 2) end,
  index = function(a) return a.a[{{1, 3}, 2}] end,
  cat = function(a) return lt.cat({a.a, a.b}, 1) end,
  stack = function(a) return lt.stack({a.a, a.b}, 0) end,
  softmax = function(a) return lt.softmax(a.a, -1) end,
  softmax_dim0 = function(a) return lt.softmax(a.a, 0) end,
  log_softmax = function(a) return lt.log_softmax(a.a, -1) end,
  cross_entropy = function(a) return (F.cross_entropy(a.logits, a.t, {ignore_index = -100})) end,
  cross_entropy_none = function(a) return (F.cross_entropy(a.logits, a.t, {reduction = "none"})):reshape(2, 3) end,
  embedding = function(a) return F.embedding(a.ids, a.w) end,
  gather = function(a) return F.gather(a.x, 1, a.i) end,
  index_select = function(a) return F.index_select(a.x, 0, a.i) end,
  scatter_add = function(a) return F.scatter_add(a.x, 1, a.i, a.src) end,
  index_add = function(a) return F.index_add(a.x, 0, a.i, a.src) end,
  where = function(a) return lt.where(a.c, a.a, a.b) end,
  masked_fill = function(a) return F.masked_fill(a.x, a.m, 0.25) end,
  layer_norm = function(a) return (F.layer_norm(a.x, a.w, a.b, 1e-5)) end,
  rms_norm = function(a) return rms_norm(a.x, a.w) end,
  cumsum = function(a) return F.cumsum(a.a, 1) end,
  tril = function(a) return F.tril(a.a, 1) end,
  cumprod = function(a) return F.cumprod(a.a, 1) end,
  sort = function(a) return (F.sort(a.a, 1)) end,
  topk = function(a) return (F.topk(a.a, 2, 1)) end,
  rope = function(a) return F.rope(a.x, nil, 10000.0) end,
  noncontiguous = function(a) return a.a:t():tanh() * a.b:exp() end,
  add_layer_norm = function(a)
    local res, y = F.add_layer_norm(a.x, a.r, a.w, a.b, 1e-5)
    return y + res * 0.5
  end,
  add_rms_norm = function(a)
    local res, y = F.add_rms_norm(a.x, a.r, a.w, 1e-6)
    return y + res * 0.5
  end,
  sdpa_causal_gqa_window = function(a) return (F.scaled_dot_product_attention {a.q, a.k, a.v, causal = true, window = 3}) end,
  sdpa_segments = function(a)
    return (F.scaled_dot_product_attention {a.q, a.k, a.v, causal = true, segment_ids = a.seg, scale = 0.4})
  end,
  mlp_penalty = mlp,
  mlp_hvp = mlp,
  attention_penalty = attention,
  attention_hvp = attention,
  block_penalty = function(a)
    local h = F.linear(gelu(F.linear((F.layer_norm(a.x, a.g, a.bn, 1e-5)), a.w1)), a.w2)
    return (F.cross_entropy(h:reshape(6, 5), a.t:reshape(6)))
  end,
  swiglu_hvp = function(a)
    local h = rms_norm(a.x, a.g)
    return F.linear(F.linear(h, a.w1):silu() * F.linear(h, a.w3), a.w2)
  end,
  embedding_penalty = function(a) return lt.log_softmax(F.linear(F.embedding(a.ids, a.w), a.wo), -1) end,
}
for _, name in ipairs {"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu", "silu", "abs", "sin", "cos",
                       "square", "reciprocal", "erf", "gelu_erf"} do
  CASES[name] = function(a) return a.a[name](a.a) end
end

test("double backward matches torch's (f64: first gradients, penalties, Hessian-vector products)", function()
  local path = reference()
  local cases = parse(path)
  os.remove(path)
  assert(#cases >= 60, "too few cases: " .. #cases)
  local worst_g, worst_h, seen = 0, 0, {}
  for _, c in ipairs(cases) do
    local fn = assert(CASES[c.name], "no Lua definition of case " .. c.name)
    seen[c.name] = true
    local args, xs = {}, {}
    for key, spec in pairs(c.t) do
      local name = key:match("^in:(.*)$")
      if name then args[name] = make(spec) end
    end
    for i, name in ipairs(c.diff) do
      args[name].requires_grad = true
      xs[i] = args[name]
    end
    local y = fn(args)
    local L = (make(c.t.w) * y * y * y):sum()
    local G = lt.autograd.grad(L, xs, nil, {create_graph = true})
    local P
    if c.mode == "vjp" then
      for i, name in ipairs(c.diff) do
        local term = (G[i] * make(c.t["v:" .. name])):sum()
        P = P and P + term or term
      end
    else
      P = (G[1] * G[1]):sum()
    end
    local H = lt.autograd.grad(P, xs, nil, {allow_unused = true})
    for i, name in ipairs(c.diff) do
      local rg = rel_diff(G[i], make(c.t["G:" .. name]))
      local h = H[i] or lt.zeros_like(xs[i])
      local rh = rel_diff(h, make(c.t["H:" .. name]))
      worst_g, worst_h = math.max(worst_g, rg), math.max(worst_h, rh)
      assert(rg <= TOL, string.format("%s: first gradient of %s: relative difference %.3g", c.name, name, rg))
      assert(rh <= TOL, string.format("%s: second gradient of %s: relative difference %.3g", c.name, name, rh))
    end
  end
  for name in pairs(CASES) do assert(seen[name], "the reference has no case " .. name) end
  print(string.format("  %d cases: max relative difference %.3g (first gradients), %.3g (second)", #cases,
    worst_g, worst_h))
end)
