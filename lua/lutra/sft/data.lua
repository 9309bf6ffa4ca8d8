-- lutra.sft.data — supervised fine-tuning data: JSONL chats -> token ids with a loss mask,
-- truncation (counted), packing into fixed-length rows with document boundaries, batches,
-- and the masked next-token loss.
--
--   local sft = require "lutra.sft.data"
--   local examples, report = sft.load_jsonl("train.jsonl", {tokenizer = tok, template = "chatml", max_len = 256})
--   print(sft.describe(report))        -- examples, tokens, loss tokens, truncated (tokens dropped)
--   local rows = sft.pack(examples, 256)           -- or sft.pad(examples, 256): one example per row
--   local loader = sft.loader(rows, {batch = 8, seed = 1})
--   local b = loader:next()            -- {x =, y =, segments =, positions = (B, T) i64, n_loss =}
--   local loss = sft.loss(model, b)    -- mean over the tokens that carry loss
--
-- A JSONL row is {"messages": [{"role": ..., "content": ...}, ...]} (rendered by the chat
-- template; only assistant turns carry loss) or {"prompt": ..., "completion": ...} (a user
-- turn and an assistant turn of the template; with opts.raw = true the plain text
-- prompt .. completion .. eos, where only the completion and eos carry loss). Checked before
-- use, each an error naming the file, line and field: roles system, user or assistant,
-- contents strings, a conversation not empty, not both forms in one row, every character one
-- the tokenizer can encode. A conversation without an assistant turn carries no loss: it is
-- dropped and counted (report.no_loss), as is one whose loss tokens truncation removed.
-- With a model's own Jinja template (lutra.sft.hf_template) the messages are the template's to
-- judge (any role, tool_calls, reasoning_content, null contents; a row's "tools" list is passed
-- as tools): what it refuses (raise_exception) is an error naming the row, then the template's
-- file and line.
--
-- An example is {ids =, mask =}: mask[i] = 1 when ids[i] is a token the model must learn to
-- predict. Its targets: position i predicts ids[i + 1] when mask[i + 1] = 1, else -100; the
-- last token of a document predicts nothing. Packing puts several examples in a row of
-- seq_len tokens; segments number the documents of a row (0, 1, ...; the padding after them
-- is one more segment), positions restart at 0 in each document, and targets never cross
-- a boundary: a packed example carries loss on exactly the tokens it carries alone.
local ffi = require "ffi"
local errors = require "lutra.errors"
local create = require "lutra.create"
local templates = require "lutra.sft.templates"
local jsonl = require "lutra.sft.jsonl"
local json = require "lutra.json"

local raise = errors.raise

local M = {}

local IGNORE = -100
M.IGNORE = IGNORE

-- ---- rows -> examples -------------------------------------------------------------------------

local function message_of(err) return (tostring(err):gsub("^[^\n]-:%d+: ", "")) end

-- Checks a row's form; at prefixes errors ("sft: train.jsonl:17: "), base numbers the messages.
local function check_row(row, at, base)
  if not jsonl.is_object(row) then raise(at .. "expected a JSON object, got " .. jsonl.kind(row)) end
  if row.messages ~= nil then
    if row.prompt ~= nil or row.completion ~= nil then
      raise(at .. 'has both "messages" and "prompt"/"completion": give one form or the other')
    end
    jsonl.check_messages(at, "messages", row.messages, base)
    return
  end
  if row.prompt ~= nil or row.completion ~= nil then
    for _, k in ipairs {"prompt", "completion"} do
      if row[k] == nil then raise(string.format('%s%s: missing ("prompt" and "completion" go together)', at, k)) end
      if type(row[k]) ~= "string" then
        raise(string.format("%s%s: expected a string, got %s", at, k, jsonl.kind(row[k])))
      end
    end
    return
  end
  raise(at .. 'expected "messages" or "prompt" and "completion" (strings); the object has ' .. jsonl.keys(row))
end

