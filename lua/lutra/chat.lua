-- lutra.chat — `lutra chat MODEL_DIR` and `lutra generate MODEL_DIR --prompt TEXT`.
--
--   lutra chat runs/sft/model [--system="Be brief."] [--temperature=0.7] [--top_k=40] [--top_p=0.95]
--   lutra generate runs/sft/model --prompt "3+4?" [--raw] [--max_new_tokens=100] [--seed=1]
--
-- The model directory is what recipes/pretrain.lua and recipes/sft.lua save (lutra.sft.modeldir:
-- Hugging Face's layout through lutra.hf, or lutra's own; --tokenizer=tokenizer.json with a
-- trainer checkpoint). The chat template is --template (one of lutra's), else the directory's own
-- Jinja chat_template, run by lutra.jinja (lutra.sft.modeldir, lutra.sft.hf_template).
-- Tokens are printed as they are generated, with a KV cache (lutra.generate); a reply ends at
-- the template's end-of-turn token (or its text, when the tokenizer spells it in pieces), or
-- after --max_new_tokens.
--
-- chat reads one line per turn with io.read (a terminal or a pipe) and keeps the
-- conversation, dropping its oldest exchanges when the context would not fit the model's
-- block size. /reset forgets it, /exit (or end of input) ends. generate wraps --prompt in
-- one user turn of the template (with --raw: continues the text as it is).
-- Options: --temperature (default 0.7; 0 = greedy), --top_k (0 = all), --top_p (1 = all),
-- --max_new_tokens (200), --seed, --template, --system, --verbose (context sizes on stderr), --cast,
-- --ids (each turn's prompt ids and reply ids, the end-of-turn token included, on stderr)
-- (weights stored in bf16/f16 load into the f32 model: lossless, refused without it), --ignore-key=KEY[,KEY]
-- (config.json keys lutra does not know, accepted as harmless: lutra.hf.config).
local M = {}

local USAGE = {
  chat = "usage: lutra chat MODEL_DIR [--template=chatml|llama3] [--system=TEXT] [--temperature=0.7] [--top_k=0]\n"
    .. "         [--top_p=1] [--max_new_tokens=200] [--seed=N] [--tokenizer=tokenizer.json] [--verbose]\n"
    .. "         [--ids] [--cast] [--ignore-key=KEY[,KEY...]]\n",
  generate = "usage: lutra generate MODEL_DIR --prompt TEXT [--raw] [--template=chatml|llama3] [--temperature=0.7]\n"
    .. "         [--top_k=0] [--top_p=1] [--max_new_tokens=200] [--seed=N] [--tokenizer=tokenizer.json] [--cast]\n"
    .. "         [--ids] [--ignore-key=KEY[,KEY...]]\n",
}

local NUMBERS = {temperature = true, top_k = true, top_p = true, max_new_tokens = true, seed = true}
local STRINGS = {template = true, system = true, prompt = true, tokenizer = true, ignore_key = true}
local FLAGS = {raw = true, verbose = true, help = true, cast = true, ids = true}

-- words -> positional list, options; errors are strings.
local function parse(words)
  local pos, o = {}, {}
  local i = 1
  while i <= #words do
    local w = words[i]
    local name, value = w:match("^%-%-([%w_%-]+)=(.*)$")
    if not name then name = w:match("^%-%-([%w_%-]+)$") end
    if name then
      name = name:gsub("%-", "_")
      if FLAGS[name] then
        o[name] = value == nil or value == "true" or value == "1"
      elseif NUMBERS[name] or STRINGS[name] then
        if value == nil then
          i = i + 1
          value = words[i]
          if value == nil then return nil, "--" .. name .. " needs a value" end
        end
        if NUMBERS[name] then
          local n = tonumber(value)
          if n == nil then return nil, string.format("--%s expects a number, got '%s'", name, value) end
          value = n
        end
        o[name] = value
      else
        return nil, "unknown option --" .. name
      end
    else
      pos[#pos + 1] = w
    end
    i = i + 1
  end
  return pos, o
end

local function setup(words, name)
  local pos, o = parse(words)
  if pos == nil or o.help or #pos ~= 1 then
    if pos == nil then io.stderr:write("lutra ", name, ": ", o, "\n") end
    io.stderr:write(USAGE[name])
    return nil, (o and o.help) and 0 or 2
  end
  local lt = require "lutra"
  local modeldir = require "lutra.sft.modeldir"
  local templates = require "lutra.sft.templates"
  local model, tok, info = modeldir.load(pos[1], {tokenizer = o.tokenizer, template = o.template, allow_cast = o.cast,
                                                  ignore_keys = o.ignore_key})
  local t = templates.get(info.template)
  if o.seed then lt.manual_seed(o.seed) end
  local s = {model = model, tok = tok, t = t, o = o, block = model.cfg and model.cfg.block_size or 1024,
             gen = {temperature = o.temperature or 0.7, top_k = o.top_k or 0, top_p = o.top_p or 1,
                    max_new_tokens = o.max_new_tokens or 200}}
  s.stop_id = templates.stop_id(tok, t)
  return s
end

-- Generates from prompt ids, writing the text as it comes; returns the reply text (stop excluded).
local function stream(s, prompt, out)
  local tok, stop = s.tok, s.t.stop
  local text, shown = "", 0
  -- what may be shown: all but a tail that could still become the stop string
  local function flush(final)
    local limit = #text
    if not final and stop and not s.stop_id then
      for k = math.min(#stop - 1, #text), 1, -1 do
        if text:sub(-k) == stop:sub(1, k) then
          limit = #text - k
          break
        end
      end
    end
    if limit > shown then
      out:write(text:sub(shown + 1, limit))
      out:flush()
      shown = limit
    end
  end
  local opts = {}
  for k, v in pairs(s.gen) do opts[k] = v end
  opts.stop_token = s.stop_id
  local reply_ids = {}
  opts.on_token = function(id)
    reply_ids[#reply_ids + 1] = id
    if id == s.stop_id then return true end
    text = text .. tok:decode({id})
    if stop and not s.stop_id then
      local at = text:find(stop, 1, true)
      if at then
        text = text:sub(1, at - 1)
        return true
      end
    end
    flush(false)
  end
  require("lutra.generate").generate(s.model, prompt, opts)
  flush(true)
  if s.o and s.o.ids then
    io.stderr:write("prompt ids: ", table.concat(prompt, " "), "\nreply ids: ", table.concat(reply_ids, " "), "\n")
  end
  return text
end

-- The prompt ids of the conversation, dropping the oldest exchanges (the system message stays)
-- while the prompt and the reply would not fit the block.
local function fit(s, history)
  local templates = require "lutra.sft.templates"
  local room = math.max(1, s.block - math.min(s.gen.max_new_tokens, math.floor(s.block / 2)))
  while true do
    local ids = templates.encode(s.tok, s.t, history, {add_generation_prompt = true})
    local first = history[1] and history[1].role == "system" and 2 or 1
    if #ids <= room or #history - first < 1 then
      if #ids > room then ids = {unpack(ids, #ids - room + 1)} end
      return ids
    end
    table.remove(history, first)
    if history[first] and history[first].role == "assistant" then table.remove(history, first) end
  end
end

local function is_tty()
  local ok, r = pcall(os.execute, "test -t 0")
  return ok and (r == 0 or r == true)
end

local function chat(words)
  local s, status = setup(words, "chat")
  if not s then return status end
  local tty = is_tty()
  local function start()
    return s.o.system and {{role = "system", content = s.o.system}} or {}
  end
  local history = start()
  if tty then
    io.write(string.format("lutra chat: %s template; /reset forgets the conversation, /exit ends\n", s.t.name))
  end
  while true do
    if tty then
      io.write("> ")
      io.flush()
    end
    local line = io.read("*l")
    if line == nil then break end
    line = line:gsub("\r$", "")
    if line == "/exit" or line == "/quit" then break end
    if line == "/reset" then
      history = start()
      print("(conversation reset)")
    elseif line:match("%S") then
      history[#history + 1] = {role = "user", content = line}
      local ok, reply = pcall(function()
        local ids = fit(s, history)
        if s.o.verbose then io.stderr:write(string.format("[context: %d tokens]\n", #ids)) end
        return stream(s, ids, io.stdout)
      end)
      io.write("\n")
      io.flush()
      if ok then
        history[#history + 1] = {role = "assistant", content = reply}
      else -- (e.g. a character the tokenizer does not have): say so, forget the turn, go on
        io.stderr:write("error: ", (tostring(reply):gsub("^[^\n]-:%d+: ", "")), "\n")
        history[#history] = nil
      end
    end
  end
  return 0
end

local function generate(words)
  local s, status = setup(words, "generate")
  if not s then return status end
  if s.o.prompt == nil then
    io.stderr:write("lutra generate: --prompt is required\n", USAGE.generate)
    return 2
  end
  local ids
  if s.o.raw then
    ids = s.tok:encode(s.o.prompt)
    if #ids == 0 then ids = {0} end
  else
    local history = {}
    if s.o.system then history[1] = {role = "system", content = s.o.system} end
    history[#history + 1] = {role = "user", content = s.o.prompt}
    ids = fit(s, history)
  end
  stream(s, ids, io.stdout)
  io.write("\n")
  return 0
end

M.commands = {chat = chat, generate = generate}
-- for tests: option parsing, streaming one reply, fitting the history to the block
M.parse, M.stream, M.fit = parse, stream, fit

return M
