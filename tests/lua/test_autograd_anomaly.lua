-- lutra.detect_anomaly: the first op whose output (forward) or gradient (backward) holds a nan
-- or inf raises, naming the op and the line of this file that ran it (or, in backward, the
-- line of the forward that made the node). Lines are taken with debug.getinfo on the line of
-- the call, so the expected messages are exact.
local lt = require "lutra"
local T = require "lutra.testing"
local equal, fails = T.assert_equal, T.assert_error

local FILE = debug.getinfo(1, "S").source:sub(2)
local function line() return debug.getinfo(2, "l").currentline end

-- Runs fn (which returns the line it ran the op on, and raises) and returns that line and the error.
local function caught(fn)
  local at
  local ok, err = pcall(function() at = fn() end)
  assert(not ok, "expected an error")
  return err, at
end

test("off by default: a nan goes through silently", function()
  equal(lt.is_anomaly_enabled(), false)
  local x = lt.tensor({1, 0, 2}, {requires_grad = true})
  local y = x:log() * 0
  y:sum():backward()
  assert(x.grad:tolist()[2] ~= x.grad:tolist()[2], "0 * log(0)'s gradient is nan")
end)

test("forward: the op and the caller's line, at the line of the op", function()
  local x = lt.tensor({1, 0, 2, 3}, {requires_grad = true})
  local at
  local err = caught(function()
    lt.detect_anomaly(function()
      local y = x * 2
      at = line(); local _ = y:log()
    end)
  end)
  equal(err, string.format("%s:%d: detect_anomaly: the output of log holds 0 nan and 1 inf (of 4 values)", FILE, at))
  equal(lt.is_anomaly_enabled(), false) -- the scope ended with the error
end)

test("forward: the line is the caller's also through lutra's own modules (a model's forward)", function()
  lt.manual_seed(3)
  local model = lt.models.build{arch = "gpt2", n_layer = 1, n_head = 2, d_model = 8, vocab_size = 11, block_size = 4}
  local w = model.blocks[1].mlp.fc.weight
  lt.no_grad(function() w[{1, 2}] = 0 / 0 end)
  local x = lt.tensor({{1, 2, 3, 4}}, {dtype = "i64"})
  local y = lt.tensor({{2, 3, 4, 5}}, {dtype = "i64"})
  local at
  local err = caught(function()
    lt.detect_anomaly(true)
    local ok, e = pcall(function()
      at = line(); model:forward(x, y)
    end)
    lt.detect_anomaly(false)
    error(e, 0)
  end)
  -- the first op whose output holds a nan is the linear that uses the poisoned weight (4 rows, 1 nan column)
  equal(err, string.format("%s:%d: detect_anomaly: the output of linear holds 4 nan and 0 inf (of 128 values)",
    FILE, at))
  -- off again: the same forward gives a nan loss, silently
  local _, loss = model:forward(x, y)
  assert(loss:item() ~= loss:item())
end)

test("backward: the node class, its op and the forward line that made it", function()
  local x = lt.tensor({4, 0, 1}, {requires_grad = true})
  local fwd, bwd
  local err = caught(function()
    lt.detect_anomaly(function()
      fwd = line(); local y = x:sqrt() -- finite: sqrt(0) = 0
      local z = (y * 3):sum()
      bwd = line(); z:backward()
    end)
  end)
  equal(err, string.format("%s:%d: detect_anomaly: SqrtBackward (the backward of sqrt, from the forward at %s:%d) "
    .. "returned a gradient for its input 1 that holds 0 nan and 1 inf (of 3 values)", FILE, bwd, FILE, fwd))
  -- the backward of the nodes before it (the mul) ran; the leaf got nothing
  equal(x.grad, nil)
end)

test("backward of a graph recorded before it was on says so", function()
  local x = lt.tensor({0, 1}, {requires_grad = true})
  local y = x:sqrt():sum()
  local err = caught(function() lt.detect_anomaly(function() y:backward() end) end)
  assert(err:find("SqrtBackward (the backward of sqrt, from the forward at ? (recorded before detect_anomaly was on)) "
    .. "returned a gradient for its input 1 that holds 0 nan and 1 inf (of 2 values)", 1, true), err)
end)

test("the scoped form returns fn's values and restores the setting; the switch returns the previous one", function()
  local a, b = lt.detect_anomaly(function(p, q) return p + 1, q .. "!" end, 1, "x")
  equal({a, b}, {2, "x!"})
  equal(lt.is_anomaly_enabled(), false)
  equal(lt.detect_anomaly(true), false)
  equal(lt.is_anomaly_enabled(), true)
  equal(lt.detect_anomaly(function() return lt.is_anomaly_enabled() end), true)
  equal(lt.is_anomaly_enabled(), true) -- a scope inside "on" leaves it on
  equal(lt.detect_anomaly(false), true)
  equal(lt.is_anomaly_enabled(), false)
  fails("detect_anomaly: expected true, false or a function to run with it on, got string", function()
    lt.detect_anomaly("yes")
  end)
end)

test("finite values pass, unchanged; ops nothing of which requires grad are not checked", function()
  local x = lt.tensor({1, 2, 3}, {requires_grad = true})
  local plain = lt.tensor({0, 1})
  local g = lt.detect_anomaly(function()
    local y = (x:exp() * x):sum()
    y:backward()
    local z = plain:log() -- no input requires grad: not recorded, not checked (documented)
    assert(z:tolist()[1] == -1 / 0)
    return x.grad:tolist()
  end)
  local ref = {}
  for i, v in ipairs {1, 2, 3} do ref[i] = lt.tensor({v}):exp():item() * (1 + v) end
  for i = 1, 3 do assert(math.abs(g[i] - ref[i]) <= 1e-5 * ref[i], string.format("%d: %g vs %g", i, g[i], ref[i])) end
end)

test("an error in an in-place op leaves autograd usable", function()
  local x = lt.tensor({1, -1}, {requires_grad = true})
  local y = x * 1
  local err = caught(function() lt.detect_anomaly(function() y:sqrt_() end) end)
  assert(err:find("detect_anomaly: the output of sqrt holds 1 nan and 0 inf (of 2 values)", 1, true), err)
  -- a fresh graph saves and backwards normally
  local z = (x * x):sum()
  z:backward()
  equal(x.grad:tolist(), {2, -2})
end)
