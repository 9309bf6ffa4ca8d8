-- lutra.sft.data: which tokens carry loss, token by token, with and without packing (the
-- same (document, token) pairs and targets), a packed document's logits and gradients equal
-- to its own (gpt2: learned positions, llama: RoPE), truncation counts, prompt/completion
-- rows, JSONL errors, the loader's resume, and the all-masked batch error.
local lt = require "lutra"
local models = require "lutra.models"
local sft = require "lutra.sft.data"
local templates = require "lutra.sft.templates"
local F = require "lutra.functional"
local T = require "lutra.testing"
local equal, close, fails = T.assert_equal, T.assert_close, T.assert_error

local SPECIALS = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
local tok = lt.tokenizer.char("abcdefghijklmnopqrstuvwxyzHW0123456789+?.,:! \n<|>_", {special_tokens = SPECIALS})

local WORDS = {"cat", "dog", "sun", "tree", "moon", "hello world", "abc"}

-- Random multi-turn chats (1 to 3 exchanges, some with a system message), from the testing generator.
local function random_chats(n)
  local rows = {}
  for i = 1, n do
    local msgs = {}
    if T.randint(0, 3) == 0 then msgs[1] = {role = "system", content = "be brief."} end
    for _ = 1, T.randint(1, 4) do
      local a, b = T.randint(0, 10), T.randint(0, 10)
      msgs[#msgs + 1] = {role = "user", content = string.format("%d+%d? %s", a, b, WORDS[T.randint(1, 8)])}
      msgs[#msgs + 1] = {role = "assistant", content = string.format("%d. %s!", a + b, WORDS[T.randint(1, 8)])}
    end
    rows[i] = {messages = msgs}
  end
  return rows
end

-- The reference: from the segments alone, the row of tokens each loss-carrying token is
-- predicted from, i.e. {[j - 1] = ids[j]} for every token j of a train segment but the first.
local function reference_pairs(row)
  local segs = templates.get("chatml"):render(row.messages)
  local out, pos = {}, 0
  for _, s in ipairs(segs) do
    for _, id in ipairs(tok:encode(s.text)) do
      if s.train and pos > 0 then out[pos - 1] = id end
      pos = pos + 1
    end
  end
  return out, pos
end

-- {[example] = {[token index in its document] = target}} from rows.
local function loss_pairs(rows)
  local out = {}
  for _, r in ipairs(rows) do
    for _, d in ipairs(r.docs) do
      local m = {}
      out[d.example] = m
      for i = 0, d.len - 1 do
        local y = r.targets[d.start + i + 1]
        if y ~= -100 then m[i] = y end
        equal(r.segments[d.start + i + 1], r.segments[d.start + 1], "one segment per document")
        equal(r.positions[d.start + i + 1], i, "positions restart per document")
      end
    end
  end
  return out
end

test("packing never changes which tokens carry loss (multi-turn chats, token by token)", function()
  local rows = random_chats(40)
  local examples, report = sft.encode_rows(rows, {tokenizer = tok})
  equal({report.count, report.truncated, report.no_loss}, {40, 0, 0})
  local packed, single = sft.pack(examples, 256), sft.pad(examples, 256)
  assert(#packed < #single / 2, "packing fills rows: " .. #packed .. " rows for " .. #single .. " examples")
  local p, s = loss_pairs(packed), loss_pairs(single)
  local n = 0
  for k, row in ipairs(rows) do
    local ref, len = reference_pairs(row)
    equal(#examples[k].ids, len)
    equal(p[k], ref, "packed, example " .. k)
    equal(s[k], ref, "alone, example " .. k)
    for _ in pairs(ref) do n = n + 1 end
  end
  equal(n, report.loss_tokens)
  -- every other position of a packed row (padding, last tokens, prompts) carries none
  local total = 0
  for _, r in ipairs(packed) do total = total + r.n_loss end
  equal(total, n)
  -- documents in a row: consecutive segments, padding after them a segment of its own
  for _, r in ipairs(packed) do
    for i, d in ipairs(r.docs) do equal(r.segments[d.start + 1], i - 1) end
    if r.used < #r.ids then equal(r.segments[#r.ids], #r.docs) end
  end
  -- the batch tensors hold the rows
  local b = sft.batch({packed[1], packed[2]})
  equal(b.x:tolist(), {packed[1].ids, packed[2].ids})
  equal(b.y:tolist(), {packed[1].targets, packed[2].targets})
  equal(b.segments:tolist(), {packed[1].segments, packed[2].segments})
  equal(b.positions:tolist(), {packed[1].positions, packed[2].positions})
  equal(b.n_loss, packed[1].n_loss + packed[2].n_loss)
end)

-- Packed logits vs each document alone, and the summed loss's gradients.
local function check_packed_model(arch)
  local rows = random_chats(10)
  local examples = sft.encode_rows(rows, {tokenizer = tok, max_len = 96})
  local packed = sft.pack(examples, 128)
  local single = sft.pad(examples, 128)
  lt.manual_seed(3)
  local cfg = {arch = arch, n_layer = 2, n_head = 4, d_model = 32, vocab_size = tok.vocab_size, block_size = 128}
  if arch == "llama" then cfg.n_kv_head = 2 end
  local model = models.build(cfg)
  model:eval()
  local bp = sft.batch(packed)
  local logits = model:forward(bp.x, nil, {segments = bp.segments, positions = bp.positions})
  local no_seg = model:forward(bp.x)
  local worst_without = 0
  for ri, r in ipairs(packed) do
    for _, d in ipairs(r.docs) do
      local b = sft.batch({single[d.example]})
      local alone = model:forward(b.x):select(0, 0):narrow(0, 0, d.len)
      local got = logits:select(0, ri - 1):narrow(0, d.start, d.len)
      close(got, alone, {atol = 1e-5, rtol = 0, msg = arch .. " example " .. d.example})
      if d.start > 0 then
        local diff = (no_seg:select(0, ri - 1):narrow(0, d.start, d.len) - alone):abs():max():item()
        worst_without = math.max(worst_without, diff)
      end
    end
  end
  -- the control: without segments and positions, later documents see earlier ones
  assert(worst_without > 1e-2, arch .. ": the unpacked forward of a packed row should differ: " .. worst_without)
  -- gradients: the summed loss of the packed rows equals the sum over documents alone
  model:train()
  model:zero_grad()
  local lp = F.cross_entropy(model:forward(bp.x, nil, {segments = bp.segments, positions = bp.positions}), bp.y,
    {reduction = "sum"})
  lp:backward()
  local gp = {}
  for name, p in model:named_parameters() do gp[name] = p.grad:clone() end
  model:zero_grad()
  local ls = 0
  for _, r in ipairs(single) do
    local b = sft.batch({r})
    local l = F.cross_entropy(model:forward(b.x), b.y, {reduction = "sum"})
    l:backward()
    ls = ls + l:item()
  end
  close(lp:item(), ls, {rtol = 1e-5, atol = 1e-4, msg = arch .. " summed loss"})
  for name, p in model:named_parameters() do
    close(gp[name], p.grad, {atol = 1e-4, rtol = 1e-3, msg = arch .. " grad " .. name})
  end
end

test("gpt2 (learned positions): a packed document's logits and gradients are its own", function()
  check_packed_model("gpt2")
end)

test("llama (RoPE, GQA): a packed document's logits and gradients are its own", function()
  check_packed_model("llama")
end)

test("the model checks positions and segments", function()
  local model = models.build {arch = "gpt2", n_layer = 1, n_head = 2, d_model = 8, vocab_size = 16, block_size = 8}
  local x = lt.zeros(2, 4, {dtype = "i64"})
  fails("positions must be (B, T) = (2, 4)", function() model:forward(x, nil, {positions = lt.zeros(2, 3, {dtype = "i64"})}) end)
  fails("segments must be i64 or i32, got f32", function() model:forward(x, nil, {segments = lt.zeros(2, 4)}) end)
  lt.no_grad(function()
    fails("do not go with a cache", function()
      model:forward(x, nil, {cache = model:kv_cache(2), segments = lt.zeros(2, 4, {dtype = "i64"})})
    end)
  end)
end)

test("truncation to max_len is counted and reported", function()
  local rows = {
    {messages = {{role = "user", content = "abc"}, {role = "assistant", content = "cba"}}}, -- 6+3+2 + 11+3+2 = 27
    {messages = {{role = "user", content = "hello world hello world"}, {role = "assistant", content = "ok"}}}, -- 31+15
    {messages = {{role = "user", content = "hello world hello world hello world"}, {role = "assistant", content = "no"}}},
  }
  local all = sft.encode_rows(rows, {tokenizer = tok})
  equal({#all[1].ids, #all[2].ids, #all[3].ids}, {27, 46, 58})
  local ex, r = sft.encode_rows(rows, {tokenizer = tok, max_len = 40})
  -- row 2 keeps 40 of 46 tokens (its answer is tokens 43-45: nothing left to learn, dropped);
  -- row 3 too (58 -> 40, dropped)
  equal({r.rows, r.count, r.truncated, r.tokens_dropped, r.no_loss}, {3, 1, 2, 6 + 18, 2})
  equal(#ex, 1)
  ex, r = sft.encode_rows(rows, {tokenizer = tok, max_len = 45})
  -- row 2: 45 tokens, "ok<|im_end|>" kept (the final newline cut); row 3: 58 -> 45, no answer left
  equal({r.count, r.truncated, r.tokens_dropped, r.no_loss, r.loss_tokens}, {2, 2, 1 + 13, 1, 4 + 3})
  equal(#ex[2].ids, 45)
  assert(sft.describe(r):find("2 truncated to 45 tokens %(14 tokens dropped%)"), sft.describe(r))
  fails("example 1 has 45 tokens, more than seq_len 32", function() sft.pack({ex[2]}, 32) end)
  fails("max_len must be a number >= 2", function() sft.encode_rows(rows, {tokenizer = tok, max_len = 1}) end)
end)

test("prompt/completion rows: only the completion carries loss", function()
  local rows = {{prompt = "abc", completion = "cba"}}
  local ex = sft.encode_rows(rows, {tokenizer = tok})
  local ids2, mask2 = templates.encode(tok, "chatml", {{role = "user", content = "abc"},
                                                       {role = "assistant", content = "cba"}})
  equal({ex[1].ids, ex[1].mask}, {ids2, mask2})
  ex = sft.encode_rows(rows, {tokenizer = tok, raw = true})
  equal(tok:decode(ex[1].ids), "abccba<|endoftext|>")
  equal(table.concat(ex[1].mask), "0001111")
end)

test("load_jsonl: rows, report, errors naming the line", function()
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write('{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}\n')
  f:write('{"prompt": "abc", "completion": "cba"}\n')
  f:close()
  local ex, r = sft.load_jsonl(path, {tokenizer = tok, template = "llama3"})
  equal({#ex, r.count, r.template, r.path}, {2, 2, "llama3", path})
  f = assert(io.open(path, "a"))
  f:write('{"text": "x"}\n')
  f:close()
  fails(path .. ":3: expected \"messages\" or \"prompt\" and \"completion\"",
    function() sft.load_jsonl(path, {tokenizer = tok}) end)
  f = assert(io.open(path, "w"))
  f:write('{"messages": [{"role": "bot", "content": "x"}]}\n')
  f:close()
  fails(path .. ":1: messages[0].role: unknown role \"bot\"", function() sft.load_jsonl(path, {tokenizer = tok}) end)
  os.remove(path)
  fails("cannot open", function() sft.load_jsonl(path .. ".missing", {tokenizer = tok}) end)
  fails("opts.tokenizer is required", function() sft.encode_rows({}, {}) end)
end)

test("loader: shuffled epochs, resumes from its state", function()
  local ex = sft.encode_rows(random_chats(12), {tokenizer = tok})
  local rows = sft.pad(ex, 160)
  local a = sft.loader(rows, {batch = 5, seed = 7})
  local seen = {}
  for _ = 1, 2 do
    for _, v in ipairs(a:next().x:select(1, 0):tolist()) do seen[#seen + 1] = v end
  end
  local st = a:state()
  local want = a:next().x:tolist()
  local b = sft.loader(rows, {batch = 5, seed = 7})
  b:set_state(st)
  equal(b:next().x:tolist(), want)
  equal(st, {epoch = 0, pos = 10})
  fails("no rows", function() sft.loader({}) end)
end)

test("a batch whose labels are all masked is an error (or a counted warning), never a silent zero", function()
  local rows = {{messages = {{role = "user", content = "abc"}}}, {messages = {{role = "user", content = "cat"}}}}
  local ex, r = sft.encode_rows(rows, {tokenizer = tok})
  equal({#ex, r.no_loss}, {0, 2})
  ex = sft.encode_rows(rows, {tokenizer = tok, keep_empty = true})
  local b = sft.batch(sft.pack(ex, 32))
  equal(b.n_loss, 0)
  local model = models.build {arch = "gpt2", n_layer = 1, n_head = 2, d_model = 8, vocab_size = tok.vocab_size,
                              block_size = 160}
  local before = sft.empty_batches
  fails("a batch whose labels are all masked (-100): no token carries loss", function() sft.loss(model, b) end)
  b.n_loss = nil -- counted from the targets tensor too
  fails("all masked", function() sft.loss(model, b) end)
  local loss = sft.loss(model, b, {on_empty = "warn"})
  equal(loss:item(), 0)
  equal(sft.empty_batches, before + 3)
  -- a normal batch: the mean over its loss tokens
  local good = sft.batch(sft.pad(sft.encode_rows(random_chats(2), {tokenizer = tok}), 160))
  local l = sft.loss(model, good)
  local sum = F.cross_entropy(model:forward(good.x, nil, {segments = good.segments, positions = good.positions}),
    good.y, {reduction = "sum"})
  close(l:item(), sum:item() / good.n_loss, {rtol = 1e-5})
end)
