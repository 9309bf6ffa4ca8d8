-- lutra.optim.schedule: closed-form values, the peer's lr_at (../shared/peers/torch_charlm.py)
-- to the last bit, WSD, and bad settings.
local optim = require "lutra.optim"
local T = require "lutra.testing"
local S = optim.schedule
local close, equal, fails = T.assert_close, T.assert_equal, T.assert_error

-- lr_at(it) of torch_charlm.py (lr 1e-3, warmup 100, cosine to 1e-4 over 2000 iterations),
-- as Python prints the doubles (repr: the shortest string that reads back exactly).
local PEER = {
  {0, 1e-05}, {1, 2e-05}, {7, 8e-05}, {42, 0.00043000000000000004}, {98, 0.00099}, {99, 0.001}, {100, 0.001},
  {101, 0.0009999993848585915}, {537, 0.0008875499813337069}, {1000, 0.0005871607054625496}, {1050, 0.00055},
  {1234, 0.0004151949927985983}, {1999, 0.00010000061514140841},
}

test("cosine with warmup is the peer's lr_at, bit for bit", function()
  local sched = S.cosine{lr = 1e-3, min_lr = 1e-4, warmup = 100, total = 2000}
  for _, c in ipairs(PEER) do
    local got = sched(c[1])
    if got ~= c[2] then error(string.format("step %d: %.17g, the peer has %.17g", c[1], got, c[2])) end
  end
  equal(sched(2000), 1e-4)
  equal(sched(5000), 1e-4) -- held at min_lr past the end
  -- the peer's formula written out, at every step
  for it = 0, 1999 do
    local want
    if it < 100 then
      want = 1e-3 * (it + 1) / 100
    else
      local r = (it - 100) / (2000 - 100)
      want = 1e-4 + 0.5 * (1 + math.cos(math.pi * r)) * (1e-3 - 1e-4)
    end
    if sched(it) ~= want then error("step " .. it) end
  end
end)

test("cosine, linear, constant: closed-form values", function()
  local cos = S.cosine{lr = 1, total = 10}
  equal(cos(0), 1)
  close(cos(5), 0.5, {rtol = 1e-15})
  close(cos(10), 0, {atol = 1e-16})
  close(cos(2), 0.5 * (1 + math.cos(math.pi * 0.2)), {rtol = 1e-15})
  local lin = S.linear{lr = 2, min_lr = 1, warmup = 4, total = 14}
  equal(lin(0), 0.5)
  equal(lin(3), 2)
  equal(lin(4), 2)
  close(lin(9), 1.5, {rtol = 1e-15})
  equal(lin(14), 1)
  equal(lin(100), 1)
  local const = S.constant{lr = 3e-4, warmup = 3}
  close({const(0), const(1), const(2)}, {1e-4, 2e-4, 3e-4}, {rtol = 1e-15})
  equal({const(2), const(3), const(1000)}, {3e-4, 3e-4, 3e-4})
  equal(S.constant{lr = 0.1}(0), 0.1)
end)

test("wsd: warmup, stable, then the decay over the last decay_frac of the run", function()
  local w = S.wsd{lr = 1, min_lr = 0.1, warmup = 10, total = 100, decay_frac = 0.2}
  equal(w.decay_start, 80)
  equal(w.decay_steps, 20)
  equal(w(0), 0.1)
  equal(w(9), 1)
  equal(w(10), 1)
  equal(w(79), 1)
  equal(w(80), 1)
  close(w(90), 0.55, {rtol = 1e-15})
  close(w(100), 0.1, {rtol = 1e-15})
  close(w(1000), 0.1, {rtol = 1e-15})
  local sq = S.wsd{lr = 1, total = 100, decay_frac = 0.25, decay = "sqrt"}
  close(sq(79), 0.6, {rtol = 1e-15}) -- r = 4/25
  local wc = S.wsd{lr = 1, total = 100, decay = "cosine"}
  equal(wc.decay_steps, 10)
  close(wc(95), 0.5, {rtol = 1e-15})
  -- every schedule is a pure function of the step: any order, any number of calls
  local a, b = {}, {}
  for it = 0, 120 do a[it] = w(it) end
  for it = 120, 0, -1 do b[it] = w(it) end
  for it = 0, 120 do equal(a[it], b[it]) end
end)

test("make builds a schedule from a config table; settings print", function()
  local s = S.make{kind = "cosine", lr = 1e-3, min_lr = 1e-4, warmup = 100, total = 2000}
  equal(s(537), 0.0008875499813337069)
  equal(s.kind, "cosine")
  equal(tostring(s), "schedule.cosine{lr=0.001, min_lr=0.0001, warmup=100, total=2000}")
  equal(S.make{kind = "wsd", lr = 1, total = 10}.decay, "linear")
  assert(S.is_schedule(s) and not S.is_schedule(function() end))
end)

test("bad settings raise clear errors", function()
  fails("schedule.cosine: total must be a number", S.cosine, {lr = 1})
  fails("total (10) must be greater than warmup (10)", S.cosine, {lr = 1, warmup = 10, total = 10})
  fails("warmup must be an integer", S.linear, {lr = 1, warmup = 1.5, total = 10})
  fails("lr must be >= 0", S.constant, {lr = -1})
  fails("unknown setting 'min_LR'", S.cosine, {lr = 1, total = 10, min_LR = 0})
  fails("unknown setting 'total'", S.constant, {lr = 1, total = 10})
  fails("decay_frac must be in [0, 1]", S.wsd, {lr = 1, total = 10, decay_frac = 2})
  fails("decay must be \"linear\", \"cosine\" or \"sqrt\"", S.wsd, {lr = 1, total = 10, decay = "exp"})
  fails("the decay (9 steps) starts before warmup (5 steps) ends", S.wsd, {lr = 1, warmup = 5, total = 10, decay_frac = 0.9})
  fails("unknown kind step", S.make, {kind = "step", lr = 1})
  fails("expected a table of settings", S.cosine, 3)
  local s = S.cosine{lr = 1, total = 10}
  fails("step must be an integer >= 0", s, -1)
  fails("step must be an integer >= 0", s, 0.5)
end)
