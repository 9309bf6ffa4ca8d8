-- lutra.sft.eval — answers of a chat model: greedy replies and exact-match accuracy.
--
--   local ev = require "lutra.sft.eval"
--   local text = ev.reply(model, tok, "chatml", {{role = "user", content = "3+4?"}})
--   local right, n = ev.exact_match(model, tok, "chatml", "recipes/data/sft_val.jsonl", {limit = 100})
--
-- exact_match asks each single-exchange chat of a JSONL file ({"messages": [user, assistant]}
-- with an optional system message first, or {"prompt", "completion"}) its question and
-- compares the greedy reply, up to the end-of-turn, with the expected answer.
local templates = require "lutra.sft.templates"
local generate = require "lutra.generate"

local M = {}

-- The greedy reply to messages (the end-of-turn marker and what follows it removed).
function M.reply(model, tok, template, messages, opts)
  opts = opts or {}
  local t = templates.get(template)
  local prompt = templates.encode(tok, t, messages, {add_generation_prompt = true})
  local ids = generate(model, prompt, {max_new_tokens = opts.max_new_tokens or 32, temperature = 0,
                                       stop_token = templates.stop_id(tok, t)})
  local text = tok:decode({unpack(ids, #prompt + 1)})
  local at = t.stop and text:find(t.stop, 1, true)
  return at and text:sub(1, at - 1) or text
end

-- (question messages, answer) of a row with one exchange, or nil.
local function single(row)
  if type(row.prompt) == "string" and type(row.completion) == "string" then
    return {{role = "user", content = row.prompt}}, row.completion
  end
  local m = row.messages
  if type(m) ~= "table" then return nil end
  for i = 1, #m do
    if type(m[i]) ~= "table" or type(m[i].content) ~= "string" then return nil end
  end
  local first = (m[1] and m[1].role == "system") and 2 or 1
  if #m ~= first + 1 or m[first].role ~= "user" or m[first + 1].role ~= "assistant" then return nil end
  local q = {}
  for i = 1, first do q[i] = m[i] end
  return q, m[first + 1].content
end

-- right, n over the first opts.limit (default 100) single-exchange rows of a JSONL file.
function M.exact_match(model, tok, template, path, opts)
  opts = opts or {}
  local limit = opts.limit or 100
  local right, n = 0, 0
  if limit <= 0 then return right, n end
  require("lutra.sft.jsonl").each(path, "sft.eval", function(row) -- errors name the file and line
    local q, answer = single(row)
    if q then
      n = n + 1
      if M.reply(model, tok, template, q, opts) == answer then right = right + 1 end
    end
    return n >= limit
  end)
  return right, n
end

return M
