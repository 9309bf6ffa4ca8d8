-- np: 1
-- Pipeline schedules (lutra.dist.pp_schedule): the order of each stage's forwards and
-- backwards, deadlock freedom of every schedule (simulated), balance by parameters; and
-- whole pipelines in this one process (every stage a coroutine over a local transport)
-- against the unsplit model. No communication: one rank is enough.
local testing = require "lutra.testing"
local S = require "lutra.dist.pp_schedule"
local pp = require "lutra.dist.pp"
-- tests/dist/pp_helpers.lua, next to this file
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./") .. "pp_helpers.lua")
local MICRO = H.MICRO

-- ---- schedules -----------------------------------------------------------------------------

test("1f1b order: warmup P - s - 1 forwards, then one forward one backward, then cooldown", function()
  local expected = {
    [0] = "F1 F2 F3 F4 B1 F5 B2 F6 B3 B4 B5 B6",
    [1] = "F1 F2 F3 B1 F4 B2 F5 B3 F6 B4 B5 B6",
    [2] = "F1 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 B6",
    [3] = "F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6",
  }
  for s = 0, 3 do testing.assert_equal(S.describe(S.actions("1f1b", 4, s, 6)), expected[s], "stage " .. s) end
  -- fewer micro-batches than stages: all forwards, then all backwards
  testing.assert_equal(S.describe(S.actions("1f1b", 4, 0, 2)), "F1 F2 B1 B2")
  testing.assert_equal(S.describe(S.actions("gpipe", 3, 1, 3)), "F1 F2 F3 B1 B2 B3")
  local r = S.simulate("1f1b", 4, 8)
  for s = 0, 3 do testing.assert_equal(r.peak[s], 4 - s, "1f1b activations alive on stage " .. s) end
  r = S.simulate("gpipe", 4, 8)
  for s = 0, 3 do testing.assert_equal(r.peak[s], 8, "gpipe activations alive on stage " .. s) end
end)

test("interleaved order: groups of P micro-batches per chunk (Megatron)", function()
  testing.assert_equal(S.describe(S.actions("interleaved", 2, 0, 4, 2), 2),
    "F1.1 F2.1 F1.2 F2.2 F3.1 B1.2 F4.1 B2.2 F3.2 B1.1 F4.2 B2.1 B3.2 B4.2 B3.1 B4.1")
  testing.assert_equal(S.describe(S.actions("interleaved", 2, 1, 4, 2), 2),
    "F1.1 F2.1 F1.2 B1.2 F2.2 B2.2 F3.1 B1.1 F4.1 B2.1 F3.2 B3.2 F4.2 B4.2 B3.1 B4.1")
  -- m == P: every forward first
  testing.assert_equal(S.describe(S.actions("interleaved", 2, 1, 2, 2), 2), "F1.1 F2.1 F1.2 F2.2 B1.2 B2.2 B1.1 B2.1")
end)

test("every schedule completes without deadlock (sends never block, receives wait)", function()
  for _, kind in ipairs{"gpipe", "1f1b"} do
    for P = 1, 6 do
      for m = 1, 9 do S.simulate(kind, P, m) end
    end
  end
  for P = 1, 5 do
    for v = 1, 3 do
      for k = 1, 3 do S.simulate("interleaved", P, k * P, v) end
    end
  end
  -- the simulator does catch a bad order: stage 1 waiting for a backward that stage 0 runs late
  local actions = S.actions
  S.actions = function(kind, P, s, m, v)
    if s == 0 then return {{op = "F", micro = 1, chunk = 1}, {op = "B", micro = 1, chunk = 1}, {op = "F", micro = 2,
      chunk = 1}, {op = "B", micro = 2, chunk = 1}} end
    return {{op = "F", micro = 2, chunk = 1}, {op = "F", micro = 1, chunk = 1}, {op = "B", micro = 1, chunk = 1},
      {op = "B", micro = 2, chunk = 1}}
  end
  local ok, err = pcall(S.simulate, "gpipe", 2, 2)
  S.actions = actions
  assert(not ok and tostring(err):find("deadlock", 1, true), tostring(err))
end)

test("schedule options: clear errors", function()
  testing.assert_error("schedule must be", S.actions, "zigzag", 2, 0, 4)
  testing.assert_error("multiple of the pipeline size", S.actions, "interleaved", 4, 0, 6, 2)
  testing.assert_error("micro_batches must be a positive integer", S.actions, "1f1b", 2, 0, 0)
  testing.assert_error("needs schedule = \"interleaved\"", S.actions, "1f1b", 2, 0, 4, 2)
end)

