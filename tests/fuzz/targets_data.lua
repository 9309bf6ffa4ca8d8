-- tests/fuzz/targets_data.lua — lua_fuzz.lua targets for the fine-tuning data files: each input is
-- written to a file and loaded through what recipes/sft.lua and recipes/dpo.lua call
-- (lutra.sft.data.load_jsonl then pack; lutra.dpo.load, with the chat template and as plain text),
-- with a char-level tokenizer that lacks some characters (so that text it cannot encode is met).
-- Every error must name the file.
--
--   lutra tests/fuzz/lua_fuzz.lua tests/fuzz/targets_data.lua sft_jsonl --runs=1000000
local lt = require "lutra"
local sft, dpo = lt.sft.data, lt.dpo

-- The shipped examples' characters, less 'z' and 'Q' (text it cannot encode), plus ChatML's tokens.
local CHARS = "abcdefghijklmnopqrstuvwxy ABCDEFGHIJKLMNOPRSTUVWXYZ0123456789.,:;!?'\"()+-=*/<>|_#\n"
local tok = lt.tokenizer.char(CHARS, {special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}})

-- One file per target, removed when the fuzzer's Lua state closes.
local function scratch(name)
  local base = os.tmpname() -- created empty: its name is ours
  local path = base .. "-" .. name
  os.remove(base)
  local sentinel = newproxy(true)
  getmetatable(sentinel).__gc = function() os.remove(path) end
  return path, sentinel
end

local function write(path, bytes)
  local f = assert(io.open(path, "wb"))
  f:write(bytes)
  f:close()
end

local JSON_DICT = {'"messages"', '"role"', '"content"', '"user"', '"assistant"', '"system"', '"prompt"',
                   '"completion"', '"chosen"', '"rejected"', "[]", "{}", "null", "true", "0", '""', ",", ":",
                   "\r\n", "\n", "\239\187\191", "\\u0000", "\\ud83d\\ude00", "<|im_end|>", "<|im_start|>", "z",
                   "\195\169"}

local sft_path, sft_sentinel = scratch("sft.jsonl")
local dpo_path, dpo_sentinel = scratch("dpo.jsonl")

return {
  sft_jsonl = {
    names = sft_path,
    sentinel = sft_sentinel,
    seeds = {
      '{"messages": [{"role": "user", "content": "upper: cup"}, {"role": "assistant", "content": "CUP"}]}\n',
      '{"messages": [{"role": "system", "content": "Answer in few words."}, {"role": "user", "content": "hi"}, '
        .. '{"role": "assistant", "content": "Hello! How can I help?"}]}\n'
        .. '{"prompt": "reverse: star", "completion": "rats"}\n',
      '{"prompt": "3+4?", "completion": "7"}\r\n\r\n{"prompt": "upper: owl", "completion": "OWL"}\r\n',
      '{"messages": [{"role": "user", "content": "hi"}]}\n{"messages": [{"role": "assistant", "content": ""}]}\n',
    },
    dict = JSON_DICT,
    run = function(bytes)
      write(sft_path, bytes)
      local examples = sft.load_jsonl(sft_path, {tokenizer = tok, template = "chatml", max_len = 48})
      if #examples > 0 then sft.pack(examples, 48) end
    end,
  },
  dpo_jsonl = {
    names = dpo_path,
    sentinel = dpo_sentinel,
    seeds = {
      '{"prompt": "8+1?", "chosen": "8+1=9.", "rejected": "8+1=7."}\n',
      '{"prompt": "upper: rain", "chosen": "RAIN", "rejected": "rain"}\n'
        .. '{"prompt": "hello", "chosen": "Hello! How can I help?", "rejected": "What do you want?"}\n',
      '{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], '
        .. '"chosen": [{"role": "assistant", "content": "Hello!"}], "rejected": "go away"}\r\n',
    },
    dict = JSON_DICT,
    run = function(bytes)
      write(dpo_path, bytes)
      dpo.load(dpo_path, tok, {template = "chatml", max_len = 40})
      dpo.load(dpo_path, tok, {max_len = 40, on_bad_pair = "skip"})
    end,
  },
}