local function segments_of(row, t, opts, at, base)
  check_row(row, at, base)
  local ok, segs
  if row.messages ~= nil then
    ok, segs = pcall(t.render, t, row.messages)
  elseif opts.raw then
    return {{text = row.prompt, role = "user", train = false},
            {text = row.completion .. (opts.eos or "<|endoftext|>"), role = "assistant", train = true}}
  else
    local chat = {{role = "user", content = row.prompt}, {role = "assistant", content = row.completion}}
    ok, segs = pcall(t.render, t, chat)
  end
  if not ok then raise(at .. message_of(segs)) end
  return segs
end

-- ids, mask of a checked row's segments; an error names the field the tokenizer cannot encode.
local function encode_checked(tok, segs, row, at, base)
  local ok, ids, mask = pcall(templates.encode_segments, tok, segs)
  if ok then return ids, mask end
  local fields = {}
  if row.messages ~= nil then
    for i, m in ipairs(row.messages) do
      fields[i] = {name = string.format("messages[%d].content", i - 1 + base), text = m.content}
    end
  else
    fields = {{name = "prompt", text = row.prompt}, {name = "completion", text = row.completion}}
  end
  jsonl.raise_unencodable(at, tok, fields, ids)
end

-- A row through a model's own Jinja template (lutra.sft.hf_template): the messages as the template
-- reads them (other roles, tool_calls, reasoning_content, ... are the template's to accept or
-- refuse, by raise_exception) and the row's "tools"; the rendered text tokenized as one.
local function encode_jinja(tok, t, row, at, base)
  if not jsonl.is_object(row) then raise(at .. "expected a JSON object, got " .. jsonl.kind(row)) end
  local msgs = row.messages
  if msgs ~= nil then
    if row.prompt ~= nil or row.completion ~= nil then
      raise(at .. 'has both "messages" and "prompt"/"completion": give one form or the other')
    end
    if not jsonl.is_list(msgs) or #msgs == 0 then
      raise(string.format('%smessages: expected a non-empty list of messages, got %s', at, jsonl.kind(msgs)))
    end
    for i, m in ipairs(msgs) do
      local name = string.format("messages[%d]", i - 1 + base)
      if not jsonl.is_object(m) then raise(string.format("%s%s: expected an object, got %s", at, name, jsonl.kind(m))) end
      if type(m.role) ~= "string" then
        raise(string.format("%s%s.role: expected a string, got %s", at, name, jsonl.kind(m.role)))
      end
    end
  else
    check_row(row, at, base)
    msgs = {{role = "user", content = row.prompt}, {role = "assistant", content = row.completion}}
  end
  local tools = row.tools ~= json.null and row.tools or nil
  if tools ~= nil and not jsonl.is_list(tools) then
    raise(string.format("%stools: expected a list of tool schemas, got %s", at, jsonl.kind(row.tools)))
  end
  local ok, ids, mask = pcall(t.encode, t, tok, msgs, {tools = tools})
  if ok then return ids, mask end
  local err = message_of(ids)
  if err:find("^chat template") then raise(at .. err) end
  local fields = {}
  for i, m in ipairs(msgs) do
    fields[i] = {name = string.format("messages[%d].content", i - 1 + base), text = m.content}
  end
  jsonl.raise_unencodable(at, tok, fields, err)
end

local function encode_any(tok, t, row, opts, at, base)
  if t.kind == "jinja" and not (opts.raw and row.messages == nil) then return encode_jinja(tok, t, row, at, base) end
  return encode_checked(tok, segments_of(row, t, opts, at, base), row, at, base)
end

-- One row -> ids, mask (no truncation). opts.where names the row in errors.
function M.encode_row(tok, template, row, opts)
  opts = opts or {}
  local at = "sft: " .. (opts.where or "row") .. ": "
  return encode_any(tok, templates.get(template), row, opts, at, 1)
end

local function count_ones(mask, from, to)
  local n = 0
  for i = from, to do n = n + mask[i] end
  return n
