-- Shared by tests/dist/test_pp.lua and test_pp_schedule.lua (loaded with dofile): the
-- small models, the data, the reference run (the unsplit model on the same micro-batches),
-- a pipeline stage trained as the trainer does, the comparison of a stage with the
-- reference, and whole pipelines in one process (coroutines). Returns a table of them.
local lt = require "lutra"
local testing = require "lutra.testing"
local models = require "lutra.models"
local optim = require "lutra.optim"
local pp = require "lutra.dist.pp"

local CFG = {
  gpt2 = {arch = "gpt2", n_layer = 4, d_model = 32, n_head = 4, vocab_size = 64, block_size = 16, dropout = 0},
  llama = {arch = "llama", n_layer = 4, d_model = 32, n_head = 4, n_kv_head = 2, vocab_size = 64, block_size = 16,
           dropout = 0},
}
local STEPS, BATCH, MICRO, T = 10, 8, 4, 16
local ADAM = {lr = 1e-2, weight_decay = 0.1}

local function with(cfg, extra)
  local c = {}
  for k, v in pairs(cfg) do c[k] = v end
  for k, v in pairs(extra or {}) do c[k] = v end
  return c
end

-- ---- data, reference ----------------------------------------------------------------------

local function data(seed)
  lt.manual_seed(1000 + seed)
  local xs, ys = {}, {}
  for step = 1, STEPS do
    xs[step] = lt.randint(0, 64, {BATCH, T})
    ys[step] = lt.randint(0, 64, {BATCH, T})
  end
  return xs, ys
end

local function micro_batches(x, y)
  local list, b = {}, BATCH / MICRO
  for i = 1, MICRO do
    list[i] = {x = x:narrow(0, (i - 1) * b, b):contiguous(), y = y:narrow(0, (i - 1) * b, b):contiguous()}
  end
  return list
end

