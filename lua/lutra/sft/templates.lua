-- lutra.sft.templates — chat templates: a conversation -> text segments, each marked
-- with whether it carries the loss.
--
--   local templates = require "lutra.sft.templates"
--   local t = templates.get("chatml")            -- or "llama3", or function(messages, opts) -> segments
--   local segs = t:render({{role = "user", content = "hi"}, {role = "assistant", content = "hello"}})
--   -- segs: {{text =, role =, train = bool}, ...}; train is true exactly for the assistant's
--   -- content and its end-of-turn marker (what SFT learns to produce)
--   t:text(messages, opts)                       -- the segments joined
--   t.stop, t.name                               -- the end-of-turn string ("<|im_end|>"), the name
--   local ids, mask = templates.encode(tok, t, messages, {add_generation_prompt = false})
--   -- ids: 0-based token ids (a Lua list); mask[i] = 1 where ids[i] carries loss
--
-- render opts: add_generation_prompt = true appends the header of an assistant turn (for
-- generation). The segments are joined and tokenized as one text, as transformers'
-- apply_chat_template tokenizes the rendered conversation, so the ids are the ones the model's
-- own tokenizer gives; a token carries loss when its bytes overlap a segment that does (a token
-- astride a boundary counts, as in return_assistant_tokens_mask). Special-token strings
-- (<|im_start|>, ...) become one id each when the tokenizer has them as special tokens.
-- A model's own Jinja template (lutra.sft.hf_template, kind "jinja") goes wherever a template
-- does: templates.get returns it as it is and templates.encode tokenizes its rendered text.
local errors = require "lutra.errors"
local hf_template = require "lutra.sft.hf_template"

local raise = errors.raise

local M = {}

local Template = {}
Template.__index = Template
M.Template = Template

local ROLES = {system = true, user = true, assistant = true}

local function check_messages(name, messages)
  if type(messages) ~= "table" then
    raise(name .. ": messages must be a list of {role =, content =}, got " .. type(messages))
  end
  for i, m in ipairs(messages) do
    if type(m) ~= "table" then raise(string.format("%s: messages[%d] must be a table, got %s", name, i, type(m))) end
    if not ROLES[m.role] then
      raise(string.format("%s: messages[%d].role must be \"system\", \"user\" or \"assistant\", got %s", name, i,
        tostring(m.role)))
    end
    if type(m.content) ~= "string" then
      raise(string.format("%s: messages[%d].content must be a string, got %s", name, i, type(m.content)))
    end
  end
end