end

-- Rows (a list of tables) -> examples, report. opts: tokenizer, template, max_len (tokens;
-- longer examples keep their first max_len), raw, eos, keep_empty (keep examples with no
-- loss token left: by default they are dropped and counted).
function M.encode_rows(rows, opts)
  opts = opts or {}
  local tok = opts.tokenizer
  if type(tok) ~= "table" or type(tok.encode) ~= "function" then raise("sft: opts.tokenizer is required") end
  local t = templates.get(opts.template)
  local max_len = opts.max_len
  if max_len ~= nil and (type(max_len) ~= "number" or max_len < 2) then
    raise("sft: max_len must be a number >= 2, got " .. tostring(max_len))
  end
  local examples = {}
  local report = {rows = #rows, count = 0, truncated = 0, tokens_dropped = 0, tokens = 0, loss_tokens = 0,
                  no_loss = 0, max_len = max_len, template = t.name}
  local base = opts.path and 0 or 1 -- a file's fields count from 0, as its JSON does; a Lua list's from 1
  for i, row in ipairs(rows) do
    local at = opts.path and string.format("sft: %s:%d: ", opts.path, type(row) == "table" and row.__line or i)
      or string.format("sft: row %d: ", i)
    local ids, mask = encode_any(tok, t, row, opts, at, base)
    if max_len and #ids > max_len then
      report.truncated = report.truncated + 1
      report.tokens_dropped = report.tokens_dropped + (#ids - max_len)
      for j = #ids, max_len + 1, -1 do
        ids[j], mask[j] = nil, nil
      end
    end
    -- the first token is never predicted: it carries no loss
    local nloss = #ids > 1 and count_ones(mask, 2, #ids) or 0
    if nloss == 0 and not opts.keep_empty then
      report.no_loss = report.no_loss + 1
    else
      examples[#examples + 1] = {ids = ids, mask = mask, index = i}
      report.count = report.count + 1
      report.tokens = report.tokens + #ids
      report.loss_tokens = report.loss_tokens + nloss
    end
  end
  return examples, report
end

-- A JSONL file -> examples, report (as encode_rows). The file's form is lutra.sft.jsonl's (CRLF
-- accepted, blank lines skipped, a BOM or an empty file refused); every error names the file,
-- the line and the field: "sft: train.jsonl:17: messages[2].role: unknown role ...".
function M.load_jsonl(path, opts)
  opts = opts or {}
  local rows = {}
  for i, rec in ipairs(jsonl.read(path, "sft")) do
    rec.value.__line = rec.line
    rows[i] = rec.value
  end
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.path = path
  local examples, report = M.encode_rows(rows, o)
  report.path = path
  return examples, report
end

function M.describe(r)
  return string.format(
    "%d examples (%s template), %d tokens, %d carry loss; %d truncated to %s tokens (%d tokens dropped)%s",
    r.count, r.template or "?", r.tokens, r.loss_tokens, r.truncated, tostring(r.max_len or "-"), r.tokens_dropped,
    r.no_loss > 0 and string.format("; %d without a loss token dropped", r.no_loss) or "")
end

-- ---- examples -> rows ---------------------------------------------------------------------------

-- The targets of one example (a list as long as ids).
function M.targets(ids, mask)
  local y = {}
  local n = #ids
  for i = 1, n - 1 do y[i] = mask[i + 1] == 1 and ids[i + 1] or IGNORE end
  if n > 0 then y[n] = IGNORE end
  return y
end

local function new_row(seq_len, pad_id)
  local r = {ids = {}, targets = {}, segments = {}, positions = {}, docs = {}, used = 0}
  for i = 1, seq_len do
    r.ids[i], r.targets[i], r.segments[i], r.positions[i] = pad_id, IGNORE, 0, 0
  end
  return r
end

local function place(r, ex, k)
  local y = M.targets(ex.ids, ex.mask)
  local start, seg = r.used, #r.docs
  for j = 1, #ex.ids do
    r.ids[start + j], r.targets[start + j] = ex.ids[j], y[j]
    r.segments[start + j], r.positions[start + j] = seg, j - 1
  end
  r.docs[#r.docs + 1] = {example = k, start = start, len = #ex.ids}
  r.used = start + #ex.ids
end

-- The padding after the documents: its own segment, positions from 0.
local function close(r, seq_len)
  local seg = #r.docs
  for i = r.used + 1, seq_len do
    r.segments[i], r.positions[i] = seg, i - r.used - 1
  end
  r.n_loss = 0
  for i = 1, seq_len do
    if r.targets[i] ~= IGNORE then r.n_loss = r.n_loss + 1 end
  end
  return r
end

local function check_fits(ex, k, seq_len)
  if #ex.ids > seq_len then
    raise(string.format("sft.pack: example %d has %d tokens, more than seq_len %d (load with max_len = %d)", k,
      #ex.ids, seq_len, seq_len))
  end
end

-- Examples -> rows of seq_len tokens, first fit in order (each example goes to the first
-- row with room; rows are {ids, targets, segments, positions, docs = {{example, start,
-- len}}, n_loss}). opts.pad_id (default 0).
function M.pack(examples, seq_len, opts)
  opts = opts or {}
  local pad = opts.pad_id or 0
  local rows = {}
  local first_open = 1 -- rows before it have less room than the smallest example seen (2 tokens)
  for k, ex in ipairs(examples) do
    check_fits(ex, k, seq_len)
    local n, target = #ex.ids, nil
    for i = first_open, #rows do
      if seq_len - rows[i].used >= n then
        target = rows[i]
        break
      end
    end
    if target == nil then
      target = new_row(seq_len, pad)
      rows[#rows + 1] = target
    end
    place(target, ex, k)
    while first_open <= #rows and seq_len - rows[first_open].used < 2 do first_open = first_open + 1 end
  end
  for _, r in ipairs(rows) do close(r, seq_len) end
  return rows
end

-- One example per row, padded to seq_len (no packing: the reference that pack must agree with).
function M.pad(examples, seq_len, opts)
  opts = opts or {}
  local rows = {}
  for k, ex in ipairs(examples) do
    check_fits(ex, k, seq_len)
    local r = new_row(seq_len, opts.pad_id or 0)
    place(r, ex, k)
    rows[k] = close(r, seq_len)
  end
  return rows
end

-- Fraction of the rows' tokens that are documents (not padding).
function M.fill_ratio(rows)
  local used, total = 0, 0
  for _, r in ipairs(rows) do
    used, total = used + r.used, total + #r.ids
  end
  return total > 0 and used / total or 0
end

-- ---- batches --------------------------------------------------------------------------------------

local function fill(t, rows, key)
  local p = ffi.cast("int64_t *", t:data_ptr())
  local T = #rows[1].ids
  for b, r in ipairs(rows) do
    local src = r[key]
    for i = 1, T do p[(b - 1) * T + i - 1] = src[i] end
  end
  return t
end

-- A list of rows -> {x =, y =, segments =, positions = (B, T) i64, n_loss =, x, y}.
function M.batch(rows)
  local B, T = #rows, #rows[1].ids
  local function t(key) return fill(create.empty(B, T, {dtype = "i64"}), rows, key) end
  local n = 0
  for _, r in ipairs(rows) do n = n + r.n_loss end
  local x, y = t("ids"), t("targets")
  return {x = x, y = y, segments = t("segments"), positions = t("positions"), n_loss = n, x, y}
end

-- Loader over rows: batches of opts.batch rows in a shuffled order (opts.seed; a new order
-- each epoch; shuffle = false keeps the order), with :state() / :set_state() for resume.
local Loader = {}
Loader.__index = Loader

local function order_of(n, seed, epoch, shuffle)
  local idx = {}
  for i = 1, n do idx[i] = i end
  if not shuffle then return idx end
  local s = (seed * 1103515245 + epoch * 12345 + 1) % 2147483648
  for i = n, 2, -1 do
    s = (s * 1103515245 + 12345) % 2147483648
    local j = s % i + 1
    idx[i], idx[j] = idx[j], idx[i]
  end
  return idx
end

function M.loader(rows, opts)
  opts = opts or {}
  if #rows == 0 then raise("sft.loader: no rows") end
  local self = setmetatable({rows = rows, batch = opts.batch or 8, seed = opts.seed or 0,
                             shuffle = opts.shuffle ~= false, epoch = 0, pos = 0}, Loader)
  self.order = order_of(#rows, self.seed, 0, self.shuffle)
  return self
end

function Loader:next()
  local picked = {}
  for i = 1, self.batch do
    if self.pos >= #self.rows then
      self.epoch, self.pos = self.epoch + 1, 0
      self.order = order_of(#self.rows, self.seed, self.epoch, self.shuffle)
    end
    self.pos = self.pos + 1
    picked[i] = self.rows[self.order[self.pos]]
  end
  return M.batch(picked)
end

function Loader:state() return {epoch = self.epoch, pos = self.pos} end
function Loader:set_state(s)
  self.epoch, self.pos = s.epoch, s.pos
  self.order = order_of(#self.rows, self.seed, self.epoch, self.shuffle)
end

-- ---- the loss ----------------------------------------------------------------------------------------

M.empty_batches = 0 -- batches met with no token carrying loss (on_empty = "warn")

-- The mean loss of the batch's loss-carrying tokens. A batch where every target is -100 is an
-- error (opts.on_empty = "error", the default) or a warning with a running count ("warn",
-- the loss is then 0 with a graph), never a silent zero.
function M.loss(model, batch, opts)
  opts = opts or {}
  local n = batch.n_loss
  if n == nil then
    n = 0
    for _, v in ipairs(batch.y:reshape(-1):tolist()) do
      if v ~= IGNORE then n = n + 1 end
    end
  end
  local logits, loss
  if n == 0 then
    M.empty_batches = M.empty_batches + 1
    if opts.on_empty ~= "warn" then
      raise(string.format("sft: a batch whose labels are all masked (-100): no token carries loss "
        .. "(%d such batches so far; check the template's loss mask and max_len)", M.empty_batches))
    end
    io.stderr:write(string.format("sft: warning: a batch with no token carrying loss (%d so far)\n", M.empty_batches))
    logits = model:forward(batch.x, nil, {segments = batch.segments, positions = batch.positions})
    return logits:sum() * 0
  end
  logits, loss = model:forward(batch.x, batch.y, {segments = batch.segments, positions = batch.positions})
  return loss
end

-- The held-out loss per loss-carrying token over all rows (no grad, eval mode): sum, count.
function M.evaluate(model, rows, opts)
  opts = opts or {}
  local F = require "lutra.functional"
  local grad = require "lutra.nn.grad"
  local memory = require "lutra.memory"
  local bs = opts.batch or 8
  local was_training = rawget(model, "training")
  if type(model.eval) == "function" then model:eval() end
  local sum, count = 0, 0
  local ok, err = errors.pcall(function()
    for i = 1, #rows, bs do
      local part = {}
      for j = i, math.min(i + bs - 1, #rows) do part[#part + 1] = rows[j] end
      sum = sum + grad.no_grad(memory.tidy, function()
        local b = M.batch(part)
        local logits = model:forward(b.x, nil, {segments = b.segments, positions = b.positions})
        return (F.cross_entropy(logits, b.y, {ignore_index = IGNORE, reduction = "sum"})):item()
      end)
      for _, r in ipairs(part) do count = count + r.n_loss end
    end
  end)
  if type(model.train) == "function" then model:train(was_training ~= false) end
  if not ok then error(err, 0) end
  return count > 0 and sum / count or 0 / 0, count
end

return M
