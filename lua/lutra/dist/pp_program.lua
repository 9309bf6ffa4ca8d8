-- lutra.dist.pp_program — the communication of one pipeline stage around its schedule:
-- which activation or gradient each action receives before it runs and sends after, and
-- how those transfers are grouped into p2p batches (g:p2p), as Megatron-LM does:
--
--   a send is posted together with the next action's receive as one batch (1F1B's
--   steady state: "send the activation, receive the gradient", then "send the gradient,
--   receive the next activation"); a send whose next action receives nothing is posted
--   alone, at once. A batch holding a receive is waited for before the action runs.
--
-- With NCCL (no tags, a communicator's operations run in stream order, a send completes
-- only when its receive is posted), separately posted sends and receives can wait on each
-- other in a cycle; these batches cannot, which simulate() checks under exactly those
-- rules for a schedule: each rank's batches complete in posting order, an operation only
-- with the matching one in the peer's oldest pending batch, in posting order between two
-- ranks (no tags: a mismatch is an error, not a wrong tensor).
--
--   local steps = program(actions, P, s, v)  -- {{comm = {op, ...}, wait = bool} | {action = a}, ...}
--   op = {dir = "send" | "recv", what = "act" | "grad", vs =, micro =, peer =, key =}
-- vs: the virtual stage the message goes into; peer: the pipeline rank at the other end
-- (== s for a chunk boundary on this rank itself: such messages stay local, never batched).
local errors = require "lutra.errors"
local S = require "lutra.dist.pp_schedule"

local raise = errors.raise

local M = {}

local function op(dir, what, vs, micro, peer)
  return {dir = dir, what = what, vs = vs, micro = micro, peer = peer, key = what .. vs .. ":" .. micro}
end

-- The receive before action a and the send after it, on stage s (nil where none).
function M.transfers(a, P, s, v)
  local V, vs = P * v, (a.chunk - 1) * P + s
  local recv, send
  if a.op == "F" then
    if vs > 0 then recv = op("recv", "act", vs, a.micro, (vs - 1) % P) end
    if vs < V - 1 then send = op("send", "act", vs + 1, a.micro, (vs + 1) % P) end
  else
    if vs < V - 1 then recv = op("recv", "grad", vs, a.micro, (vs + 1) % P) end
    if vs > 0 then send = op("send", "grad", vs - 1, a.micro, (vs - 1) % P) end
  end
  return recv, send
end

