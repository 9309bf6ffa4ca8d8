-- lutra.dpo — Direct Preference Optimization (Rafailov et al. 2023) and its IPO and hinge
-- variants, on pairs (prompt, chosen, rejected).
--
--   local dpo = require "lutra.dpo"
--   local pairs_ = dpo.load("recipes/data/dpo_train.jsonl", tok, {template = "chatml", max_len = 256})
--   local ref = dpo.reference.lora(model)        -- or .copy(model), or .precomputed(table | fn)
--   local batch = dpo.collate(pairs_, {1, 2, 3, 4})
--   local loss, m = dpo.step(model, batch, ref, {beta = 0.1, loss = "sigmoid", label_smoothing = 0})
--   loss:backward(); opt:step()                   -- m.accuracy, m.margin, m.chosen_reward, ...
--   local ev = dpo.evaluate(model, val_pairs, ref, {batch = 8, beta = 0.1})   -- means over a set
--
-- A pair is tokenized as prompt then response: with a chat template (lutra.sft.templates:
-- a name, a template or a function) as a user turn and an assistant turn, and otherwise as
-- the plain concatenation of the two texts. Only the response's tokens count (the
-- template's loss span of the final assistant turn: its content and end-of-turn marker).
-- The sequence log-prob log pi(y | x) is the sum of the response tokens' log-probs.
-- With h = (log pi(yc) - log pi(yr)) - (log ref(yc) - log ref(yr)) the losses are (mean
-- over the batch):
--   sigmoid   -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)   (cDPO's label smoothing)
--   ipo       (h - 1 / (2 beta))^2
--   hinge     relu(1 - beta h)
-- Metrics (numbers, batch means): chosen_reward = beta (log pi(yc) - log ref(yc)),
-- rejected_reward, margin = chosen_reward - rejected_reward, accuracy = the fraction with
-- chosen_reward > rejected_reward, chosen_logp, rejected_logp (policy), logp_accuracy (the
-- fraction with log pi(yc) > log pi(yr): the policy's own preference, unnormalized), loss.
-- The reference: a frozen deep copy of the model (dpo.frozen_copy), the same model with its
-- LoRA adapters off (no second copy), or log-probs computed once beforehand. It runs without
-- autograd and in eval mode; its weights are never given to an optimizer.
local lt = require "lutra"
local F = require "lutra.functional"
local ops = require "lutra.ops"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local Module = require "lutra.nn.module"
local jsonl = require "lutra.sft.jsonl"

local raise, is_tensor = errors.raise, ops.is_tensor

local M = {}

-- ---- data ----------------------------------------------------------------------------------------

-- The prompt's messages (a string is one user turn), checked (at: the error prefix).
local function as_messages(at, v, base)
  if type(v) == "string" then return {{role = "user", content = v}} end
  if jsonl.is_list(v) then
    jsonl.check_messages(at, "prompt", v, base)
    return v
  end
  raise(string.format("%sprompt: expected a string or a list of messages, got %s", at, jsonl.kind(v)))
end

-- A response's text: a string, or a list of one assistant message.
local function response_text(at, k, v, base)
  if type(v) == "string" then return v end
  if jsonl.is_list(v) and #v == 1 then
    local name = string.format("%s[%d]", k, base)
    jsonl.check_message(at, name, v[1])
    if v[1].role ~= "assistant" then
      raise(string.format("%s%s.role: a response is the assistant's, got %s", at, name, jsonl.shown(v[1].role)))
    end
    return v[1].content
  end
  raise(string.format("%s%s: a response must be a string or one assistant message, got %s", at, k,
    jsonl.is_list(v) and string.format("a list of %d messages", #v) or jsonl.kind(v)))
end

-- What makes a pair teach nothing (an empty response, the same text twice), or nil.
local function pair_problem(chosen, rejected)
  if chosen == "" and rejected == "" then return "chosen and rejected are both empty" end
  if chosen == "" then return "chosen: the response is empty" end
  if rejected == "" then return "rejected: the response is empty" end
  if chosen == rejected then
    return "chosen and rejected are the same text (" .. jsonl.shown(chosen) .. "): the pair states no preference"
  end
  return nil
end

-- ids and mask (Lua lists; mask 1 on the response) of prompt + response.
local function encode_one(tok, template, prompt, response)
  if template == nil then
    local ids, mask = {}, {}
    for _, id in ipairs(tok:encode(prompt)) do ids[#ids + 1], mask[#mask + 1] = id, 0 end
    for _, id in ipairs(tok:encode(response, {add_special_tokens = false})) do -- no BOS inside the sequence
      ids[#ids + 1], mask[#mask + 1] = id, 1
    end
    return ids, mask
  end
  local templates = require "lutra.sft.templates"
  local full = {}
  for i, m in ipairs(prompt) do full[i] = m end
  full[#full + 1] = {role = "assistant", content = response}
  if template.kind == "jinja" then -- a model's own template: the response's span alone carries loss
    local ids, mask = template:encode(tok, full, {last_only = true})
    return ids, mask
  end
  local n_prompt = #template:render(prompt, {})
  local segs = template:render(full, {})
  for i = 1, n_prompt do
    if segs[i].train then segs[i] = {text = segs[i].text, role = segs[i].role, train = false} end
  end
  return templates.encode_segments(tok, segs)
end

-- Drops tokens from the prompt's start, then from the end, until the pair fits max_len.
local function truncate(ids, mask, max_len)
  if #ids <= max_len then return ids, mask, false end
  local first = 1
  while #ids - first + 1 > max_len and mask[first] == 0 do first = first + 1 end
  local last = math.min(#ids, first + max_len - 1)
  local i2, m2 = {}, {}
  for i = first, last do i2[#i2 + 1], m2[#m2 + 1] = ids[i], mask[i] end
  return i2, m2, true
end

local function get_template(t)
  if t == nil or t == false or t == "none" then return nil end
  return require("lutra.sft.templates").get(t)
end

-- The texts of a record the tokenizer must encode, with their names in errors.
local function text_fields(rec, texts, base)
  local fields = {}
  if type(rec.prompt) == "string" then
    fields[1] = {name = "prompt", text = rec.prompt}
  else
    for i, m in ipairs(rec.prompt) do
      fields[i] = {name = string.format("prompt[%d].content", i - 1 + base), text = m.content}
    end
  end
  for _, k in ipairs {"chosen", "rejected"} do
    fields[#fields + 1] = {name = type(rec[k]) == "string" and k or string.format("%s[%d].content", k, base),
                           text = texts[k]}
  end
  return fields
end

-- One record {prompt =, chosen =, rejected =} -> a pair {chosen = ids, chosen_mask =, rejected =,
-- rejected_mask =, truncated = bool}. The prompt is a string or a list of messages, each response
-- a string or a list of one assistant message. opts: template (nil: plain text), max_len, who (the
-- errors' prefix), base (0: list items in errors count from 0, as in a JSON file; default 1),
-- on_bad_pair = "skip" (a pair with an empty response or chosen == rejected returns nil and the
-- reason instead of raising).
function M.encode_pair(tok, rec, opts)
  opts = opts or {}
  local at = (opts.who or "dpo.encode_pair") .. ": "
  local base = opts.base or 1
  if not jsonl.is_object(rec) then
    raise(at .. "expected an object {prompt, chosen, rejected}, got " .. jsonl.kind(rec))
  end
  for _, k in ipairs {"prompt", "chosen", "rejected"} do
    if rec[k] == nil then raise(string.format("%s%s: missing (the record has no '%s')", at, k, k)) end
  end
  local template = get_template(opts.template)
  local prompt = rec.prompt
  if template then
    prompt = as_messages(at, prompt, base)
  elseif type(prompt) ~= "string" then
    raise(string.format("%sprompt: without a chat template the prompt must be a string, got %s", at,
      jsonl.is_list(prompt) and "a list of messages" or jsonl.kind(prompt)))
  end
  local texts = {chosen = response_text(at, "chosen", rec.chosen, base),
                 rejected = response_text(at, "rejected", rec.rejected, base)}
  local bad = pair_problem(texts.chosen, texts.rejected)
  if bad then
    if opts.on_bad_pair == "skip" then return nil, at .. bad end
    raise(at .. bad)
  end
  local out = {}
  for _, k in ipairs {"chosen", "rejected"} do
    local ok, ids, mask = pcall(encode_one, tok, template, prompt, texts[k])
    if not ok then jsonl.raise_unencodable(at, tok, text_fields(rec, texts, base), ids) end
    local cut
    if opts.max_len then ids, mask, cut = truncate(ids, mask, opts.max_len) end
    local n = 0
    for _, v in ipairs(mask) do n = n + v end
    if n == 0 then
      raise(string.format("%s%s: the response has no tokens%s", at, k,
        cut and string.format(" after truncation to max_len %d (the prompt is too long)", opts.max_len) or ""))
    end
    out[k], out[k .. "_mask"] = ids, mask
    out.truncated = out.truncated or cut or false
  end
  return out
end

-- The pairs of a JSONL file (one {"prompt", "chosen", "rejected"} object per line, read as
-- lutra.sft.jsonl reads: CRLF accepted, blank lines skipped, a BOM or an empty file refused),
-- encoded. Every error names the file, the line and the field ("dpo: pairs.jsonl:17: chosen:
-- the response is empty"). A pair with an empty response or chosen == rejected is an error,
-- or with opts.on_bad_pair = "skip" left out and counted. opts: template, max_len, limit (the
-- first pairs only), on_bad_pair. Returns the list and {n =, truncated =, skipped =}; prints
-- nothing.
function M.load(path, tok, opts)
  opts = opts or {}
  local on_bad = opts.on_bad_pair or "error"
  if on_bad ~= "error" and on_bad ~= "skip" then
    raise('dpo.load: on_bad_pair must be "error" or "skip", got ' .. tostring(on_bad))
  end
  local list, truncated, skipped = {}, 0, 0
  jsonl.each(path, "dpo", function(rec, line)
    local p = M.encode_pair(tok, rec, {template = opts.template, max_len = opts.max_len, on_bad_pair = on_bad,
                                       who = string.format("dpo: %s:%d", path, line), base = 0})
    if p == nil then
      skipped = skipped + 1
      return false
    end
    if p.truncated then truncated = truncated + 1 end
    p.index = #list + 1
    list[#list + 1] = p
    return opts.limit and #list >= opts.limit
  end)
  if #list == 0 then
    raise(string.format("dpo: %s: no pairs left: all %d were skipped (an empty response, or chosen == rejected)",
      path, skipped))
  end
  return list, {n = #list, truncated = truncated, skipped = skipped}
end

-- A batch of pairs (by their positions in `list`): x (2B, T) i64 inputs, y (2B, T) i64 next
-- tokens with -100 outside the responses; rows 0..B-1 chosen, B..2B-1 rejected.
function M.collate(list, indices)
  local rows = {}
  for _, i in ipairs(indices) do
    local p = list[i] or raise("dpo.collate: no pair " .. tostring(i))
    rows[#rows + 1] = {p.chosen, p.chosen_mask}
  end
  for _, i in ipairs(indices) do rows[#rows + 1] = {list[i].rejected, list[i].rejected_mask} end
  local T = 1
  for _, r in ipairs(rows) do T = math.max(T, #r[1] - 1) end
  local xs, ys = {}, {}
  local n_tokens = 0
  for k, r in ipairs(rows) do
    local ids, mask = r[1], r[2]
    local x, y = {}, {}
    for t = 1, T do
      x[t] = ids[t] or 0
      local m = mask[t + 1]
      y[t] = (m == 1) and ids[t + 1] or -100
      if m == 1 then n_tokens = n_tokens + 1 end
    end
    xs[k], ys[k] = x, y
  end
  local index = {}
  for k, i in ipairs(indices) do index[k] = list[i].index or i end
  return {x = lt.tensor(xs, {dtype = "i64"}), y = lt.tensor(ys, {dtype = "i64"}), B = #indices, T = T,
          index = index, n_tokens = n_tokens}
end

-- ---- log-probs -------------------------------------------------------------------------------------

-- logits (N, T, V), y (N, T) with -100 ignored -> (N) sums of the targets' log-probs.
function M.logps_of_logits(logits, y)
  local N, T = y:size(0), y:size(1)
  local _, losses = F.cross_entropy(logits, y, {ignore_index = -100, reduction = "none"})
  local lv = losses:view(N, T)
  return -(lv:sum(1))
end

-- The model's sequence log-probs for batch rows: chosen (B), rejected (B).
function M.sequence_logps(model, batch)
  local logits = model(batch.x)
  local lp = M.logps_of_logits(logits, batch.y)
  local B = batch.B
  return lp:narrow(0, 0, B), lp:narrow(0, B, B)
end

-- ---- the reference -----------------------------------------------------------------------------

local function copy_value(v, memo)
  if memo[v] ~= nil then return memo[v] end
  if is_tensor(v) then
    local c = lt.no_grad(function() return v:detach():clone() end)
    memo[v] = c
    return c
  end
  if type(v) ~= "table" then return v end
  local mt = getmetatable(v)
  if mt ~= nil and not Module.is_module(v) then return v end -- a class, a tokenizer, ...: shared
  local c = {}
  memo[v] = c
  for k, x in next, v do rawset(c, copy_value(k, memo), copy_value(x, memo)) end
  return setmetatable(c, mt)
end

-- A deep copy of a module with every tensor cloned (tied ones stay tied), frozen, in eval mode.
function M.frozen_copy(model)
  if not Module.is_module(model) then raise("dpo.frozen_copy: expected a module, got " .. type(model)) end
  local c = copy_value(model, {})
  c:freeze()
  c:eval()
  return c
end

-- fn() with the model in eval mode and autograd off, the training flags restored after.
local function inference(model, fn)
  local was = {}
  local mods = model:modules()
  for i, m in ipairs(mods) do was[i] = m.training end
  model:eval()
  local ok, a, b = errors.pcall(lt.no_grad, fn)
  for i, m in ipairs(mods) do rawset(m, "training", was[i]) end
  if not ok then error(a, 0) end
  return a, b
end

M.reference = {}

-- A frozen deep copy of model as it is now.
function M.reference.copy(model)
  local ref = M.frozen_copy(model)
  return {kind = "copy", model = ref,
          logps = function(_, batch) return inference(ref, function() return M.sequence_logps(ref, batch) end) end}
end

-- The same model with its LoRA adapters off: the base weights, which LoRA freezes.
function M.reference.lora(model)
  local lora = require "lutra.lora"
  if #lora.layers(model) == 0 then raise("dpo.reference.lora: the model has no LoRA layers (lora.apply first)") end
  return {kind = "lora", model = model, logps = function(_, batch)
    return inference(model, function() return lora.disable(model, M.sequence_logps, model, batch) end)
  end}
end

-- Log-probs given beforehand: a table {chosen = {...}, rejected = {...}} by pair index (what
-- dpo.precompute returns), or a function(batch) -> chosen, rejected (tensors or lists of B).
function M.reference.precomputed(src)
  local fn
  if type(src) == "function" then
    fn = src
  elseif type(src) == "table" and type(src.chosen) == "table" and type(src.rejected) == "table" then
    fn = function(batch)
      local c, r = {}, {}
      for k, i in ipairs(batch.index) do
        c[k], r[k] = src.chosen[i], src.rejected[i]
        if c[k] == nil or r[k] == nil then raise("dpo.reference.precomputed: no log-probs for pair " .. i) end
      end
      return c, r
    end
  else
    raise("dpo.reference.precomputed: expected {chosen =, rejected =} or a function(batch)")
  end
  return {kind = "precomputed", logps = function(_, batch)
    local c, r = fn(batch)
    if not is_tensor(c) then c = lt.tensor(c, {dtype = "f64"}) end
    if not is_tensor(r) then r = lt.tensor(r, {dtype = "f64"}) end
    return c, r
  end}
end

local function reference_of(ref)
  if type(ref) == "table" and type(ref.logps) == "function" then return ref end
  if type(ref) == "function" or (type(ref) == "table" and ref.chosen) then return M.reference.precomputed(ref) end
  raise("dpo: reference must be dpo.reference.copy/lora/precomputed(...), a function or a table of log-probs")
end

-- The reference's log-probs of every pair of list, computed once: {chosen = {...}, rejected = {...}}
-- by pair index (then the reference model can go).
function M.precompute(ref, list, opts)
  ref = reference_of(ref)
  local bs = opts and opts.batch or 8
  local out = {chosen = {}, rejected = {}}
  for s = 1, #list, bs do
    local idx = {}
    for i = s, math.min(#list, s + bs - 1) do idx[#idx + 1] = i end
    memory.tidy(function()
      local batch = M.collate(list, idx)
      local c, r = ref:logps(batch)
      local cl, rl = c:to("f64"):tolist(), r:to("f64"):tolist()
      for k, i in ipairs(batch.index) do out.chosen[i], out.rejected[i] = cl[k], rl[k] end
    end)
  end
  return out
end

-- ---- the loss ------------------------------------------------------------------------------------

local LOSSES = {sigmoid = true, ipo = true, hinge = true}

local function check_loss_opts(opts)
  opts = opts or {}
  local o = {beta = opts.beta or 0.1, loss = opts.loss or "sigmoid", label_smoothing = opts.label_smoothing or 0}
  if type(o.beta) ~= "number" or not (o.beta > 0) then raise("dpo: beta must be a number > 0, got " .. tostring(o.beta)) end
  if not LOSSES[o.loss] then raise("dpo: loss must be \"sigmoid\", \"ipo\" or \"hinge\", got " .. tostring(o.loss)) end
  local eps = o.label_smoothing
  if type(eps) ~= "number" or eps < 0 or eps >= 0.5 then
    raise("dpo: label_smoothing must be in [0, 0.5), got " .. tostring(eps))
  end
  if eps > 0 and o.loss ~= "sigmoid" then raise("dpo: label_smoothing applies to the sigmoid loss only") end
  return o
end

-- log sigmoid(z) = min(z, 0) - log(1 + exp(-|z|)), without overflow
local function log_sigmoid(z)
  local a = z:abs()
  return (z - a) * 0.5 - ((-a):exp() + 1):log()
end

local function mean_of(list)
  local s = 0
  for _, v in ipairs(list) do s = s + v end
  return s / math.max(#list, 1)
end

-- The loss (a scalar tensor, differentiable in pc and pr) and the metrics from policy
-- log-probs pc, pr (B) and reference log-probs rc, rr (B; no gradient flows into them).
function M.loss(pc, pr, rc, rr, opts)
  local o = check_loss_opts(opts)
  rc, rr = rc:detach():to(pc.dtype), rr:detach():to(pc.dtype)
  local beta = o.beta
  local h = (pc - pr) - (rc - rr)
  local loss
  if o.loss == "sigmoid" then
    local z = h * beta
    local eps = o.label_smoothing
    loss = -(log_sigmoid(z) * (1 - eps))
    if eps > 0 then loss = loss - log_sigmoid(-z) * eps end
  elseif o.loss == "ipo" then
    loss = (h - 1 / (2 * beta)) ^ 2
  else
    loss = (-(h * beta) + 1):relu()
  end
  loss = loss:mean()
  local m = {}
  lt.no_grad(function()
    local cr = ((pc:detach() - rc) * beta):to("f64"):tolist()
    local rr_ = ((pr:detach() - rr) * beta):to("f64"):tolist()
    local lc, lr = pc:detach():to("f64"):tolist(), pr:detach():to("f64"):tolist()
    local acc, margin, pref = {}, {}, {}
    for i = 1, #cr do
      acc[i] = cr[i] > rr_[i] and 1 or 0
      margin[i] = cr[i] - rr_[i]
      pref[i] = lc[i] > lr[i] and 1 or 0
    end
    m.chosen_reward, m.rejected_reward = mean_of(cr), mean_of(rr_)
    m.accuracy, m.margin = mean_of(acc), mean_of(margin)
    m.chosen_logp, m.rejected_logp, m.logp_accuracy = mean_of(lc), mean_of(lr), mean_of(pref)
    m.loss = loss:item()
    m.n = #cr
  end)
  return loss, m
end

-- One batch: the policy's log-probs (with autograd), the reference's (without), the loss.
function M.step(model, batch, ref, opts)
  ref = reference_of(ref)
  local rc, rr = ref:logps(batch)
  local pc, pr = M.sequence_logps(model, batch)
  return M.loss(pc, pr, rc, rr, opts)
end

-- Means of the metrics over every pair of list (batches of opts.batch, no autograd, eval mode).
function M.evaluate(model, list, ref, opts)
  opts = opts or {}
  ref = reference_of(ref)
  local bs = opts.batch or 8
  local sums, n = {}, 0
  for s = 1, #list, bs do
    local idx = {}
    for i = s, math.min(#list, s + bs - 1) do idx[#idx + 1] = i end
    memory.tidy(function()
      local batch = M.collate(list, idx)
      local rc, rr = ref:logps(batch)
      local pc, pr = inference(model, function() return M.sequence_logps(model, batch) end)
      local _, m = M.loss(pc, pr, rc, rr, opts)
      for k, v in pairs(m) do
        if k ~= "n" then sums[k] = (sums[k] or 0) + v * m.n end
      end
      n = n + m.n
    end)
  end
  local out = {n = n}
  for k, v in pairs(sums) do out[k] = v / n end
  return out
end

return M
