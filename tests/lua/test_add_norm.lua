-- F.add_layer_norm / F.add_rms_norm (the residual add fused with the norm): finite-difference
-- gradient checks in f64 through both outputs (and through either alone), values and gradients
-- against the unfused composition (x + r, then the norm) in f32, bf16 and f16, the autograd
-- record, backward twice with retain_graph, bad input, memory; and nn.Block / the models
-- computing the same loss and gradients (the same bits on the CPU) with the fused path on and off.
local lt = require "lutra"
local models = require "lutra.models"
local Block = require "lutra.nn.block"
local T = require "lutra.testing"
local check, close, equal, fails = T.gradcheck, T.assert_close, T.assert_equal, T.assert_error
local F = lt.F

local leaf = T.random_leaf

test("gradcheck: both outputs, either output alone, with and without affine parameters", function()
  check(function(x, r, w, b)
    local res, y = F.add_layer_norm(x, r, w, b, 1e-5)
    return res, y
  end, {leaf({2, 3, 6}), leaf({2, 3, 6}, true), leaf({6}), leaf({6})})
  check(function(x, r, w)
    local res, y = F.add_rms_norm(x, r, w)
    return res, y
  end, {leaf({4, 5}, true), leaf({4, 5}), leaf({5})})
  check(function(x, r) return (select(2, F.add_layer_norm(x, r))) end, {leaf({3, 7}), leaf({3, 7})}) -- y only
  check(function(x, r, w) return (F.add_rms_norm(x, r, w)) end, {leaf({3, 7}), leaf({3, 7}), leaf({7})}) -- res only
  check(function(x, r) -- res used twice more downstream: its gradient sums with the norm's
    local res, y = F.add_layer_norm(x, r)
    return res * res + y, y * 2
  end, {leaf({2, 1}), leaf({2, 1})})
  local fixed = lt.randn(3, 4, "f64")
  check(function(x, w) -- residual without grad, a weight with
    local res, y = F.add_rms_norm(x, fixed, w)
    return res, y
  end, {leaf({3, 4}), leaf({4})})
end)

-- L = sum(y * A) + sum(res * B), fused or as x + r then the norm.
local function run(fused, center, x, r, w, b, A, B)
  local res, y
  if fused then
    if center then res, y = F.add_layer_norm(x, r, w, b) else res, y = F.add_rms_norm(x, r, w) end
  else
    res = x + r
    if center then y = F.layer_norm(res, w, b) else y = F.rms_norm(res, w) end
  end
  local loss = (y:float() * A):sum() + (res:float() * B):sum()
  loss:backward()
  return res, y
end

test("fused vs unfused: equal values, f32 gradients equal, 16-bit within a rounding (layernorm, rmsnorm)", function()
  for _, dt in ipairs {"f32", "bf16", "f16"} do
    for _, center in ipairs {true, false} do
      local shape = {3, 5, 33}
      local x0, r0 = lt.randn(shape, dt), lt.randn(shape, dt)
      local w0, b0 = lt.randn(33) * 0.1 + 1, lt.randn(33) * 0.1 -- f32 weights, as the models keep them
      local A, B = lt.randn(shape), lt.randn(shape)
      local out = {}
      for k, fused in ipairs {true, false} do
        local x, r = x0:clone():requires_grad_(), r0:clone():transpose(0, 1):contiguous():transpose(0, 1):requires_grad_()
        local w, b = w0:clone():requires_grad_(), b0:clone():requires_grad_()
        local res, y = run(fused, center, x, r, w, center and b or nil, A, B)
        out[k] = {res = res, y = y, gx = x.grad, gr = r.grad, gw = w.grad, gb = center and b.grad or nil}
      end
      local what = dt .. (center and " layernorm" or " rmsnorm")
      close(out[1].res, out[2].res, {rtol = 0, atol = 0, msg = what .. " res"})
      close(out[1].y, out[2].y, {rtol = 0, atol = 0, msg = what .. " y"})
      -- dw, db: the same kernel on the same inputs; dx: f32 the same bits (the plain dx, then the
      -- add); 16-bit one rounding (fused) or two (unfused) of the same f32 value, so at most an
      -- ulp of the dtype apart (2^-7 bf16, 2^-10 f16, relative)
      close(out[1].gw, out[2].gw, {rtol = 0, atol = 0, msg = what .. " dw"})
      if center then close(out[1].gb, out[2].gb, {rtol = 0, atol = 0, msg = what .. " db"}) end
      local tol = dt == "f32" and 0 or dt == "bf16" and 2 ^ -7 or 2 ^ -10 -- f32: the same bits
      local scale = out[2].gx:float():abs():max():item()
      close(out[1].gx:float(), out[2].gx:float(), {rtol = tol, atol = tol * scale, msg = what .. " dx"})
      close(out[1].gr:float(), out[1].gx:float(), {rtol = 0, atol = 0, msg = what .. " dresidual"})
    end
  end
end)