local function seg(out, text, role, train)
  if text ~= "" then out[#out + 1] = {text = text, role = role, train = train} end
end

-- ChatML (Qwen's, OpenAI's): <|im_start|>role\ncontent<|im_end|>\n per message.
local function chatml(messages, opts)
  local out = {}
  for _, m in ipairs(messages) do
    local train = m.role == "assistant"
    seg(out, "<|im_start|>" .. m.role .. "\n", m.role, false)
    seg(out, m.content .. "<|im_end|>", m.role, train)
    seg(out, "\n", m.role, false)
  end
  if opts.add_generation_prompt then seg(out, "<|im_start|>assistant\n", "assistant", false) end
  return out
end

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

-- Llama 3's: <|begin_of_text|> then <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
-- per message, content trimmed (as Meta's template does).
local function llama3(messages, opts)
  local out = {}
  seg(out, "<|begin_of_text|>", "system", false)
  for _, m in ipairs(messages) do
    seg(out, "<|start_header_id|>" .. m.role .. "<|end_header_id|>\n\n", m.role, false)
    seg(out, trim(m.content) .. "<|eot_id|>", m.role, m.role == "assistant")
  end
  if opts.add_generation_prompt then
    seg(out, "<|start_header_id|>assistant<|end_header_id|>\n\n", "assistant", false)
  end
  return out
end

-- jinja: the same template as Jinja text for other tools (transformers' apply_chat_template),
-- written into the model directories lutra saves; the text lutra recognises when it reads one.
M.builtin = {
  chatml = {name = "chatml", stop = "<|im_end|>", fn = chatml,
            special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"},
            jinja = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
              .. "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
              .. "{% endif %}"},
  llama3 = {name = "llama3", stop = "<|eot_id|>", fn = llama3,
            special_tokens = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
            jinja = "{{ '<|begin_of_text|>' }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
              .. "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
              .. "{% if add_generation_prompt %}"
              .. "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"},
}
M.default = "chatml"

-- The builtin template whose Jinja text this is (leading and trailing whitespace aside), or nil:
-- lutra runs its own templates, never a Jinja text, so any other text is one it cannot follow.
function M.recognise(jinja)
  if type(jinja) ~= "string" then return nil end
  local text = jinja:match("^%s*(.-)%s*$")
  for name, b in pairs(M.builtin) do
    if b.jinja == text then return name end
  end
  return nil
end

-- The builtin names, sorted: "chatml, llama3".
function M.names()
  local names = {}
  for k in pairs(M.builtin) do names[#names + 1] = k end
  table.sort(names)
  return table.concat(names, ", ")
end

-- templates.get(name | function | template [, {name =, stop =}]) -> a template.
-- A function(messages, opts) returns the segments itself; opts.stop names its end-of-turn
-- string (for generation).
function M.get(spec, opts)
  opts = opts or {}
  if getmetatable(spec) == Template or getmetatable(spec) == hf_template.Template then return spec end
  if spec == nil then spec = M.default end
  if type(spec) == "string" then
    local b = M.builtin[spec]
    if b == nil then
      raise(string.format("templates.get: unknown template '%s' (expected %s, or a function)", spec, M.names()))
    end
    return setmetatable({name = b.name, stop = b.stop, fn = b.fn, special_tokens = b.special_tokens}, Template)
  elseif type(spec) == "function" then
    return setmetatable({name = opts.name or "custom", stop = opts.stop, fn = spec, special_tokens = {}}, Template)
  end
  raise("templates.get: expected a template name or a function(messages, opts), got " .. type(spec))
end

-- The segments of messages; checks what the template function returned.
function Template:render(messages, opts)
  opts = opts or {}
  check_messages("template " .. self.name, messages)
  local segs = self.fn(messages, opts)
  if type(segs) ~= "table" then
    raise(string.format("template %s: the function must return a list of segments, got %s", self.name, type(segs)))
  end
  for i, s in ipairs(segs) do
    if type(s) ~= "table" or type(s.text) ~= "string" then
      raise(string.format("template %s: segment %d must be {text = string, train = bool}", self.name, i))
    end
    s.train = s.train == true
  end
  return segs
end

function Template:text(messages, opts)
  local parts = {}
  for i, s in ipairs(self:render(messages, opts)) do parts[i] = s.text end
  return table.concat(parts)
end

-- The tokenized segments: ids (0-based, a Lua list) of the joined text, and mask (1 = the
-- token overlaps a segment that carries loss).
function M.encode_segments(tok, segs)
  local parts, spans, pos = {}, {}, 0
  for i, s in ipairs(segs) do
    parts[i] = s.text
    if s.train then
      local last = spans[#spans]
      if last and last[2] == pos then
        last[2] = pos + #s.text
      else
        spans[#spans + 1] = {pos, pos + #s.text}
      end
    end
    pos = pos + #s.text
  end
  local ids, starts, ends = hf_template.token_offsets(tok, table.concat(parts))
  return ids, hf_template.mask_of(spans, starts, ends)
end

function M.encode(tok, t, messages, opts)
  if type(tok) ~= "table" or type(tok.encode) ~= "function" then
    raise("templates.encode: expected a tokenizer first, got " .. type(tok))
  end
  t = M.get(t)
  if t.kind == "jinja" then
    local ids, mask = t:encode(tok, messages, opts)
    return ids, mask
  end
  return M.encode_segments(tok, t:render(messages, opts))
end

-- The id of the template's end-of-turn token when the tokenizer has it as one token, or nil.
function M.stop_id(tok, t)
  t = M.get(t)
  if t.stop == nil or type(tok.token_id) ~= "function" then return nil end
  local ids = tok:encode(t.stop, {add_special_tokens = false})
  if #ids == 1 then return ids[1] end
  return nil
end

return M