-- The unsplit model trained on the full batch of each step as the trainer does with
-- grad_accum = MICRO (each micro loss * 1 / MICRO before backward; the step's loss is their
-- mean), which is what a pipeline of MICRO micro-batches computes. (One backward over the
-- whole batch sums in another order: 10 AdamW steps at lr 1e-2 carry that rounding to
-- 1.5e-5 in llama's wte, over the 1e-5 bar, for both.)
local function reference(cfg)
  local xs, ys = data(0)
  lt.manual_seed(7)
  local model = models.build(cfg)
  local opt = optim.AdamW(model, ADAM)
  local losses = {}
  for step = 1, STEPS do
    lt.tidy(function()
      opt:zero_grad()
      local sum = 0
      for _, b in ipairs(micro_batches(xs[step], ys[step])) do
        local _, loss = model(b.x, b.y)
        sum = sum + loss:item()
        local scaled = loss * (1 / MICRO)
        scaled:backward()
      end
      losses[step] = sum / MICRO
      optim.clip_grad_norm(model, 1.0)
      opt:step()
    end)
  end
  return model, losses
end

local ref_cache = {}
local function reference_of(name)
  if not ref_cache[name] then
    local model, losses = reference(CFG[name])
    local params = {}
    for pname, p in pairs(model:state_dict()) do params[pname] = p end
    ref_cache[name] = {losses = losses, params = params}
  end
  return ref_cache[name]
end

-- One pipeline stage trained as the trainer does it, each step inside lutra.tidy (not with
-- the in-process transport: tidy scopes are one stack, which coroutines would interleave).
local function pipelined(cfg, where, opts, no_tidy)
  local xs, ys = data(0)
  lt.manual_seed(7)
  local model = models.build(cfg)
  local st = pp.parallelize(model, where, opts)
  local opt = optim.AdamW(st.model, ADAM)
  local losses = {}
  local scope = no_tidy and function(fn) return fn() end or lt.tidy
  for step = 1, STEPS do
    scope(function()
      opt:zero_grad()
      local sum = st:train_step(micro_batches(xs[step], ys[step]), 1 / MICRO)
      losses[step] = sum / MICRO
      st:sync_grads()
      st:clip_grad_norm(1.0)
      opt:step()
    end)
  end
  return st, losses
end

local function compare(name, st, losses, who)
  local ref = reference_of(name)
  for step = 1, STEPS do
    testing.assert_close(losses[step], ref.losses[step], {rtol = 1e-5, atol = 0, msg = who .. " loss of step " .. step})
  end
  local n = 0
  for pname, p in st.model:named_parameters() do
    local r = ref.params[pname]
    assert(r ~= nil, who .. ": " .. pname .. " is not a parameter of the full model")
    if pname:find("attn%.qkv%.bias$") then
      -- The key bias's gradient is zero in exact arithmetic (softmax ignores a shift of a
      -- row's scores), so it is rounding noise, which AdamW scales up to lr-sized steps:
      -- any change of summation order (here the tied embedding's grad, summed per stage)
      -- moves it by ~1e-5. It stays compared, with atol 1e-4; q and v at 1e-5.
      local H = CFG[name].n_head
      local Hkv = CFG[name].n_kv_head or H
      local rows = p:size(0) -- [q | k | v] rows, of this tp rank's heads under tp
      local C, kv = rows * H / (H + 2 * Hkv), rows * Hkv / (H + 2 * Hkv)
      testing.assert_close(p:narrow(0, 0, C), r:narrow(0, 0, C), {rtol = 1e-5, atol = 1e-5, msg = who .. " " .. pname})
      testing.assert_close(p:narrow(0, C, kv), r:narrow(0, C, kv), {rtol = 1e-5, atol = 1e-4,
        msg = who .. " " .. pname .. " (key part)"})
      testing.assert_close(p:narrow(0, C + kv, kv), r:narrow(0, C + kv, kv), {rtol = 1e-5, atol = 1e-5,
        msg = who .. " " .. pname})
    else
      testing.assert_close(p, r, {rtol = 1e-5, atol = 1e-5, msg = who .. " " .. pname})
    end
    n = n + 1
  end
  assert(n > 0, who .. ": the stage holds no parameters")
end

-- ---- in-process pipelines (coroutines over a local transport) ------------------------------

-- P stages in this process: each a coroutine; send queues a copy, recv yields until there
-- is one; broadcast and all_reduce wait for every member. Returns run(fn) that runs
-- fn(stage_rank, mesh) for every stage and errors on a deadlock.
local function local_world(P)
  local queues, colls, progress = {}, {}, 0
  local function group(name, ranks, me)
    local g = {name = name, size = #ranks, ranks = ranks, seq = 0}
    for i, r in ipairs(ranks) do
      if r == me then g.rank = i - 1 end
    end
    local function q(src, dst, tag)
      local k = name .. ":" .. src .. ">" .. dst .. "#" .. tag
      queues[k] = queues[k] or {}
      return queues[k]
    end
    function g:send(t, peer, o)
      local list = q(self.rank, peer, o.tag)
      list[#list + 1] = lt.no_grad(function() return lt.keep(t:clone()) end)
      progress = progress + 1
    end
    function g:recv(t, peer, o)
      local list = q(peer, self.rank, o.tag)
      while #list == 0 do coroutine.yield() end
      local src = table.remove(list, 1)
      lt.no_grad(function() t:copy_(src) end)
      progress = progress + 1
    end
    -- sends queued at once; the handle's wait receives (yielding until the data is there)
    function g:p2p(list)
      local recvs = {}
      for _, item in ipairs(list) do
        if item[1] == "send" then self:send(item[2], item[3], {tag = 0}) else recvs[#recvs + 1] = item end
      end
      return {wait = function()
        for _, item in ipairs(recvs) do self:recv(item[2], item[3], {tag = 0}) end
      end}
    end
    local function collective(self, t, combine)
      self.seq = self.seq + 1
      local k = name .. "#" .. self.seq
      colls[k] = colls[k] or {n = 0}
      local c = colls[k]
      c[self.rank] = lt.no_grad(function() return lt.keep(t:clone()) end)
      c.n = c.n + 1
      progress = progress + 1
      while c.n < self.size do coroutine.yield() end
      lt.no_grad(function() t:copy_(combine(c)) end)
    end
    function g:broadcast(t, root) collective(self, t, function(c) return c[root] end) end
    function g:all_reduce(t, op)
      op = op or "sum"
      assert(op == "sum" or op == "min" or op == "max", op)
      collective(self, t, function(c)
        if op == "sum" then
          local s = c[0]:clone()
          for r = 1, self.size - 1 do s = s + c[r] end
          return s
        end
        local v = c[0]:tolist() -- (min and max: the small agreement vectors of pp.parallelize)
        for r = 1, self.size - 1 do
          for i, x in ipairs(c[r]:tolist()) do v[i] = op == "min" and math.min(v[i], x) or math.max(v[i], x) end
        end
        return lt.tensor(v, {dtype = c[0].dtype})
      end)
    end
    return g
  end
  return function(fn)
    local cos, results = {}, {}
    for s = 0, P - 1 do
      local ranks = {}
      for r = 0, P - 1 do ranks[#ranks + 1] = r end
      local mesh = {pp = group("pp", ranks, s)}
      if s == 0 or s == P - 1 then mesh.embed = group("embed", P > 1 and {0, P - 1} or {0}, s) end
      cos[s] = coroutine.create(function() results[s] = {fn(s, mesh)} end)
    end
    local alive = P
    while alive > 0 do
      local before, finished = progress, 0
      for s = 0, P - 1 do
        if coroutine.status(cos[s]) ~= "dead" then
          local ok, err = coroutine.resume(cos[s])
          if not ok then error(debug.traceback(cos[s], tostring(err)), 0) end
          if coroutine.status(cos[s]) == "dead" then finished = finished + 1 end
        end
      end
      alive = alive - finished
      if alive > 0 and finished == 0 and progress == before then error("in-process pipeline: deadlock") end
    end
    return results
  end
end

local function in_process(name, P, opts)
  local run = local_world(P)
  local results = run(function(s, mesh)
    local st, losses = pipelined(CFG[name], mesh, opts, true)
    return st, losses
  end)
  for s = 0, P - 1 do
    compare(name, results[s][1], results[s][2], string.format("%s pp%d %s stage %d", name, P, opts.schedule, s))
  end
end

return {CFG = CFG, STEPS = STEPS, BATCH = BATCH, MICRO = MICRO, T = T, ADAM = ADAM, with = with, data = data,
        micro_batches = micro_batches, reference_of = reference_of, ref_cache = ref_cache, pipelined = pipelined,
        compare = compare, in_process = in_process}
