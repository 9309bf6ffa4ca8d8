-- lutra.sft.hf_template — a model's own Jinja chat template (Hugging Face's `chat_template`) as
-- a lutra template: the text apply_chat_template renders, its ids (the conversation tokenized
-- as one text) and the loss mask (the tokens that overlap an assistant span).
--
--   local hf_template = require "lutra.sft.hf_template"
--   local t = hf_template.from_dir("models/qwen")        -- nil when the directory declares none
--   local t = hf_template.new(jinja_text, {file = "tokenizer_config.json", special_tokens = {bos_token = "<s>"}})
--   t:text(messages, {add_generation_prompt = true, tools = {...}, kwargs = {enable_thinking = false}})
--   local ids, mask = t:encode(tok, messages, opts)       -- mask[i] = 1: ids[i] carries loss
--   t.stop, t.name, t.kind == "jinja"
--
-- Messages are what the template reads: {role =, content =, tool_calls =, reasoning_content =,
-- ...}, prepared as transformers prepares them (keys whose value is null dropped; a reasoning
-- under reasoning_content, thinking or reasoning also given as the other two). The template sees
-- messages, tools (null when none), documents (null), add_generation_prompt, the tokenizer's
-- special tokens (bos_token, eos_token, unk_token, pad_token: those tokenizer_config.json sets)
-- and opts.kwargs.
--
-- The assistant spans: the {% generation %} blocks where the template has them (as
-- return_assistant_tokens_mask takes them); else each assistant message's content as the text
-- shows it, found in order (the content, else the content trimmed, else what follows its last
-- "</think>", with its leading newlines or without), with the end-of-turn string that follows it (t.stop). A token carries loss when
-- its bytes overlap a span (tok:encode_offsets, or the bytes of each token in turn).
local errors = require "lutra.errors"
local json = require "lutra.json"
local jinja = require "lutra.jinja"

local raise = errors.raise

local M = {}

local Template = {}
Template.__index = Template
M.Template = Template

-- End-of-turn strings of the families, tried after an assistant content when the template has no
-- {% generation %} block.
local TURN_ENDS = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "</s>", "<|end|>", "<|endoftext|>",
                   "<eos>"}

local REASONING = {"reasoning_content", "thinking", "reasoning"}

local function json_order(t, keys) return jinja.values.ordered(t, keys) end

local function is_object(t) return type(t) == "table" and not json.is_array(t) end

