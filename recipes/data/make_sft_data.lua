-- recipes/data/make_sft_data.lua — the example fine-tuning data of recipes/sft.lua and
-- recipes/dpo.lua: small synthetic chats that a tiny char-level model learns in a few CPU
-- minutes. Plain Lua (runs under lutra or luajit), deterministic (its own generator).
--
--   lutra recipes/data/make_sft_data.lua [OUT_DIR]      -- default: recipes/data
--
-- sft_train.jsonl / sft_val.jsonl: {"messages": [{"role", "content"}, ...]} chats, one to
-- three exchanges (some with a short system message; later exchanges mostly only while the
-- chat fits 64 ChatML tokens, the default block size), on five tasks with fixed rules:
--   "3+5?"            -> "3+5=8."                    (one-digit sums)
--   "upper: cat"      -> "CAT"
--   "reverse: dog"    -> "god"
--   "capital of peru" -> "lima"                      (eight facts)
--   "hi" / "hello"    -> "Hello! How can I help?"    (a fixed style)
-- plus a tenth of prompt/completion rows (the same tasks) to exercise that format.
-- dpo_train.jsonl / dpo_val.jsonl: {"prompt", "chosen", "rejected"}: chosen follows the
-- rule, rejected breaks it (a wrong sum, the word unchanged, a rude greeting).
-- Only printable ASCII: every character is in the vocabulary of the default char-level
-- pretraining corpus.
local out_dir = arg and arg[1] or ((arg and arg[0] or ""):match("^(.*)/[^/]+$") or "recipes/data")

local seed = 20261202
local function rand(n) -- 1..n, an LCG (the same sequence everywhere)
  seed = (seed * 1103515245 + 12345) % 2147483648
  return math.floor(seed / 65536) % n + 1
end
local function pick(list) return list[rand(#list)] end

local WORDS = {"cat", "dog", "sun", "tree", "book", "fish", "moon", "star", "bird", "rain", "milk", "door", "lamp",
               "rock", "ship", "king", "frog", "bell", "cake", "wolf", "rose", "snow", "leaf", "hill", "road",
               "fire", "gold", "wind", "salt", "corn", "lion", "bear", "duck", "pear", "kite", "nest", "owl",
               "map", "cup", "hat"}
local CAPITALS = {{"peru", "lima"}, {"france", "paris"}, {"japan", "tokyo"}, {"italy", "rome"}, {"egypt", "cairo"},
                  {"spain", "madrid"}, {"chile", "santiago"}, {"kenya", "nairobi"}}
local GREETINGS = {"hi", "hello", "hey", "good morning", "hi there"}
local GREETING_REPLY = "Hello! How can I help?"
local SYSTEMS = {"Be brief.", "Answer in few words."}

-- One task: prompt, the right answer, a wrong one.
local TASKS = {
  function()
    local a, b = rand(10) - 1, rand(10) - 1
    local wrong = a + b + (rand(2) == 1 and 1 or -1) * rand(3)
    if wrong < 0 then wrong = a + b + 2 end
    return string.format("%d+%d?", a, b), string.format("%d+%d=%d.", a, b, a + b),
      string.format("%d+%d=%d.", a, b, wrong)
  end,
  function()
    local w = pick(WORDS)
    return "upper: " .. w, w:upper(), w
  end,
  function()
    local w = pick(WORDS)
    return "reverse: " .. w, w:reverse(), w
  end,
  function()
    local c = pick(CAPITALS)
    local other = pick(CAPITALS)
    if other == c then other = CAPITALS[(rand(7) + (c == CAPITALS[1] and 1 or 0)) % 8 + 1] end
    if other == c then other = c == CAPITALS[1] and CAPITALS[2] or CAPITALS[1] end
    return "capital of " .. c[1], c[2], other[2]
  end,
  function()
    return pick(GREETINGS), GREETING_REPLY, "What do you want?"
  end,
}
local function task() return TASKS[rand(#TASKS)]() end

local function q(s) -- a JSON string (these texts have no control characters)
  return '"' .. s:gsub('[\\"]', "\\%0") .. '"'
end

-- ChatML tokens of a message for a char-level tokenizer with <|im_start|>, <|im_end|> special.
local function chatml_len(role, content) return 1 + #role + 1 + #content + 1 + 1 end
local BUDGET = 64 -- the block size of recipes/pretrain.lua's default model

local function chat_line()
  if rand(10) == 1 then
    local p, a = task()
    return string.format('{"prompt": %s, "completion": %s}', q(p), q(a))
  end
  local msgs, len = {}, 0
  if rand(5) == 1 then
    msgs[1] = {"system", pick(SYSTEMS)}
    len = chatml_len("system", msgs[1][2])
  end
  local turns = ({1, 2, 2, 3})[rand(4)]
  for i = 1, turns do
    local p, a = task()
    local n = chatml_len("user", p) + chatml_len("assistant", a)
    -- later exchanges while they fit the budget (one in ten goes over: truncation happens)
    if i > 1 and len + n > BUDGET and rand(10) > 1 then break end
    msgs[#msgs + 1] = {"user", p}
    msgs[#msgs + 1] = {"assistant", a}
    len = len + n
  end
  local parts = {}
  for i, m in ipairs(msgs) do parts[i] = string.format('{"role": %s, "content": %s}', q(m[1]), q(m[2])) end
  return '{"messages": [' .. table.concat(parts, ", ") .. "]}"
end

local function dpo_line()
  local p, chosen, rejected = task()
  return string.format('{"prompt": %s, "chosen": %s, "rejected": %s}', q(p), q(chosen), q(rejected))
end

local function write(name, n, line)
  local path = out_dir .. "/" .. name
  local f = assert(io.open(path, "wb"))
  for _ = 1, n do f:write(line(), "\n") end
  f:close()
  print(string.format("%s: %d rows", path, n))
end

write("sft_train.jsonl", 3000, chat_line)
write("sft_val.jsonl", 200, chat_line)
write("dpo_train.jsonl", 2000, dpo_line)
write("dpo_val.jsonl", 200, dpo_line)
