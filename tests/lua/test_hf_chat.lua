-- Real chat templates (Llama 3.1, Qwen2.5, Qwen3, Mistral, SmolLM2, ChatML, Gemma, and ChatML and
-- SmolLM2 with {% generation %}) against what transformers' apply_chat_template made of them
-- (tests/hf/fixtures/chat, written by tests/hf/gen_chat.py): for every conversation the same text,
-- the same ids (the text tokenized as one, by the fixture's tokenizer.json), the same assistant
-- mask (templates with {% generation %}), the same raise_exception message; and lutra.jinja's
-- semantics, one construct at a time.
local lt = require "lutra"
local json = require "lutra.json"
local jinja = require "lutra.jinja"
local hf_template = require "lutra.sft.hf_template"
local T = require "lutra.testing"
local equal, fails = T.assert_equal, T.assert_error

local root = debug.getinfo(1, "S").source:match("^@(.*)/tests/lua/[^/]+$") or "."
local FIX = root .. "/tests/hf/fixtures/chat"

local NAMES = {"llama31", "llama31_bos", "lutra_llama3", "qwen25", "qwen3", "mistral", "smollm2", "chatml", "gemma", "hermes3_tools", "deepseek_r1",
               "phi35", "chatml_generation",
               "smollm2_generation"}

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function load_fixture(name)
  local dir = FIX .. "/" .. name
  local cfg = json.read_file(dir .. "/tokenizer_config.json")
  local t = hf_template.new(read(dir .. "/chat_template.jinja"),
    {file = name .. "/chat_template.jinja", special_tokens = hf_template.special_tokens(cfg)})
  local tok = lt.tokenizer.load(dir .. "/tokenizer.json")
  local cases = json.read_file(dir .. "/cases.json", {ordered = true})
  return t, tok, cases
end

local function opts_of(c)
  return {add_generation_prompt = c.add_generation_prompt, tools = c.tools ~= json.null and c.tools or nil,
          kwargs = c.kwargs}
end

local function first_diff(a, b)
  for i = 1, math.max(#a, #b) do
    if a[i] ~= b[i] then return i end
  end
end

for _, name in ipairs(NAMES) do
  test(name .. ": text, ids and masks equal apply_chat_template's for every conversation", function()
    local t, tok, cases = load_fixture(name)
    local texts, ids_ok, masks, errs, n_mask = 0, 0, 0, 0, 0
    for i, c in ipairs(cases) do
      local o = opts_of(c)
      if c.error then
        local ok, err = pcall(t.text, t, c.messages, o)
        assert(not ok, string.format("%s case %d: expected the error %q, rendered instead", name, i, c.error))
        -- the template's own message exactly; transformers' checks before the template by their first sentence
        local want = c.error:find("empty conversation", 1, true) and c.error:lower():match("^[^.:!]*") or c.error
        assert(tostring(err):lower():find(want:lower(), 1, true),
          string.format("%s case %d: expected an error with %q, got %s", name, i, c.error, tostring(err)))
        errs = errs + 1
      else
        local text = t:text(c.messages, o)
        equal(text, c.text, string.format("%s case %d: text", name, i))
        texts = texts + 1
        local ids, mask = t:encode(tok, c.messages, o)
        local at = first_diff(ids, c.ids)
        assert(at == nil, string.format("%s case %d: ids differ at %s (%s vs %s)", name, i, tostring(at),
          tostring(ids[at or 1]), tostring(c.ids[at or 1])))
        ids_ok = ids_ok + 1
        if c.mask then
          local m = first_diff(mask, c.mask)
          assert(m == nil, string.format("%s case %d: mask differs at token %s", name, i, tostring(m)))
          masks = masks + 1
          for _, v in ipairs(c.mask) do n_mask = n_mask + v end
        end
      end
    end
    assert(texts >= (name == "hermes3_tools" and 20 or 40), name .. ": at least 20 conversations (x 2: generation prompt)")
    if name:find("generation") then assert(masks == texts and n_mask > 0, name .. ": every case has a mask") end
    print(string.format("  %s: text %d/%d, ids %d/%d, masks %d/%d, errors %d/%d", name, texts, texts, ids_ok, texts,
      masks, name:find("generation") and texts or 0, errs, errs))
  end)
end

test("without {% generation %}: the mask covers the assistant contents and their end of turn", function()
  local t, tok, cases = load_fixture("chatml")
  local g = load_fixture("chatml_generation")
  equal(t.stop, "<|im_end|>")
  local n = 0
  for _, c in ipairs(cases) do
    if not c.error then
      local _, mask = t:encode(tok, c.messages, opts_of(c))
      local _, gmask = g:encode(tok, c.messages, opts_of(c))
      -- the generation variant marks the same content + <|im_end|>: same ids as chatml's text when
      -- both templates render alike (they do: only the markers differ)
      if g:text(c.messages, opts_of(c)) == c.text then
        equal(mask, gmask)
        n = n + 1
      end
    end
  end
  assert(n >= 40, "compared " .. n)
end)

-- ---- lutra.jinja, construct by construct (expected texts: Jinja2 3.1 under transformers' settings) --------

local function render(src, vars) return (jinja.compile(src, {name = "t"}):render(vars or {})) end

test("jinja: whitespace control, trim_blocks and lstrip_blocks", function()
  equal(render("a\n  {% if true %}\n    b\n  {% endif %}\nc"), "a\n    b\nc")
  equal(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc")
  equal(render("{{ 'x' }}\n{# note #}\ny\n"), "x\ny")
  equal(render("  {{ 'v' }}\n"), "  v")
  equal(render("{% for i in [1,2] %}\n{{ i }}\n{% endfor %}"), "1\n2\n")
end)

test("jinja: expressions, operators and literals", function()
  equal(render("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 2 ** 3 }} {{ 'a' ~ 1 ~ none }}"), "7 3 2 8 a1None")
  equal(render("{{ [1, 'a', true, none] }} {{ {'k': [1]} }}"), "[1, 'a', True, None] {'k': [1]}")
  equal(render("{{ 'x' if false else 'y' }}{{ 'z' if false }}"), "y")
  equal(render("{{ 1 in [1, 2] }} {{ 'b' in 'abc' }} {{ 'k' not in {'k': 1} }}"), "True True False")
  equal(render("{{ s[1:] }} {{ s[:-1] }} {{ s[::-1] }} {{ s[-2:] }} {{ l[1:][0] }}", {s = "héllo", l = {1, 2, 3}}),
    "éllo héll olléh lo 2")
  equal(render("{{ 0 or 'fb' }} {{ 'a' and 'b' }} {{ not [] }}"), "fb b True")
end)

test("jinja: for loops, loop variables, filters on loops, break/continue, else", function()
  equal(render("{% for x in xs if x > 1 %}{{ loop.index }}/{{ loop.length }}{{ ',' if not loop.last }}{% endfor %}",
    {xs = {1, 2, 3}}), "1/2,2/2")
  equal(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty")
  equal(render("{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}"
    .. "{{ x }}{{ loop.revindex0 }}{% endfor %}"), "1331")
  equal(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {d = jinja.values.ordered({b = 1, a = 2},
    {"b", "a"})}), "b=1;a=2;")
  equal(render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1")
  equal(render("{% set ns = namespace(x=1) %}{% for i in [1] %}{% set ns.x = 2 %}{% endfor %}{{ ns.x }}"), "2")
end)

test("jinja: tests, filters, methods", function()
  equal(render("{{ x is defined }} {{ none is none }} {{ 's' is string }} {{ {} is mapping }} {{ 3 is number }} "
    .. "{{ [] is iterable }} {{ false is false }} {{ 4 is divisibleby 2 }}"), "False True True True True True True True")
  equal(render("{{ ' a '|trim }}|{{ [1,2]|length }}|{{ 'AbC'|lower }}|{{ x|default('d') }}|{{ [3,4]|first }}"
    .. "|{{ ['a','b']|join(', ') }}|{{ 'a-b'|replace('-', '+') }}|{{ '3'|int + 1 }}|{{ 'hi'|capitalize }}"),
    "a|2|abc|d|3|a, b|a+b|4|Hi")
  equal(render("{{ ms|selectattr('role', 'equalto', 'user')|map(attribute='c')|list }}",
    {ms = {{role = "user", c = 1}, {role = "x", c = 2}, {role = "user", c = 3}}}), "[1, 3]")
  equal(render("{{ x|tojson }} {{ x|tojson(indent=2) }}", {x = jinja.values.ordered({b = {1, "é\n"}, a = json.null},
    {"b", "a"})}), '{"b": [1, "é\\n"], "a": null} {\n  "b": [\n    1,\n    "é\\n"\n  ],\n  "a": null\n}')
  equal(render("{{ s.startswith('ab') }} {{ s.split('b') }} {{ s.upper() }} {{ ' x '.strip() }} {{ '{}-{}'.format(1, 2) }}"
    .. " {{ d.get('k', 0) }} {{ d.keys()|list }}", {s = "abc", d = {k = 5}}), "True ['a', 'c'] ABC x 1-2 5 ['k']")
end)

test("jinja: undefined values print as nothing; using one otherwise is an error naming the line", function()
  equal(render("[{{ nothing }}][{{ d.missing }}]", {d = {a = 1}}), "[][]")
  fails("t line 2: 'nothing' is undefined", function() render("line1\n{{ nothing.attr }}") end)
  fails("'dict object' has no attribute 'missing'", function() render("{{ d.missing + 'x' }}", {d = {a = 1}}) end)
end)

test("jinja: macros and call blocks", function()
  equal(render("{% macro m(a, b='B') %}<{{ a }}{{ b }}>{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}"), "<1B><23>")
  equal(render("{% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}in{% endcall %}"), "[in]")
end)

test("jinja: refused constructs and raise_exception name the template and line", function()
  fails("chat template (f) line 2: {% include %} is not supported",
    function() jinja.compile("a\n{% include 'x.jinja' %}", {name = "chat template (f)"}) end)
  fails("T line 1: 'if' is not closed", function() jinja.compile("{% if x %}", {name = "T"}) end)
  fails("no filter named 'wordwrap'", function() render("{{ x|wordwrap }}", {x = "a"}) end)
  fails("t line 3: raise_exception: nope", function() render("\n\n{{ raise_exception('nope') }}") end)
  fails("unsafe", function() render("{{ [].append(1) }}") end)
  fails("T: the template must be a string", function() jinja.compile(42, {name = "T"}) end)
end)

-- ---- the SFT data path: a JSONL file of chats (with tools) through the model's own template ----------

test("sft.load_jsonl through a model's own template: ids (and generation masks) equal apply_chat_template's", function()
  local sft = require "lutra.sft.data"
  for _, name in ipairs {"qwen25", "llama31", "chatml_generation"} do
    local t, tok = load_fixture(name)
    -- cases.json holds one case per line: the chats without template kwargs, as JSONL rows (keys in order)
    local rows, want = {}, {}
    for line in read(FIX .. "/" .. name .. "/cases.json"):gmatch("[^\n]+") do
      local body = line:match("^(%{.*%}),?$")
      if body then
        local c = json.decode(body)
        if not c.error and not c.add_generation_prompt and next(c.kwargs) == nil then
          rows[#rows + 1] = body
          want[#want + 1] = c
        end
      end
    end
    local path = os.tmpname()
    local f = assert(io.open(path, "wb"))
    f:write(table.concat(rows, "\n"), "\n")
    f:close()
    local examples, report = sft.load_jsonl(path, {tokenizer = tok, template = t, keep_empty = true})
    os.remove(path)
    equal(report.count, #want)
    for i, ex in ipairs(examples) do
      equal(ex.ids, want[i].ids, name .. " row " .. i .. ": ids")
      if want[i].mask then equal(ex.mask, want[i].mask, name .. " row " .. i .. ": mask") end
    end
    assert(#want >= 20, name .. ": " .. #want .. " rows")
  end
end)

test("without {% generation %}: the tokens that carry loss spell each assistant content and its end of turn", function()
  for _, name in ipairs {"qwen25", "qwen3", "llama31", "gemma", "mistral", "deepseek_r1", "phi35"} do
    local t, tok, cases = load_fixture(name)
    local n = 0
    for _, c in ipairs(cases) do
      if not c.error and c.tools == json.null then
        local ids, mask = t:encode(tok, c.messages, opts_of(c))
        local pieces, run = {}, {}
        for i = 1, #ids + 1 do
          if mask[i] == 1 then
            run[#run + 1] = ids[i]
          elseif #run > 0 then
            pieces[#pieces + 1] = tok:decode(run)
            run = {}
          end
        end
        local want = {}
        for _, m in ipairs(c.messages) do
          -- (gemma and llama trim it; a tool-call turn shows no content: it carries no loss without {% generation %})
          if m.role == "assistant" and type(m.content) == "string" and m.tool_calls == nil then
            local trims = name == "gemma" or name == "llama31"
            local content = trims and m.content:match("^%s*(.-)%s*$") or m.content
            if name == "qwen3" then content = content:match(".*</think>\n*(.*)$") or content end -- (the answer)
            if name == "deepseek_r1" then content = content:match(".*</think>(.*)$") or content end -- (newlines kept)
            want[#want + 1] = content .. t.stop
          end
        end
        if name == "qwen3" or name == "deepseek_r1" then -- the newlines after </think>: the template's or the reply's
          for k = 1, #pieces do pieces[k] = pieces[k]:gsub("^\n+", "") end
          for k = 1, #want do want[k] = want[k]:gsub("^\n+", "") end
        end
        -- a token astride the start (whitespace merged with the template's newline) carries loss too
        equal(#pieces, #want, name)
        for k = 1, #want do
          local p = pieces[k]
          assert(p:sub(-#want[k]) == want[k] and p:sub(1, #p - #want[k]):match("^%s*$"),
            string.format("%s: loss tokens spell %q, expected %q", name, p, want[k]))
        end
        n = n + 1
      end
    end
    assert(n >= 20, name .. ": " .. n)
  end
end)

test("dpo: last_only masks the final assistant turn alone", function()
  local t, tok, cases = load_fixture("qwen25")
  local msgs = cases[17].messages -- a b c d e f: three assistant turns
  equal(#msgs, 6)
  local _, all = t:encode(tok, msgs, {})
  local ids, last = t:encode(tok, msgs, {last_only = true})
  local run = {}
  for i, m in ipairs(last) do
    if m == 1 then run[#run + 1] = ids[i] end
    assert(m <= all[i], "last_only marks a subset")
  end
  equal(tok:decode(run), "f<|im_end|>")
end)

test("modeldir: a model's own template is saved where transformers reads it and loaded back", function()
  local modeldir = require "lutra.sft.modeldir"
  local templates = require "lutra.sft.templates"
  local t, tok, cases = load_fixture("llama31")
  local model = lt.models.build(lt.models.config {arch = "llama", n_layer = 1, d_model = 16, n_head = 2,
                                                  block_size = 32, vocab_size = tok.vocab_size})
  local dir = os.tmpname()
  os.remove(dir)
  modeldir.save(dir, model, tok, {template = t})
  equal(read(dir .. "/chat_template.jinja"), t.source)
  local cfg = json.read_file(dir .. "/tokenizer_config.json")
  equal(cfg.chat_template, t.source)
  equal(cfg.bos_token, "<|begin_of_text|>")
  local _, tok2, info = modeldir.load(dir)
  equal(info.template.kind, "jinja")
  equal(info.template.source, t.source)
  -- transformers 4's layout: the template in tokenizer_config.json alone, with its special tokens
  os.remove(dir .. "/chat_template.jinja")
  local _, _, info2 = modeldir.load(dir)
  equal(info2.template.name, dir .. "/tokenizer_config.json")
  local c = cases[1]
  equal(templates.encode(tok2, info2.template, c.messages, opts_of(c)), c.ids)
  -- --template picks lutra's own instead
  equal(select(3, modeldir.load(dir, {template = "chatml"})).template, "chatml")
  os.execute("rm -rf '" .. dir .. "'")
end)

test("jinja: single constructs render as transformers' Jinja renders them (snippets.json)", function()
  local fx = json.read_file(FIX .. "/snippets.json", {ordered = true})
  local bad = {}
  for i, sn in ipairs(fx.snippets) do
    local ok, out = pcall(function() return (jinja.compile(sn.template, {name = "snippet"}):render(fx.vars)) end)
    if sn.error then
      if ok or not tostring(out):find(sn.error:gsub("%.$", ""), 1, true) then
        bad[#bad + 1] = string.format("%d: want error %q, got %s", i, sn.error, tostring(out))
      end
    elseif not ok or out ~= sn.text then
      bad[#bad + 1] = string.format("%d: want %q\n   got %q", i, sn.text, tostring(out))
    end
  end
  assert(#bad == 0, #bad .. " of " .. #fx.snippets .. " snippets differ:\n" .. table.concat(bad, "\n"))
end)

test("lutra's own templates tokenize the conversation as one text: apply_chat_template's ids", function()
  local templates = require "lutra.sft.templates"
  for name, builtin in pairs {chatml = "chatml", lutra_llama3 = "llama3"} do
    local t, tok, cases = load_fixture(name)
    if name == "lutra_llama3" then equal(templates.recognise(t.source), builtin) end -- lutra's own text
    local n = 0
    for _, c in ipairs(cases) do
      local ids, mask = templates.encode(tok, builtin, c.messages, opts_of(c))
      equal(ids, c.ids, name)
      local _, jmask = t:encode(tok, c.messages, opts_of(c)) -- the same loss as the Jinja path's
      equal(mask, jmask, name)
      n = n + 1
    end
    assert(n >= 40)
  end
end)