test("balance by parameters: embeddings on the first stage, head on the last", function()
  testing.assert_equal(pp.balance_by_params({10, 10, 10, 10}, 0, 0, 2), {2, 2})
  testing.assert_equal(pp.balance_by_params({10, 10, 10, 10}, 20, 0, 2), {1, 3})
  testing.assert_equal(pp.balance_by_params({10, 10, 10, 10}, 0, 20, 2), {3, 1})
  testing.assert_equal(pp.balance_by_params({10, 40, 10, 10, 10, 10}, 0, 0, 3), {1, 1, 4})
  testing.assert_equal(pp.balance_by_params({1, 1, 1, 1}, 0, 0, 4), {1, 1, 1, 1})
end)

-- ---- communication programs (pp_program) ----------------------------------------------------

local Pg = require "lutra.dist.pp_program"

local function show_program(steps)
  local out = {}
  for _, st in ipairs(steps) do
    if st.action then
      out[#out + 1] = st.action.op .. st.action.micro
    elseif st.comm then
      local o = {}
      for _, op in ipairs(st.comm) do o[#o + 1] = (op.dir == "send" and "s:" or "r:") .. op.key end
      out[#out + 1] = "[" .. table.concat(o, ",") .. (st.wait and "" or " ~") .. "]"
    end
  end
  return table.concat(out, " ")
end

test("1f1b transfers: each send paired with the next receive (Megatron's batches)", function()
  -- act<vs>:<micro> goes into virtual stage vs, grad<vs>:<micro> likewise; "~": not waited for
  testing.assert_equal(show_program(Pg.program(S.actions("1f1b", 2, 0, 3), 2, 0, 1)),
    "F1 [s:act1:1 ~] F2 [s:act1:2,r:grad0:1] B1 F3 [s:act1:3,r:grad0:2] B2 [r:grad0:3] B3")
  testing.assert_equal(show_program(Pg.program(S.actions("1f1b", 2, 1, 3), 2, 1, 1)),
    "[r:act1:1] F1 B1 [s:grad0:1,r:act1:2] F2 B2 [s:grad0:2,r:act1:3] F3 B3 [s:grad0:3 ~]")
end)

test("every schedule's batches complete under NCCL's rules (in-order streams, rendezvous sends, no tags)", function()
  for _, kind in ipairs{"gpipe", "1f1b"} do
    for P = 1, 6 do
      for m = 1, 9 do Pg.simulate(kind, P, m) end
      Pg.simulate(kind, P, 1, 1, {eval = true})
    end
  end
  for P = 1, 5 do
    for v = 1, 4 do
      for k = 1, 3 do Pg.simulate("interleaved", P, k * P, v) end
      Pg.simulate("interleaved", P, P, v, {eval = true})
    end
  end
  -- the check bites: transfers posted one by one wait on each other in a cycle there, and
  -- interleaving's steps do not fit the 1f1b pairing
  testing.assert_error("deadlock", Pg.simulate, "1f1b", 2, 4, nil, {paired = false})
  testing.assert_error("deadlock", Pg.simulate, "1f1b", 4, 8, nil, {paired = false})
  testing.assert_error("deadlock", Pg.simulate, "interleaved", 2, 4, 2, {paired = true})
end)

test("interleaved transfers: a step's sends with the next step's receives", function()
  testing.assert_equal(show_program(Pg.program(S.actions("interleaved", 2, 1, 2, 2), 2, 1, 2, "stepped")),
    -- (stage 1 of 2, m = P: every forward first; chunk 2 is the last virtual stage: no receive
    -- before its backwards, whose gradients go to rank 0's chunk 2)
    "[r:act1:1] F1 [s:act2:1,r:act1:2] F2 [s:act2:2,r:act3:1] F1 [r:act3:2] F2 B1 [s:grad2:1 ~] "
      .. "B2 [s:grad2:2,r:grad1:1] B1 [s:grad0:1,r:grad1:2] B2 [s:grad0:2 ~]")
end)

-- ---- in-process pipelines --------------------------------------------------------------------

test("in-process pipeline, gpt2 (tied), 1f1b over 2 stages and interleaved over 2 x 2 = the unsplit model", function()
  H.in_process("gpt2", 2, {schedule = "1f1b", micro_batches = MICRO})
  H.in_process("gpt2", 2, {schedule = "interleaved", micro_batches = MICRO, virtual_stages = 2})
end)

test("in-process pipeline, llama, gpipe over 4 stages = the unsplit model", function()
  H.in_process("llama", 4, {schedule = "gpipe", micro_batches = MICRO})
end)