test("autograd record: grad_fn names, backward twice with retain_graph, a freed graph", function()
  local x, r = leaf({2, 4}), leaf({2, 4})
  local res, y = F.add_layer_norm(x, r)
  equal(res.grad_fn, "AddNormBackward")
  equal(y.grad_fn, "AddNormOutput")
  local loss = (y * y):sum() + res:sum()
  loss:backward({retain_graph = true})
  local g1 = x.grad:clone()
  loss:backward()
  close(x.grad, g1 * 2, {rtol = 1e-12, atol = 1e-14})
  fails("backward through the graph a second time", function() loss:backward() end)
  -- no grad mode: plain tensors
  local res2, y2 = lt.no_grad(function() return F.add_rms_norm(x, r) end)
  equal({res2.requires_grad, y2.requires_grad}, {false, false})
end)

test("bad input: missing residual, shapes and dtypes that differ", function()
  local x = lt.randn(2, 4)
  fails("add_layer_norm: residual must be a tensor, got nil", function() F.add_layer_norm(x, nil) end)
  fails("add_rms_norm: residual is [2,5] f32 cpu, expected the shape and dtype of x ([2,4] f32 cpu)",
    function() F.add_rms_norm(x, lt.randn(2, 5)) end)
  fails("add_layer_norm: residual is [2,4] f64 cpu", function() F.add_layer_norm(x, lt.randn(2, 4, "f64")) end)
  fails("add_layer_norm: weight is [5] f32 cpu, expected [4]", function() F.add_layer_norm(x, x, lt.ones(5)) end)
end)

-- Loss and parameter gradients of a module run with the fused path on, then off.
local function both_ways(build, input)
  local results = {}
  local calls, add_ln, add_rms = 0, F.add_layer_norm, F.add_rms_norm
  F.add_layer_norm = function(...) calls = calls + 1; return add_ln(...) end
  F.add_rms_norm = function(...) calls = calls + 1; return add_rms(...) end
  for k, fuse in ipairs {true, false} do
    Block.fuse_residual_norm = fuse
    calls = 0
    local m = build()
    local loss = input(m)
    loss:backward()
    local grads = {}
    for name, p in m:named_parameters() do grads[name] = p.grad end
    results[k] = {loss = loss:item(), grads = grads}
    assert(fuse == (calls > 0), "the fused op ran " .. calls .. " times with fuse_residual_norm = " .. tostring(fuse))
  end
  Block.fuse_residual_norm, F.add_layer_norm, F.add_rms_norm = true, add_ln, add_rms
  return results[1], results[2]
end

