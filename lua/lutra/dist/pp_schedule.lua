-- lutra.dist.pp_schedule — the order in which one pipeline stage runs the forwards and
-- backwards of m micro-batches: pure functions of (schedule, pp size, stage, m, v), no
-- tensors, no communication, so that they can be checked (and simulated) on their own.
--
--   local S = require "lutra.dist.pp_schedule"
--   S.actions("1f1b", P, s, m)      -- {{op = "F", micro = 1, chunk = 1}, {op = "B", ...}, ...}
--   S.actions("interleaved", P, s, m, v)
--   S.simulate("1f1b", P, m, v)     -- runs all P stages' lists against each other; errors on a
--                                   -- deadlock; returns {order = {[s] = "F1 F2 B1 ..."}, peak = {[s] = n}}
--
-- Stages s = 0 .. P-1 (pp ranks), micro-batches 1 .. m, local chunks 1 .. v. Chunk k of
-- stage s is the virtual stage vs = (k - 1) * P + s (Megatron's interleaving); without
-- interleaving v = 1 and vs = s. F(vs, i) needs F(vs - 1, i)'s activation; B(vs, i) needs
-- B(vs + 1, i)'s gradient and F(vs, i).
--   gpipe        every forward (1..m), then every backward (1..m)
--   1f1b         warmup: P - s - 1 forwards; steady: one forward, one backward; cooldown:
--                the remaining backwards. At most P - s activations alive on stage s.
--   interleaved  Megatron's interleaved 1F1B over v chunks per stage: forwards go in groups
--                of P micro-batches per chunk (chunk 1 for micro 1..P, chunk 2 for 1..P, ...,
--                then micro P+1..2P), backwards likewise from the last chunk; warmup
--                (P - s - 1) * 2 + (v - 1) * P forwards (all of them when m == P). m must be
--                a multiple of P.
local errors = require "lutra.errors"

local raise = errors.raise

local M = {}

M.kinds = {gpipe = true, ["1f1b"] = true, interleaved = true}

local function F(i, k) return {op = "F", micro = i, chunk = k or 1} end
local function B(i, k) return {op = "B", micro = i, chunk = k or 1} end

local function gpipe(P, s, m)
  local list = {}
  for i = 1, m do list[#list + 1] = F(i) end
  for i = 1, m do list[#list + 1] = B(i) end
  return list
end

local function one_f_one_b(P, s, m)
  local list = {}
  local warmup = math.min(P - s - 1, m)
  for i = 1, warmup do list[#list + 1] = F(i) end
  for i = 1, m - warmup do
    list[#list + 1] = F(warmup + i)
    list[#list + 1] = B(i)
  end
  for i = m - warmup + 1, m do list[#list + 1] = B(i) end
  return list
end

-- Megatron's forward_backward_pipelining_with_interleaving, iteration j = 0 .. m*v - 1.
local function interleaved(P, s, m, v)
  local total = m * v
  local function chunk_of(j, forward)
    local c = math.floor((j % (P * v)) / P) -- 0-based
    if not forward then c = v - 1 - c end
    return c + 1
  end
  local function micro_of(j) return math.floor(j / (P * v)) * P + j % P + 1 end
  local warmup
  if m == P then
    warmup = total
  else
    warmup = math.min((P - s - 1) * 2 + (v - 1) * P, total)
  end
  local list = {}
  for j = 0, warmup - 1 do list[#list + 1] = F(micro_of(j), chunk_of(j, true)) end
  for j = 0, total - warmup - 1 do
    local jf = j + warmup
    list[#list + 1] = F(micro_of(jf), chunk_of(jf, true))
    list[#list + 1] = B(micro_of(j), chunk_of(j, false))
    list[#list].paired = true -- one step with the forward before it (pp_program batches them)
  end
  for j = total - warmup, total - 1 do list[#list + 1] = B(micro_of(j), chunk_of(j, false)) end
  return list
end

local function posint(v) return type(v) == "number" and v >= 1 and v == math.floor(v) end

-- Checks (kind, P, s, m, v); errors name the bad value. Returns v (1 unless interleaved).
function M.check(kind, P, s, m, v, who)
  who = who or "pp_schedule"
  if not M.kinds[kind] then
    raise(string.format("%s: schedule must be \"1f1b\", \"gpipe\" or \"interleaved\", got %s", who, tostring(kind)))
  end
  if not posint(P) then raise(who .. ": the pipeline size must be a positive integer, got " .. tostring(P)) end
  if type(s) ~= "number" or s < 0 or s >= P or s ~= math.floor(s) then
    raise(string.format("%s: stage %s is not in [0, %d)", who, tostring(s), P))
  end
  if not posint(m) then raise(who .. ": micro_batches must be a positive integer, got " .. tostring(m)) end
  if kind == "interleaved" then
    v = v or 2
    if not posint(v) then raise(who .. ": virtual_stages must be a positive integer, got " .. tostring(v)) end
    if m % P ~= 0 then
      raise(string.format("%s: the interleaved schedule needs micro_batches (%d) to be a multiple of the pipeline "
        .. "size (%d)", who, m, P))
    end
    return v
  end
  if v ~= nil and v ~= 1 then
    raise(string.format("%s: virtual_stages = %s needs schedule = \"interleaved\"", who, tostring(v)))
  end
  return 1
end

-- The list of actions of stage s, in order.
function M.actions(kind, P, s, m, v)
  v = M.check(kind, P, s, m, v)
  if kind == "gpipe" then return gpipe(P, s, m) end
  if kind == "1f1b" then return one_f_one_b(P, s, m) end
  return interleaved(P, s, m, v)
end

-- Forward only (evaluation): one batch through each local chunk in order.
function M.eval_actions(v)
  local list = {}
  for k = 1, v do list[k] = F(1, k) end
  return list
end

-- "F1 F2 B1 ..." (with the chunk when v > 1: "F1.2" is micro 1 of chunk 2).
function M.describe(list, v)
  local out = {}
  for i, a in ipairs(list) do
    out[i] = a.op .. a.micro .. ((v or 1) > 1 and ("." .. a.chunk) or "")
  end
  return table.concat(out, " ")
end

-- Runs every stage's list against the others with unbounded buffers (sends never block, a
-- stage waits only for the activation or gradient it needs next): the orders are
-- consistent (pp_program.simulate checks the batched transfers under NCCL's stricter
-- rules). Errors when no stage can
-- move (a deadlock) or when a stage runs an action twice / misses one. Returns
-- {order = {[s] = description}, peak = {[s] = most forwards alive at once}}.
function M.simulate(kind, P, m, v)
  v = M.check(kind, P, 0, m, v, "pp_schedule.simulate")
  local V = P * v
  local lists, pos, done, alive, peak = {}, {}, {}, {}, {}
  for s = 0, P - 1 do
    lists[s], pos[s], alive[s], peak[s] = M.actions(kind, P, s, m, v), 1, 0, 0
    if #lists[s] ~= 2 * m * v then
      raise(string.format("pp_schedule.simulate: stage %d has %d actions, expected %d", s, #lists[s], 2 * m * v))
    end
  end
  local function key(op, vs, i) return op .. vs .. ":" .. i end
  local remaining = 2 * m * V
  while remaining > 0 do
    local moved = false
    for s = 0, P - 1 do
      local a = lists[s][pos[s]]
      if a then
        local vs = (a.chunk - 1) * P + s
        local ready
        if a.op == "F" then
          ready = vs == 0 or done[key("F", vs - 1, a.micro)]
        else
          ready = done[key("F", vs, a.micro)] and (vs == V - 1 or done[key("B", vs + 1, a.micro)])
        end
        if ready then
          local k = key(a.op, vs, a.micro)
          if done[k] then raise("pp_schedule.simulate: stage " .. s .. " runs " .. k .. " twice") end
          done[k] = true
          alive[s] = alive[s] + (a.op == "F" and 1 or -1)
          if alive[s] > peak[s] then peak[s] = alive[s] end
          pos[s] = pos[s] + 1
          remaining = remaining - 1
          moved = true
        end
      end
    end
    if not moved then
      local stuck = {}
      for s = 0, P - 1 do
        local a = lists[s][pos[s]]
        if a then stuck[#stuck + 1] = string.format("stage %d at %s%d.%d", s, a.op, a.micro, a.chunk) end
      end
      raise("pp_schedule.simulate: deadlock: " .. table.concat(stuck, ", "))
    end
  end
  local order = {}
  for s = 0, P - 1 do order[s] = M.describe(lists[s], v) end
  return {order = order, peak = peak}
end

return M
