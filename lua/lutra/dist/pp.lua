-- lutra.dist.pp — pipeline parallel: the zoo Transformer's layer stack split into stages,
-- one per rank of the pipeline group, each rank keeping only its stage's modules.
--
--   local pp = require "lutra.dist.pp"
--   local st = pp.parallelize(model, mesh, {schedule = "1f1b", micro_batches = 4, balance = "params"})
--   -- or pp.parallelize(model, pp_group, opts) with a Group from comm.split
--   st.model                          -- the local module: named_parameters keep global names
--   local sum, acc = st:train_step(batches, 1 / #batches[, loss_fn])   -- m micro-batches {x =, y =}:
--                                     -- forward and backward of each micro loss * scale; the sum
--                                     -- of the micro losses, the same number on every pp rank, and
--                                     -- (last stage) loss_fn's extra metrics over the micro-batches
--   st:sync_grads()                   -- tied embeddings: sums wte.weight's grad of the first
--                                     -- and last stage (both copies stay equal)
--   local norm = st:clip_grad_norm(1.0, {mesh.pp, mesh.tp})   -- global norm over stages
--   local loss = st:eval(batch[, loss_fn])   -- forward only, the loss on every pp rank
--
-- opts: schedule "1f1b" (default) | "gpipe" | "interleaved"; micro_batches m (default the
-- pipeline size; what train_step expects); balance "params" (default: contiguous layers,
-- the most loaded stage as light as possible, counting the embeddings on the first stage
-- and ln_f + lm_head on the last) or {n_0, n_1, ...} layers per stage (per virtual stage
-- with interleaving); virtual_stages v (interleaved only, default 2): each rank holds v
-- chunks, chunk k of rank s being virtual stage (k - 1) * P + s.
-- The model is converted in place (apply tensor parallel first: the stage keeps its tp
-- record, so tp.sync_grads(st.model) works): the parameters of the other stages are freed,
-- so use st.model from then on. The last stage calls the model's own loss (model.loss,
-- which tensor parallel replaces by the vocab-parallel one), or loss_fn(model, micro_batch)
-- (the trainer's contract: loss [, extra metrics]) with a model whose model(x[, y]) or
-- model:forward(x, y) gives the logits [and the model's loss] of the activation the stages
-- computed from that micro-batch's x (pp_exec.lua's HeadModel). Micro-batches may carry
-- positions/segments (packed rows, as Transformer:forward's opts).
-- MoE layers (lutra.nn.moe): in training each stage backpropagates its layers' aux losses
-- (scaled as the micro loss) with the gradient it receives, so a micro-batch's objective is
-- lm + aux as in one process; the returned sum includes every stage's aux losses, and a
-- loss_fn's aux_loss metric (the default loss's) the other stages' too (pp_exec.lua).
-- A trainer's step: zero the grads; sum = st:train_step(batches, 1 / m); st:sync_grads();
-- then data-parallel reduction of the grads (mesh.dp), the global norm (owned parameters,
-- squares summed over mesh.pp and mesh.tp) and clipping, the optimizer step.
-- Dropout draws per stage, so with dropout > 0 the masks differ from one process.
-- Given a Group rather than a mesh, a model with tied embeddings makes the first-and-last
-- stage group with comm.split: every rank of the world calls parallelize then.
-- Schedules: lutra/dist/pp_schedule.lua; transfers: pp_program.lua; running: pp_exec.lua.
local Module = require "lutra.nn.module"
local embed = require("lutra.models.transformer").embed
local errors = require "lutra.errors"
local create = require "lutra.create"
local grad = require "lutra.nn.grad"
local spec = require "lutra.dist.spec"
local schedule = require "lutra.dist.pp_schedule"
local exec = require "lutra.dist.pp_exec"

local raise = errors.raise
local release = grad.release

local M = {}

-- ---- the stage module ------------------------------------------------------------------------

-- Holds this rank's modules under the full model's names: wte, wpe, drop (first stage),
-- blocks.<global index> (a plain container, so that blocks.5 stays blocks.5), ln_f and
-- lm_head (last stage; with tied embeddings also wte, holding the last stage's copy, so that
-- the tensor keeps the name wte.weight as in the full model).
local Stage = Module:extend("PipelineStage")

function Stage:init(parts)
  rawset(self, "cfg", parts.cfg)
  rawset(self, "chunks", parts.chunks) -- chunks[k] = list of 1-based block indices
  rawset(self, "first", parts.first)
  rawset(self, "last", parts.last)
  rawset(self, "_loss", parts.loss)
  if parts.wte then self.wte = parts.wte end
  if parts.wpe then self.wpe = parts.wpe end
  if parts.drop then self.drop = parts.drop end
  local blocks = Module()
  for _, chunk in ipairs(parts.chunks) do
    for _, i in ipairs(chunk) do blocks:add(tostring(i - 1), parts.blocks[i]) end
  end
  self.blocks = blocks
  if parts.ln_f then self.ln_f = parts.ln_f end
  if parts.lm_head then self.lm_head = parts.lm_head end
end

-- idx (B, T) -> (B, T, C): token (+ position) embeddings and dropout, as Transformer:forward
-- (positions (B, T): packed rows, as its opts.positions).
function Stage:embed(idx, positions) return embed(self, idx, positions, 0, idx:size(1)) end

-- x (B, T, C) through the blocks of local chunk k (packed: {positions =, segments =} or nil).
function Stage:run_chunk(k, x, packed)
  local blocks = self.blocks
  for _, i in ipairs(self.chunks[k]) do
    local y = blocks[tostring(i - 1)](x, nil, 0, packed)
    release(x, y)
    x = y
  end
  return x
end

-- x (B, T, C) -> logits (B, T, V): ln_f and lm_head (V / tp: this rank's vocab columns).
function Stage:logits(x)
  local h = self.ln_f(x)
  release(x, h)
  local logits = self.lm_head(h)
  release(h, logits)
  return logits
end

-- x (B, T, C), targets (B, T) -> the loss: ln_f, lm_head and the model's loss (cp: context
-- parallel's share, lutra.dist.cp).
function Stage:head(x, targets, cp)
  local logits = self:logits(x)
  local loss = cp and cp:loss(logits, targets, self) or self:loss(logits, targets)
  release(logits, loss)
  return loss
end

function Stage:loss(logits, targets, reduction) return self._loss(self, logits, targets, reduction) end

function Stage:forward()
  raise("PipelineStage: holds one pipeline stage; run it with st:train_step(batches, scale) or st:eval(batch)")
end

function Stage:extra_repr()
  local parts = {}
  for k, chunk in ipairs(self.chunks) do
    parts[k] = #chunk > 0 and string.format("blocks %d-%d", chunk[1] - 1, chunk[#chunk] - 1) or "no blocks"
  end
  return table.concat(parts, ", ")
end

-- ---- balance -----------------------------------------------------------------------------------

local function numel(t) return t ~= nil and t:numel() or 0 end

-- The layer counts of the V virtual stages that make the heaviest stage lightest (weights:
-- each block's parameter count, plus emb on stage 1 and head on stage V). Ties: the first.
function M.balance_by_params(weights, emb, head, V)
  local n = #weights
  local prefix = {[0] = 0}
  for i = 1, n do prefix[i] = prefix[i - 1] + weights[i] end
  local function cost(j, a, b) -- stage j (1-based) holding layers a..b
    return prefix[b] - prefix[a - 1] + (j == 1 and emb or 0) + (j == V and head or 0)
  end
  -- best[j][b]: the lightest heaviest stage of layers 1..b over stages 1..j; cut[j][b]: where j starts
  local best, cut = {{}}, {{}}
  for b = 1, n do best[1][b], cut[1][b] = cost(1, 1, b), 1 end
  for j = 2, V do
    best[j], cut[j] = {}, {}
    for b = j, n do
      local top, at = math.huge, nil
      for a = j, b do
        local c = math.max(best[j - 1][a - 1], cost(j, a, b))
        if c < top then top, at = c, a end
      end
      best[j][b], cut[j][b] = top, at
    end
  end
  local counts, b = {}, n
  for j = V, 1, -1 do
    local a = cut[j][b]
    counts[j] = b - a + 1
    b = a - 1
  end
  return counts
end

local function layer_counts(model, balance, P, v, who)
  local n, V = #model.blocks, P * v
  if V > n then
    raise(string.format("%s: %d pipeline stages%s need at least %d layers (one each), the model has %d (n_layer)", who,
      V, v > 1 and string.format(" (%d x %d virtual)", P, v) or "", V, n))
  end
  if balance == nil or balance == "params" then
    local weights = {}
    for i, block in ipairs(model.blocks) do weights[i] = block:num_parameters() end
    local emb = numel(model.wte.weight) + (model.wpe ~= nil and numel(model.wpe.weight) or 0)
    local head = model.ln_f:num_parameters() + numel(model.lm_head.weight)
    return M.balance_by_params(weights, emb, head, V)
  end
  if type(balance) ~= "table" then
    raise(string.format("%s: balance must be \"params\" or a list of layer counts, got %s", who, tostring(balance)))
  end
  if #balance ~= V then
    raise(string.format("%s: balance has %d entries for %d pipeline stages%s", who, #balance, V,
      v > 1 and " (virtual: P x virtual_stages)" or ""))
  end
  local sum = 0
  for j, c in ipairs(balance) do
    if type(c) ~= "number" or c < 1 or c ~= math.floor(c) then
      raise(string.format("%s: balance[%d] must be a positive integer (layers of stage %d), got %s", who, j, j - 1,
        tostring(c)))
    end
    sum = sum + c
  end
  if sum ~= n then
    raise(string.format("%s: balance {%s} sums to %d layers, the model has %d (n_layer)", who,
      table.concat(balance, ", "), sum, n))
  end
  return balance
end

-- ---- parallelize -------------------------------------------------------------------------------

local Pipeline = {}
Pipeline.__index = Pipeline

local function group_of(where, who)
  if type(where) ~= "table" then raise(who .. ": expected a mesh or a pipeline Group, got " .. type(where)) end
  if type(where.pp) == "table" then return where.pp, where.embed, true end
  if type(where.size) == "number" and type(where.rank) == "number" then return where, nil, false end
  raise(who .. ": expected a mesh (with .pp) or a Group (with .size, .rank)")
end

-- The group of the first and last stage of this pipeline (tied embeddings), made with
-- comm.split: every rank of the world calls it (each pipeline is one color).
local function split_embed_group(g, is_end)
  local comm = require "lutra.dist.comm"
  local color = is_end and (g.ranks and g.ranks[1] or 0) or -1
  return comm.split(color, g.rank, "pp_embed")
end

local OPTS = {schedule = true, micro_batches = true, balance = true, virtual_stages = true}

-- Every rank of the pipeline must run the same schedule over the same split, or the
-- transfers never match (a hang until the watchdog): one min/max all-reduce of what they
-- agreed on, before anything runs; a difference is an error naming it, on every rank.
local KINDS = {gpipe = 1, ["1f1b"] = 2, interleaved = 3}
local function check_agreement(g, kind, m, v, counts, cfg, who)
  local hash = 0
  for j, c in ipairs(counts) do hash = (hash * 31 + c * j) % 1000000007 end
  local what = {"schedule", "micro_batches", "virtual_stages", "balance", "n_layer", "d_model"}
  local mine = {KINDS[kind], m, v, hash, cfg.n_layer, cfg.d_model}
  local lo, hi = create.tensor(mine, {dtype = "f64"}), create.tensor(mine, {dtype = "f64"})
  g:all_reduce(lo, "min")
  g:all_reduce(hi, "max")
  local bad = {}
  for i, name in ipairs(what) do
    local a, b = lo[i - 1]:item(), hi[i - 1]:item()
    if a ~= b then bad[#bad + 1] = string.format("%s (this rank %s; min %s, max %s)", name, tostring(mine[i]), a, b) end
  end
  lo:free()
  hi:free()
  if #bad > 0 then
    raise(string.format("%s: the %d ranks of the pipeline disagree on %s", who, g.size, table.concat(bad, ", ")))
  end
end

local function check_parallelize_args(model, opts, who)
  if type(opts) ~= "table" then raise(who .. ": opts must be a table, got " .. type(opts)) end
  for k in pairs(opts) do
    if not OPTS[k] then
      raise(string.format("%s: unknown option '%s' (schedule, micro_batches, balance, virtual_stages)", who,
        tostring(k)))
    end
  end
  if type(model) ~= "table" or type(model.cfg) ~= "table" or model.blocks == nil or model.wte == nil
      or model.ln_f == nil or model.lm_head == nil then
    raise(who .. ": expected a zoo Transformer (wte, blocks, ln_f, lm_head), got " .. tostring(model and model.__name))
  end
end

-- The layer indices of rank s's chunks: chunk k is virtual stage (k - 1) * P + s, whose
-- layers follow those of the virtual stages before it (counts[j] layers each).
local function chunk_layers(counts, P, s, v)
  local first_layer, ranges = 1, {}
  for j = 1, P * v do
    ranges[j] = {}
    for i = first_layer, first_layer + counts[j] - 1 do ranges[j][#ranges[j] + 1] = i end
    first_layer = first_layer + counts[j]
  end
  local chunks = {}
  for k = 1, v do chunks[k] = ranges[(k - 1) * P + s + 1] end
  return chunks
end

-- The stage module: its chunks of the layer stack, the embeddings on the first stage,
-- ln_f and lm_head on the last (with wte when the head is tied to it).
local function build_stage(model, chunks, first, last, tied)
  local parts = {cfg = model.cfg, chunks = chunks, blocks = model.blocks, first = first, last = last,
                 loss = model.loss}
  if first then parts.wte, parts.wpe, parts.drop = model.wte, model.wpe, model.drop end
  if last then
    parts.ln_f, parts.lm_head = model.ln_f, model.lm_head
    if tied then parts.wte = model.wte end
  end
  return Stage(parts)
end

-- Tensor parallel's record (tp.sync_grads(st.model) reads it), with the stage's params only.
local function keep_tp_record(stage, tp_rec, mine)
  local rec = {}
  for k, val in pairs(tp_rec) do rec[k] = val end
  rec.summed = {}
  for _, p in ipairs(tp_rec.summed or {}) do
    if mine[p] then rec.summed[#rec.summed + 1] = p end
  end
  rawset(stage, "_tp", rec)
end

-- Tied embeddings across the pipeline: the last stage marks its copy of wte.weight a
-- duplicate (spec dup); the first and last stage keep the weight and the group that sums
-- its grads (sync_grads).
local function tie_embeddings(self, model, g, embed_group, is_mesh, who)
  local first, last = self.stage == 0, self.stage == self.size - 1
  local w = model.wte.weight
  if last then
    local old = spec.get(w)
    spec.set(w, {global = old and old.global or w.shape, offset = old and old.offset, dup = true})
  end
  self.tied_weight = (first or last) and w or nil
  if is_mesh then
    self.embed_group = (first or last) and embed_group or nil
    if (first or last) and embed_group == nil then raise(who .. ": the mesh has no embed group (first and last stage)") end
  else
    self.embed_group = split_embed_group(g, first or last)
  end
end

function M.parallelize(model, where, opts)
  local who = "pp.parallelize"
  opts = opts or {}
  check_parallelize_args(model, opts, who)
  local g, embed_group, is_mesh = group_of(where, who)
  local P, s = g.size, g.rank
  local kind = opts.schedule or "1f1b"
  local m = opts.micro_batches or P
  local v = schedule.check(kind, P, s, m, opts.virtual_stages, who)
  local counts = layer_counts(model, opts.balance, P, v, who)
  if P > 1 then check_agreement(g, kind, m, v, counts, model.cfg, who) end

  local chunks = chunk_layers(counts, P, s, v)
  local tied = rawequal(model.lm_head.weight, model.wte.weight)
  local stage = build_stage(model, chunks, s == 0, s == P - 1, tied)
  local tp_rec = rawget(model, "_tp")
  local mine = {}
  for _, p in ipairs(stage:parameters()) do mine[p] = true end
  if tp_rec then keep_tp_record(stage, tp_rec, mine) end
  -- activations between stages: (B, T / tp, C) under sequence parallelism, in the model's
  -- dtype, on the device of this stage's parameters
  rawset(stage, "seq_div", tp_rec and tp_rec.sequence_parallel and tp_rec.group.size or 1)
  local p1 = stage:parameters()[1]
  rawset(stage, "act_dtype", model.cfg.dtype or (p1 and p1.dtype) or "f32")
  rawset(stage, "act_device", p1 and p1.device or model.cfg.device or "cpu")

  -- free what this rank does not hold (the model is converted in place)
  for _, p in ipairs(model:parameters()) do
    if not mine[p] then p:free() end
  end

  local self = setmetatable({model = stage, group = g, size = P, stage = s, schedule = kind, micro_batches = m,
                             virtual_stages = v, counts = counts, tied = tied and P > 1}, Pipeline)
  if tied and P > 1 then tie_embeddings(self, model, g, embed_group, is_mesh, who) end
  return self
end

-- ---- running -----------------------------------------------------------------------------------

function Pipeline:train_step(batches, scale, loss_fn)
  if type(batches) ~= "table" or #batches ~= self.micro_batches then
    raise(string.format("pp.train_step: expected a list of %d micro-batches {x =, y =}, got %s", self.micro_batches,
      type(batches) == "table" and (#batches .. " entries") or type(batches)))
  end
  local actions = schedule.actions(self.schedule, self.size, self.stage, self.micro_batches, self.virtual_stages)
  return exec.train(self, actions, batches, scale or 1, loss_fn)
end

function Pipeline:eval(batch, loss_fn)
  if type(batch) ~= "table" or batch.x == nil then raise("pp.eval: expected a batch {x =, y =}") end
  local training = self.model.training
  self.model:eval()
  local ok, res = errors.pcall(grad.no_grad, exec.forward_only, self, batch, loss_fn)
  self.model:train(training)
  if not ok then error(res, 0) end
  return res
end

-- Tied embeddings: the first stage's wte.weight grad and the last stage's copy's grad
-- summed over the two (after train_step, before clipping and the optimizer step).
function Pipeline:sync_grads()
  local eg = self.embed_group
  if eg == nil or eg.size < 2 then return end
  local w = self.tied_weight
  if w.grad == nil then w.grad = create.zeros_like(w) end
  eg:all_reduce(w.grad, "sum")
end

-- The global gradient norm over the pipeline (and the given groups: {mesh.pp, mesh.tp}):
-- squares of the owned parameters' grads (spec dup copies skipped) summed over the groups;
-- every local grad then scaled by max_norm / (norm + 1e-6) when below 1, as torch does.
function Pipeline:clip_grad_norm(max_norm, groups)
  return exec.clip_grad_norm(self, max_norm, groups or {self.group})
end

M.Stage = Stage
M.Pipeline = Pipeline
return M