test("nn.Block: the same output and gradients with the fused add + ln_2 (layernorm and rmsnorm)", function()
  for _, norm in ipairs {"layernorm", "rmsnorm"} do
    local x = lt.randn(2, 5, 16)
    local state
    local fused, plain = both_ways(function()
      lt.manual_seed(5)
      local blk = lt.nn.Block {d_model = 16, n_head = 4, norm = norm, mlp = norm == "rmsnorm" and "swiglu" or "gelu"}
      if state then blk:load_state_dict(state) else state = blk:state_dict() end
      return blk
    end, function(blk) return (blk(x) * blk(x)):sum() end)
    close(fused.loss, plain.loss, {rtol = 0, atol = 0, msg = norm}) -- f32 on the CPU: the same bits
    for name, g in pairs(plain.grads) do close(fused.grads[name], g, {rtol = 0, atol = 0, msg = norm .. " " .. name}) end
  end
end)

test("models: gpt2 and llama losses and gradients fused and unfused are the same bits (f64)", function()
  for _, arch in ipairs {"gpt2", "llama"} do
    local cfg = {arch = arch, n_layer = 2, n_head = 4, d_model = 32, vocab_size = 64, block_size = 16, dtype = "f64"}
    if arch == "llama" then cfg.n_kv_head = 2 end
    local idx, targets = lt.randint(64, {2, 16}), lt.randint(64, {2, 16})
    local state
    local fused, plain = both_ways(function()
      local m = models.build(cfg)
      if state then m:load_state_dict(state) else state = m:state_dict() end
      return m
    end, function(m) return select(2, m(idx, targets)) end)
    close(fused.loss, plain.loss, {rtol = 0, atol = 0, msg = arch})
    local n = 0
    for name, g in pairs(plain.grads) do
      close(fused.grads[name], g, {rtol = 0, atol = 0, msg = arch .. " " .. name})
      n = n + 1
    end
    assert(n > 10)
  end
end)

test("F.layer_norm_backward / F.rms_norm_backward with dres: the plain backward plus dres", function()
  local x, w, b = lt.randn(3, 9, "f64"), lt.randn(9, "f64"), lt.randn(9, "f64")
  local dout, dres = lt.randn(3, 9, "f64"), lt.randn(3, 9, "f64")
  local _, mean, rstd = F.layer_norm(x, w, b)
  local dx0, dw0, db0 = F.layer_norm_backward(dout, x, w, mean, rstd)
  local dx1, dw1, db1 = F.layer_norm_backward(dout, x, w, mean, rstd, dres)
  close(dx1, dx0 + dres, {rtol = 1e-14, atol = 1e-14})
  close(dw1, dw0, {rtol = 0, atol = 0})
  close(db1, db0, {rtol = 0, atol = 0})
  local _, rs = F.rms_norm(x, w)
  local gx0, gw0 = F.rms_norm_backward(dout, x, w, rs)
  local gx1, gw1 = F.rms_norm_backward(dout, x, w, rs, dres)
  close(gx1, gx0 + dres, {rtol = 1e-14, atol = 1e-14})
  close(gw1, gw0, {rtol = 0, atol = 0})
  fails("rms_norm_backward_add: dres is [3,8] f64 cpu", function() F.rms_norm_backward(dout, x, w, rs, lt.randn(3, 8, "f64")) end)
end)

test("memory: after backward only the gradients are left (no GC), fused as unfused", function()
  local function allocated() return lt.memory_stats().allocated end
  local function full_gc() collectgarbage() collectgarbage() end
  local left = {}
  for k, fused in ipairs {true, false} do
    full_gc()
    local x, r = lt.randn({64, 1024}, {requires_grad = true}), lt.randn({64, 1024}, {requires_grad = true})
    local base = allocated()
    local loss
    do
      local res, y
      if fused then res, y = F.add_rms_norm(x, r) else res = x + r; y = F.rms_norm(res) end
      loss = (y * y):sum() + (res * 2):sum()
    end
    full_gc()
    loss:backward()
    left[k] = allocated() - base
    local grads = 2 * x:numel() * 4
    assert(left[k] <= grads + 4096, string.format("fused %s: left %d bytes, grads %d", tostring(fused), left[k], grads))
  end
end)