-- A message as transformers gives it to the template: null keys dropped, reasoning aliased.
local function prepare_message(m, i, where)
  if not is_object(m) then raise(string.format("%s: messages[%d] must be an object, got %s", where, i, type(m))) end
  local order = json.key_order(m)
  if not order then
    order = {}
    for k in pairs(m) do
      if type(k) == "string" and k ~= "__line" then order[#order + 1] = k end
    end
    table.sort(order, function(a, b)
      local rank = {role = 1, content = 2}
      local ra, rb = rank[a] or 3, rank[b] or 3
      if ra ~= rb then return ra < rb end
      return a < b
    end)
  end
  local out, keys = {}, {}
  local reasoning
  for _, k in ipairs(REASONING) do
    if reasoning == nil and m[k] ~= nil and m[k] ~= json.null then reasoning = m[k] end
  end
  if reasoning ~= nil then
    keys[1], out.thinking = "thinking", reasoning
  end
  for _, k in ipairs(order) do
    local v = m[k]
    if v ~= nil and v ~= json.null and k ~= "__line" then
      if out[k] == nil then keys[#keys + 1] = k end
      out[k] = v
    end
  end
  if reasoning ~= nil then
    if out.reasoning_content == nil then keys[#keys + 1] = "reasoning_content" end
    out.reasoning_content = reasoning
  end
  return jinja.values.ordered(out, keys)
end

-- new(text, {file =, special_tokens = {bos_token =, ...}}) -> a template
function M.new(text, opts)
  opts = opts or {}
  local file = opts.file or "chat template"
  local name = "chat template (" .. file .. ")"
  if type(text) ~= "string" then raise(name .. ": the template must be a string, got " .. type(text)) end
  local compiled = jinja.compile(text, {name = name})
  local self = setmetatable({kind = "jinja", name = file, compiled = compiled, source = text,
                             special_tokens_map = opts.special_tokens or {}, special_tokens = {}}, Template)
  for _, v in pairs(self.special_tokens_map) do self.special_tokens[#self.special_tokens + 1] = v end
  self.stop = opts.stop or self:find_stop()
  return self
end

-- The end-of-turn string: what follows an assistant reply in a probe conversation, when it is one
-- of the families' (else eos_token).
function Template:find_stop()
  local ok, text = pcall(self.render, self, {{role = "user", content = "lutra-probe-q"},
                                             {role = "assistant", content = "lutra-probe-a"}})
  if ok then
    local at = select(2, text:find("lutra-probe-a", 1, true))
    if at then
      local rest = text:sub(at + 1)
      for _, s in ipairs(TURN_ENDS) do
        if rest:sub(1, #s) == s then return s end
      end
    end
  end
  return self.special_tokens_map.eos_token
end

-- The variables the template sees.
function Template:vars(messages, opts)
  local where = "chat template (" .. self.name .. ")"
  if type(messages) ~= "table" then raise(where .. ": messages must be a list, got " .. type(messages)) end
  if #messages == 0 then
    raise(where .. ": cannot apply chat template to an empty conversation: give at least one message")
  end
  local msgs = json.array()
  for i, m in ipairs(messages) do msgs[i] = prepare_message(m, i, where) end
  local vars = {}
  for k, v in pairs(self.special_tokens_map) do vars[k] = v end
  for k, v in pairs(opts.kwargs or {}) do vars[k] = v end
  vars.messages = msgs
  vars.tools = opts.tools or json.null
  vars.documents = opts.documents or json.null
  vars.add_generation_prompt = opts.add_generation_prompt == true
  return vars
end

-- The rendered text and the template's {% generation %} spans.
function Template:render(messages, opts)
  opts = opts or {}
  return self.compiled:render(self:vars(messages, opts), {now = opts.now})
end

function Template:text(messages, opts) return (self:render(messages, opts)) end

-- Where message i's content starts in the text: the first byte at which renders with two different
-- stand-ins for it part (nil when the template refuses them).
function Template:content_start(messages, i, opts)
  local function with(stand_in)
    local copy = {}
    for j, m in ipairs(messages) do copy[j] = m end
    local m = {}
    for k, v in pairs(messages[i]) do m[k] = v end
    local order = json.key_order(messages[i])
    if order then json_order(m, order) end
    m.content = stand_in
    copy[i] = m
    local ok, text = pcall(self.render, self, copy, opts)
    return ok and text or nil
  end
  local a, b = with("A\1lutra stand-in"), with("B\1lutra stand-in")
  if not a or not b then return nil end
  local p = 1
  while p <= #a and a:byte(p) == b:byte(p) do p = p + 1 end
  if p > #a then return nil end -- the template does not show this content at all
  return p
end

-- The assistant spans of a rendered conversation (0-based byte offsets, stop exclusive).
function Template:assistant_spans(messages, text, spans, opts)
  if self.compiled.has_generation then return spans end
  local out, cursor = {}, 1
  for i, m in ipairs(messages) do
    local start = m.role == "assistant" and type(m.content) == "string" and self:content_start(messages, i, opts)
    if start and m.content == "" then -- nothing but its end of turn
      local stop = self.stop
      if stop and text:sub(start, start + #stop - 1) == stop then out[#out + 1] = {start - 1, start - 1 + #stop} end
    elseif m.role == "assistant" and type(m.content) == "string" and m.content ~= "" then
      local from = math.max(cursor, start or cursor)
      local candidates = {m.content, (m.content:gsub("^%s+", ""):gsub("%s+$", ""))}
      local after_think = m.content:match(".*</think>(.*)$")
      if after_think then
        candidates[#candidates + 1] = after_think
        candidates[#candidates + 1] = (after_think:gsub("^\n+", ""))
      end
      local a, b
      for _, c in ipairs(candidates) do
        if c ~= "" then
          a, b = text:find(c, from, true)
          if a then break end
        end
      end
      if not a and m.tool_calls ~= nil then
        a = false -- a tool-call turn whose template shows the calls instead: it carries no loss (as documented)
      elseif not a then
        raise(string.format("chat template (%s): messages[%d] (assistant): its content is not in the rendered text "
          .. "(the template changes it); mark the assistant's part with {%% generation %%} blocks", self.name, i))
      end
      if a then
        local stop = self.stop
        if stop and text:sub(b + 1, b + #stop) == stop then b = b + #stop end
        out[#out + 1] = {a - 1, b}
        cursor = b + 1
      end
    end
  end
  return out
end

-- Each token's byte range: tok:encode_offsets where the tokenizer has it, else the bytes of the
-- tokens in turn (they concatenate to the text for a byte-level tokenizer with no normalizer).
function M.token_offsets(tok, text)
  -- the rendered text holds the template's own BOS: the tokenizer adds none (as apply_chat_template)
  local no_specials = {add_special_tokens = false}
  if type(tok.encode_offsets) == "function" then return tok:encode_offsets(text, no_specials) end
  local ids = tok:encode(text, no_specials)
  local starts, ends, pos = {}, {}, 0
  for i, id in ipairs(ids) do
    starts[i] = pos
    pos = pos + #tok:token(id)
    ends[i] = pos
  end
  if pos ~= #text then
    raise(string.format("chat template: the tokenizer's tokens spell %d bytes of a %d-byte text: it needs "
      .. "encode_offsets for the loss mask", pos, #text))
  end
  return ids, starts, ends
end

-- The loss mask of tokens (byte ranges starts[i], ends[i]) for spans ({start, stop}, in order):
-- 1 where a token overlaps a span, as transformers' return_assistant_tokens_mask.
function M.mask_of(spans, starts, ends)
  local mask, k = {}, 1
  for i = 1, #starts do
    while k <= #spans and starts[i] >= spans[k][2] do k = k + 1 end
    mask[i] = (k <= #spans and ends[i] > spans[k][1]) and 1 or 0
  end
  return mask
end

-- The ids of the conversation (the rendered text tokenized as one) and the loss mask: 1 for each
-- token that overlaps an assistant span (opts.last_only: the last one's alone, for DPO's response).
function Template:encode(tok, messages, opts)
  local text, spans = self:render(messages, opts)
  spans = self:assistant_spans(messages, text, spans, opts)
  if opts and opts.last_only then spans = {spans[#spans]} end
  local ids, starts, ends = M.token_offsets(tok, text)
  return ids, M.mask_of(spans, starts, ends), text
end

-- The chat template a tokenizer_config.json declares: its text (a string, or the "default" of a
-- list of {name =, template =}) or nil; errors name the file and the field.
function M.config_template(path, cfg)
  local ct = cfg.chat_template
  if ct == nil or ct == json.null then return nil end
  if json.is_array(ct) then
    for _, e in ipairs(ct) do
      if is_object(e) and e.name == "default" then
        if type(e.template) ~= "string" then
          raise(path .. ": chat_template[\"default\"].template is not a text (a Jinja template)")
        end
        return e.template
      end
    end
    raise(path .. ": chat_template is a list without a \"default\" template")
  end
  if type(ct) ~= "string" then raise(path .. ": chat_template is not a text (a Jinja template), got " .. type(ct)) end
  return ct
end

-- The special tokens tokenizer_config.json sets (strings, or {content =} objects).
function M.special_tokens(cfg)
  local out = {}
  for _, k in ipairs {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"} do
    local v = cfg[k]
    if is_object(v) then v = v.content end
    if type(v) == "string" then out[k] = v end
  end
  return out
end

return M