-- Megatron's interleaved batches: the actions go in steps (a warmup forward, a steady
-- forward + backward pair (a.paired on the backward), a cooldown backward); the sends of
-- one step and the receives of the next form one batch, waited for before the step runs.
local function stepped(actions, P, s, v)
  local groups = {}
  for _, a in ipairs(actions) do
    if a.paired and #groups > 0 then
      local g = groups[#groups]
      g[#g + 1] = a
    else
      groups[#groups + 1] = {a}
    end
  end
  local function remote(o) return o ~= nil and o.peer ~= s end
  local function recvs_of(g)
    local list = {}
    for _, a in ipairs(g) do
      local recv = M.transfers(a, P, s, v)
      if remote(recv) then list[#list + 1] = recv end
    end
    return list
  end
  local steps, sends = {}, {}
  for j, g in ipairs(groups) do
    local ops = sends
    local recvs = recvs_of(g)
    for _, r in ipairs(recvs) do ops[#ops + 1] = r end
    if #ops > 0 then steps[#steps + 1] = {comm = ops, wait = #recvs > 0} end
    sends = {}
    for _, a in ipairs(g) do
      local recv, send = M.transfers(a, P, s, v)
      steps[#steps + 1] = {action = a, recv = recv}
      if send and not remote(send) then
        steps[#steps + 1] = {local_send = send}
      elseif send then
        sends[#sends + 1] = send
      end
    end
    if #sends > 0 and (groups[j + 1] == nil or #recvs_of(groups[j + 1]) == 0) then
      steps[#steps + 1] = {comm = sends, wait = false}
      sends = {}
    end
  end
  return steps
end

-- paired = "stepped": Megatron's interleaved batches (above).
-- paired = false: every transfer alone (a receive waited for, a send posted at once), for
-- transports that match by tag and never block a send (MPI): interleaving needs that.
function M.program(actions, P, s, v, paired)
  if paired == nil then paired = true end
  if paired == "stepped" then return stepped(actions, P, s, v) end
  local steps, deferred = {}, nil
  local function remote(o) return o ~= nil and o.peer ~= s end
  for j, a in ipairs(actions) do
    local recv = M.transfers(a, P, s, v)
    local ops = {}
    if deferred then ops[#ops + 1], deferred = deferred, nil end
    if remote(recv) then ops[#ops + 1] = recv end
    if #ops > 0 then steps[#steps + 1] = {comm = ops, wait = remote(recv)} end
    steps[#steps + 1] = {action = a, recv = recv}
    local _, send = M.transfers(a, P, s, v)
    if send and not remote(send) then
      steps[#steps + 1] = {local_send = send}
    elseif send then
      local next_recv = actions[j + 1] and M.transfers(actions[j + 1], P, s, v)
      if paired and remote(next_recv) then
        deferred = send
      else
        steps[#steps + 1] = {comm = {send}, wait = false}
      end
    end
  end
  return steps
end

-- The batching of a schedule: Megatron's steps for interleaving, pairs otherwise.
function M.mode(kind) return kind == "interleaved" and "stepped" or true end

-- Every stage's program and where it stands: pc[s] (its next step), queue[s] (its posted
-- batches, oldest first), blocked[s] (the batch it waits for), local_box[s] (its local sends).
local function new_simulation(kind, P, m, v, opts, paired)
  local sim = {P = P, progs = {}, pc = {}, queue = {}, blocked = {}, local_box = {}}
  for s = 0, P - 1 do
    local actions = opts.eval and S.eval_actions(v) or S.actions(kind, P, s, m, v)
    sim.progs[s] = M.program(actions, P, s, v, paired)
    sim.pc[s], sim.queue[s], sim.local_box[s] = 1, {}, {}
  end
  return sim
end

-- the first pending operation of s's oldest batch with (dir, peer): operations between
-- one pair of ranks match in posting order (NCCL, and MPI under one tag)
local function first_pending(sim, s, dir, peer)
  local g = sim.queue[s][1]
  if not g then return nil end
  for _, o in ipairs(g.ops) do
    if not o.done and o.dir == dir and o.peer == peer then return o end
  end
end

-- Hosts: each stage runs until a batch with a receive is pending or a local receive has
-- no data. True when any stage moved.
local function advance_hosts(sim)
  local progs, pc, queue, blocked, local_box = sim.progs, sim.pc, sim.queue, sim.blocked, sim.local_box
  local moved = false
  for s = 0, sim.P - 1 do
    while true do
      if blocked[s] then
        if not blocked[s].complete then break end
        blocked[s] = nil
      end
      local st = progs[s][pc[s]]
      if st == nil then break end
      if st.comm then
        local g = {ops = {}, complete = false}
        for i, o in ipairs(st.comm) do g.ops[i] = {dir = o.dir, key = o.key, peer = o.peer} end
        queue[s][#queue[s] + 1] = g
        if st.wait then blocked[s] = g end
      elseif st.local_send then
        local_box[s][st.local_send.key] = true
      elseif st.action and st.recv and st.recv.peer == s then
        if not local_box[s][st.recv.key] then break end
      end
      pc[s] = pc[s] + 1
      moved = true
    end
  end
  return moved
end

-- Streams: matches the operations of the oldest pending batches; errors on a pair that
-- meets out of order. True when any matched.
local function match_streams(sim)
  local moved = false
  for s = 0, sim.P - 1 do
    local g = sim.queue[s][1]
    if g then
      for _, o in ipairs(g.ops) do
        if not o.done and first_pending(sim, s, o.dir, o.peer) == o then
          local other = first_pending(sim, o.peer, o.dir == "send" and "recv" or "send", s)
          if other and other.key ~= o.key then
            raise(string.format("pp_program.simulate: stage %d's %s of %s meets stage %d's %s of %s (order)", s,
              o.dir, o.key, o.peer, other.dir, other.key))
          end
          if other then
            o.done, other.done, moved = true, true, true
          end
        end
      end
    end
  end
  return moved
end

-- Completes the oldest batches whose operations are all done. True when any completed.
local function retire_batches(sim)
  local moved = false
  for s = 0, sim.P - 1 do
    local queue = sim.queue[s]
    local g = queue[1]
    while g do
      for _, o in ipairs(g.ops) do
        if not o.done then g = nil break end
      end
      if not g then break end
      g.complete = true
      table.remove(queue, 1)
      moved = true
      g = queue[1]
    end
  end
  return moved
end

-- Where each unfinished stage waits, one line each.
local function stuck_stages(sim)
  local stuck = {}
  for s = 0, sim.P - 1 do
    if sim.progs[s][sim.pc[s]] ~= nil or #sim.queue[s] > 0 then
      local g = sim.queue[s][1]
      local what = {}
      for _, o in ipairs(g and g.ops or {}) do
        if not o.done then what[#what + 1] = o.dir .. " " .. o.key .. " with " .. o.peer end
      end
      stuck[#stuck + 1] = string.format("stage %d at step %d/%d waiting on {%s}", s, sim.pc[s], #sim.progs[s],
        table.concat(what, ", "))
    end
  end
  return stuck
end

-- Runs every stage's program against the others under NCCL's rules (see the top); errors
-- on a deadlock (naming where each stage waits) or on a mismatched pair.
-- opts.eval: the forward-only program (pp_schedule.eval_actions); opts.paired: a batching
-- other than M.mode(kind) (true, "stepped" or false).
function M.simulate(kind, P, m, v, opts)
  opts = opts or {}
  v = S.check(kind, P, 0, m, v, "pp_program.simulate")
  local paired = opts.paired
  if paired == nil then paired = M.mode(kind) end
  local sim = new_simulation(kind, P, m, v, opts, paired)
  while true do
    local hosts_moved = advance_hosts(sim)
    local streams_moved = match_streams(sim)
    local batches_moved = retire_batches(sim)
    if not (hosts_moved or streams_moved or batches_moved) then break end
  end
  local stuck = stuck_stages(sim)
  if #stuck > 0 then raise("pp_program.simulate: deadlock: " .. table.concat(stuck, "; ")) end
  return true
end

return M
