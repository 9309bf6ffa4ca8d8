"""gen_chat.py OUTDIR [--check-lutra DIR]: real chat templates rendered by transformers' apply_chat_template.

For each template of chat_templates.py (Llama 3.1, Qwen2.5, Qwen3, Mistral, SmolLM2, ChatML, Gemma, and ChatML and
SmolLM2 with {% generation %} blocks) writes OUTDIR/<name>/:
  tokenizer.json, tokenizer_config.json, chat_template.jinja  a small byte-level BPE tokenizer (tokenizers, trained
                         on the conversations' text, the template's special tokens added as special tokens), saved by
                         transformers' save_pretrained with the template
  cases.json             the conversations (messages, tools, template kwargs, add_generation_prompt) and for each what
                         apply_chat_template gives: the text (tokenize=False), the ids (tokenize=True) and, for
                         templates with {% generation %}, return_assistant_tokens_mask; or the error the template
                         raises (raise_exception)
Deterministic: fixed conversations, a tokenizer trained on them. tests/lua/test_hf_chat.lua checks lutra against it.

--check-lutra DIR: loads DIR (a model directory lutra saved) with AutoTokenizer and prints its chat_template, so that
a test can compare it with the template lutra wrote.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat_templates  # noqa: E402

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402
from transformers.utils.chat_template_utils import render_jinja_template  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                   "required": ["query"]}}}


def sys_(t):
    return {"role": "system", "content": t}


def user(t):
    return {"role": "user", "content": t}


def asst(t):
    return {"role": "assistant", "content": t}


PLAIN = [
    [user("Hello!"), asst("Hi there. How can I help?")],
    [sys_("You are a terse assistant."), user("2+2?"), asst("4")],
    [user("Bonjour, ça va ?"), asst("Très bien, merci ! Et vous ?"), user("Très bien."), asst("Parfait.")],
    [user("日本語で話せますか？"), asst("はい、話せます。😊")],
    [user("Emoji test: 🦦🚀✨"), asst("🦦 is an otter.")],
    [sys_("Be kind."), user("  padded  "), asst("  padded reply\n\n")],
    [user("Tabs\tand\nnewlines\n\nhere"), asst("Seen:\n\t- tabs\n\t- newlines")],
    [user("Count: 1 22 333 4444 55555"), asst("12345")],
    [user("a"), asst("b"), user("c"), asst("d"), user("e"), asst("f")],
    [user("Write code"), asst("```python\nprint('hi')\n```")],
    [user("Quote \"this\" and 'that'"), asst("\"this\" and 'that'")],
    [user("Empty reply next"), asst("")],
    [sys_("System only, then a user."), user("Go.")],
    [user("Only a user turn")],
    [user("Backslash \\n is not a newline"), asst("Right: \\n")],
    [user("Curly {{ braces }} and {% tags %}"), asst("{{ not rendered }}")],
    [user("Ünïcödé àccents"), asst("Ça marche — très bien…")],
    [user("Mixed 中文 and English"), asst("好的 OK")],
    [sys_("Multi\nline\nsystem"), user("Hi"), asst("Hello"), user("Bye")],
    [user("Long " + "word " * 40), asst("Short.")],
    [user("Arabic مرحبا and Hebrew שלום"), asst("Greetings.")],
    [user("Trailing spaces   "), asst("Leading spaces")],
]

TOOL_CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
TOOL_CALL2 = {"type": "function", "function": {"name": "search", "arguments": {"query": "otters", "limit": 3}}}


def qwen_cases():
    out = [{"messages": m} for m in PLAIN]
    out += [
        {"messages": [user("Weather in Paris?")], "tools": [WEATHER]},
        {"messages": [sys_("You are a weather bot."), user("Weather in Paris?")], "tools": [WEATHER, SEARCH]},
        {"messages": [user("Weather in Paris?"), {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
                      {"role": "tool", "content": "{\"temp\": 21}"}, asst("It is 21°C in Paris.")],
         "tools": [WEATHER]},
        {"messages": [user("Weather and otters?"),
                      {"role": "assistant", "content": "Let me check.", "tool_calls": [TOOL_CALL, TOOL_CALL2]},
                      {"role": "tool", "content": "21"}, {"role": "tool", "content": "3 results"},
                      asst("21°C; 3 otter pages.")], "tools": [WEATHER, SEARCH]},
        {"messages": [user("No tools here"), {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                      {"role": "tool", "content": "sunny"}]},
    ]
    return out


def qwen3_cases():
    out = qwen_cases()
    out += [
        {"messages": [user("Think first"), {"role": "assistant", "content": "Answer.", "reasoning_content": "Hmm."}]},
        {"messages": [user("q1"), asst("<think>\nold thought\n</think>\n\nold answer"), user("q2"),
                      asst("<think>\nnew thought\n</think>\n\nnew answer")]},
        {"messages": [user("Quick")], "kwargs": {"enable_thinking": False}},
        {"messages": [user("Slow")], "kwargs": {"enable_thinking": True}},
        {"messages": [user("<tool_response>\nx\n</tool_response>"), asst("ok")]},
        {"messages": [user("Weather?"), {"role": "assistant", "content": "",
                                         "tool_calls": [{"type": "function", "function": {
                                             "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                      {"role": "tool", "content": "cold"}, asst("Cold in Oslo.")], "tools": [WEATHER]},
    ]
    return out


def llama_cases():
    out = [{"messages": m} for m in PLAIN]
    out += [
        {"messages": [user("Weather in Paris?")], "tools": [WEATHER]},
        {"messages": [sys_("Tool bot."), user("Weather in Paris?")], "tools": [WEATHER],
         "kwargs": {"tools_in_user_message": False}},
        {"messages": [user("Weather in Paris?"), {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
                      {"role": "ipython", "content": "{\"temp\": 21}"}, asst("21°C.")], "tools": [WEATHER]},
        {"messages": [user("Hi")], "kwargs": {"date_string": "01 Jan 2025"}},
        {"messages": [user("Search otters"),
                      {"role": "assistant", "content": "", "tool_calls": [
                          {"type": "function", "function": {"name": "brave_search", "arguments": {"query": "otters"}}}]},
                      {"role": "tool", "content": "results"}],
         "kwargs": {"builtin_tools": ["brave_search", "wolfram_alpha"]}},
        {"messages": [user("Two calls"), {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL, TOOL_CALL2]}],
         "tools": [WEATHER]},
        {"messages": [], "tools": [WEATHER]},
    ]
    return out


def mistral_cases():
    out = [{"messages": m} for m in PLAIN if [x["role"] for x in m if x["role"] != "system"][::2] ==
           ["user"] * len([x for x in m if x["role"] != "system"][::2])]
    out += [
        {"messages": [user("Weather in Paris?")], "tools": [WEATHER]},
        {"messages": [sys_("Weather bot."), user("Hi"), asst("Hello"), user("Weather in Paris?")],
         "tools": [WEATHER, SEARCH]},
        {"messages": [user("Weather in Paris?"),
                      {"role": "assistant", "tool_calls": [dict(TOOL_CALL, id="abc123xyz")]},
                      {"role": "tool", "content": "21", "tool_call_id": "abc123xyz"}, asst("21°C.")],
         "tools": [WEATHER]},
        {"messages": [user("Bad id"), {"role": "assistant", "tool_calls": [dict(TOOL_CALL, id="short")]}]},
        {"messages": [user("a"), user("b")]},
        {"messages": [user("a"), {"role": "robot", "content": "b"}]},
    ]
    return out


def gemma_cases():
    out = [{"messages": [m for m in c if m["role"] != "system"]} for c in PLAIN]
    out += [{"messages": [sys_("no"), user("hi")]}, {"messages": [user("a"), user("b")]},
            {"messages": [asst("first")]}]
    return out


CASES = {"llama": llama_cases, "qwen": qwen_cases, "qwen3": qwen3_cases, "mistral": mistral_cases,
         "plain": lambda: [{"messages": m} for m in PLAIN], "gemma": gemma_cases,
         # the tool-use template lists tools always: the conversations with tools, and one without (its error)
         "hermes": lambda: [dict(c, tools=c.get("tools") or [WEATHER, SEARCH]) for c in qwen_cases()]
         + [{"messages": PLAIN[0]}]}


# Single constructs, rendered by transformers' own Jinja environment (the reference for lutra.jinja's semantics)
SNIPPET_VARS = {"s": "héllo wörld", "xs": [3, 1, 2], "d": {"b": 1, "a": [1, "x", None]}, "n": 7, "z": 0, "t": True,
                "none": None, "ms": [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"},
                                     {"role": "user", "content": "bye"}], "sp": "  a  b\tc \n", "e": ""}
SNIPPETS = [
    "{{ s }}|{{ s|length }}|{{ s|upper }}|{{ s|title }}|{{ s|capitalize }}|{{ s[1:4] }}|{{ s[-3:] }}|{{ s[::2] }}",
    "{{ s.split(' ') }}|{{ s.split() }}|{{ sp.split() }}|{{ sp.strip() }}|{{ sp.lstrip() }}|{{ sp.rstrip() }}|{{ s.split('l', 1) }}",
    "{{ s.startswith('hé') }}{{ s.endswith(('x', 'ld')) }}{{ s.replace('l', 'L') }}{{ s.replace('l', 'L', 1) }}{{ s.find('w') }}",
    "{{ s.strip('hd') }}|{{ '  x '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ s.count('l') }}|{{ '{}+{}={x}'.format(1, 2, x=3) }}",
    "{{ xs|sort }}|{{ xs|sort(reverse=true) }}|{{ xs|first }}|{{ xs|last }}|{{ xs|length }}|{{ xs|sum }}|{{ xs|reverse|list }}",
    "{{ xs|join(',') }}|{{ xs|map('string')|join }}|{{ ms|map(attribute='role')|list }}|{{ ms|selectattr('role', 'equalto', 'user')|list|length }}",
    "{{ ms|rejectattr('role', 'equalto', 'user')|map(attribute='content')|first }}|{{ [1, 0, 2]|select|list }}|{{ [1, 0, 2]|reject|list }}",
    "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ d.items()|list }}|{{ d|items|list }}|{{ d.keys()|list }}|{{ d.values()|list }}",
    "{{ d.get('a') }}|{{ d.get('q') }}|{{ d.get('q', 5) }}|{{ d['b'] }}|{{ d.b }}|{{ 'a' in d }}|{{ d|length }}|{{ d|list }}",
    "{{ 1 + 2 * 3 - 4 / 2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ n * 'ab' }}|{{ 'x' ~ n ~ none ~ t }}",
    "{{ n > 3 and n < 10 }}|{{ z or 'fb' }}|{{ e or 'empty' }}|{{ not xs }}|{{ n == 7.0 }}|{{ 'a' < 'b' }}|{{ [1, 2] == [1, 2] }}|{{ xs != xs }}",
    "{{ n is number }}{{ s is string }}{{ d is mapping }}{{ xs is iterable }}{{ s is iterable }}{{ none is none }}{{ t is true }}{{ z is false }}",
    "{{ q is defined }}{{ q is undefined }}{{ n is odd }}{{ n is even }}{{ 6 is divisibleby 3 }}{{ s is lower }}{{ xs is sequence }}{{ n is integer }}",
    "{{ 'x' if t else 'y' }}|{{ 'x' if z else 'y' }}|{{ 'x' if z }}|{{ q }}|{{ q|default('dflt') }}|{{ e|default('dflt', true) }}|{{ none|string }}",
    "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
    "{% for x in xs if x > 1 %}{{ x }}{{ loop.cycle('a', 'b') }}{% else %}none{% endfor %}|{% for x in [] %}x{% else %}else{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for c in 'héy' %}[{{ c }}]{% endfor %}|{% for k in d %}{{ k }}{% endfor %}",
    "{% for x in xs %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% set a = 1 %}{% for x in xs %}{% set a = a + x %}{% endfor %}{{ a }}|{% set ns = namespace(a=1) %}{% for x in xs %}{% set ns.a = ns.a + x %}{% endfor %}{{ ns.a }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set blk %}in{{ n }}{% endset %}{{ blk }}|{% set l = [1, 2] + [3] %}{{ l }}|{{ (1, 2) }}",
    "{% macro m(a, b='B') %}<{{ a }}{{ b }}>{% endmacro %}{{ m(1) }}{{ m(2, 'c') }}{{ m(3, b='d') }}|{% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}in{% endcall %}",
    "a\n  {% if t %}\n    b\n  {% endif %}\nc\n{# comment #}\nd  {%- if t -%}  e  {%- endif -%}  f\n  {{ 'g' }}\n",
    "{{ ms[0].content|trim }}|{{ ms[-1]['content'] }}|{{ ms[5] }}|{{ ms[0].nope }}|{{ d.b.c }}|{{ range(3)|list }}|{{ range(1, 7, 2)|list }}",
    "{{ '%d items'|replace('%d', '3') }}|{{ 'ab'|list }}|{{ [3, 1, 3]|unique|list }}|{{ -n|abs }}|{{ '42'|int + 1 }}|{{ 'x'|int }}|{{ 3.7|int }}|{{ 'a b  c'|wordcount }}",
    "{{ {'k': 'v', 'n': [1, {'m': none}]} }}|{{ [\"it's\", 'q', 'a\\\\b'] }}|{{ dict(a=1, b=2) }}|{{ [true, false, none] }}",
    "{{ 1.5 + 1 }}|{{ 3 / 2 }}|{{ 4 / 2 }}|{{ 2 ** -1 }}|{{ 1.0 }}|{{ 10 / 4 * 2 }}|{{ 7.5 // 2 }}|{{ 2.5|int }}|{{ [1.0, 2]|tojson }}",
    "{{ 'ÀÉÎõü ßÿ ĀāŁł ΑΒΓαβγ АБВабв'|lower }}|{{ 'àéîõü ĀāŁł αβγ абв'|upper }}|{{ 'élan vital ΑΒΓ'|title }}|{{ 'éLAN'|capitalize }}",
    "{{ 'a,b,c,d'.rsplit(',', 1) }}|{{ 'a,b,c'.rsplit(',') }}|{{ 'a b  c'.rsplit() }}|{{ 1e20 }}|{{ 1e15 / 1 }}|{{ 0.0001 / 1 }}|{{ 1 / 3 }}",
    "{{ 'line1\nline2'.splitlines() }}|{{ 'a-b-c'.rsplit is defined }}|{{ s.upper().lower() }}|{{ '  x'.isspace() }}|{{ '123'.isdigit() }}",
    "{%- for m in ms -%}\n  {%- if m.role == 'user' -%}\n    U:{{ m.content }}\n  {%- else -%}\n    A:{{ m.content }}\n  {%- endif %}\n{% endfor -%}\nend",
    "{% if xs|length > 2 %}many{% elif xs %}some{% else %}none{% endif %}|{% if none %}x{% elif e %}y{% endif %}|{{ xs[0] if xs else 0 }}",
    "{{ 'tool_calls' in ms[0] }}|{{ ms[0] == {'role': 'user', 'content': ' hi '} }}|{{ ms[0] == ms[2] }}|{{ 1 in xs }}|{{ 'é' in s }}",
    "{% for k, v in {'b': 1, 'A': 2, 'c': 0}|dictsort %}{{ k }}{{ v }}{% endfor %}|{{ d|dictsort(by='key', reverse=true) }}"
    "|{{ 2.567|round(2) }}|{{ 2.5|round }}|{{ 7|round }}|{{ '%s is %d (%r)'|format('x', 3, 'q') }}|{{ xs|min }}|{{ xs|max }}",
    "{{ raise_exception('boom at ' ~ n) }}",
    "{{ q.attr }}",
    "{{ s + 1 }}",
    "{{ xs.append(4) }}",
]


def snippets():
    from transformers.utils.chat_template_utils import _compile_jinja_template
    out = []
    for src in SNIPPETS:
        rec = {"template": src}
        try:
            rec["text"] = _compile_jinja_template(src).render(**SNIPPET_VARS)
        except Exception as e:  # noqa: BLE001 - the reference's message, whatever its kind
            rec["error"] = str(e)
        out.append(rec)
    return {"vars": SNIPPET_VARS, "snippets": out}


def train_tokenizer(corpus, specials, bos, eos, add_bos=False):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    if add_bos:  # Llama 3's: the post-processor adds BOS, which apply_chat_template leaves out
        tok.post_processor = processors.TemplateProcessing(single=bos + " $A", pair=bos + " $A " + bos + " $B",
                                                           special_tokens=[(bos, tok.token_to_id(bos))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos)


def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_sources.md")) as f:
        sources = f.read()
    with open(os.path.join(outdir, "SOURCES.md"), "w") as f:
        f.write(sources)
    summary = {}
    for name, (template, specials, bos, eos, kind) in chat_templates.TEMPLATES.items():
        cases = CASES[kind]()
        for c in cases:
            c.setdefault("tools", None)
            c.setdefault("kwargs", {})
        variants = []
        for c in cases:
            for gen in ((False,) if kind == "hermes" else (False, True)):  # (hermes: its long tool prompt, once)
                variants.append(dict(c, add_generation_prompt=gen))
        # the tokenizer learns from the conversations as the template renders them (newlines, headers and all), so
        # that merges cross the template's seams as they do in a real model's tokenizer
        corpus = [json.dumps(c, ensure_ascii=False) for c in cases]
        for c in cases:
            try:
                rendered, _ = render_jinja_template([c["messages"]], tools=c["tools"], chat_template=template,
                                                    bos_token=bos or "", eos_token=eos, **c["kwargs"])
                corpus += rendered * 3
            except Exception:  # noqa: BLE001 - a conversation the template refuses: its error is a fixture too
                pass
        tok = train_tokenizer(corpus, specials, bos, eos, add_bos=name.endswith("_bos"))
        tok.chat_template = template
        d = os.path.join(outdir, name)
        os.makedirs(d, exist_ok=True)
        tok.save_pretrained(d)
        with_generation = "generation" in name
        records = []
        for v in variants:
            rec = {"messages": v["messages"], "tools": v["tools"], "kwargs": v["kwargs"],
                   "add_generation_prompt": v["add_generation_prompt"]}
            try:
                rec["text"] = tok.apply_chat_template(v["messages"], tools=v["tools"], tokenize=False,
                                                      add_generation_prompt=v["add_generation_prompt"], **v["kwargs"])
                out = tok.apply_chat_template(v["messages"], tools=v["tools"], tokenize=True, return_dict=True,
                                              add_generation_prompt=v["add_generation_prompt"],
                                              return_assistant_tokens_mask=with_generation, **v["kwargs"])
                rec["ids"] = list(out["input_ids"])
                if with_generation:
                    rec["mask"] = list(out["assistant_masks"])
            except Exception as e:  # the template's raise_exception
                rec["error"] = str(e)
            records.append(rec)
        with open(os.path.join(d, "cases.json"), "w", encoding="utf-8") as f:
            f.write("[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n]\n")
        summary[name] = {"cases": len(records), "errors": sum("error" in r for r in records)}
    with open(os.path.join(outdir, "snippets.json"), "w", encoding="utf-8") as f:
        json.dump(snippets(), f, ensure_ascii=False, indent=1)
    with open(os.path.join(outdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
    print(json.dumps(summary))


def check_lutra(d):
    """What transformers makes of a directory lutra saved: its chat_template (equal to the chat_template.jinja
    lutra wrote?) and the ids of a few conversations, to set beside lutra's (docs: tests/hf/README.md)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(d)
    written = None
    if os.path.exists(os.path.join(d, "chat_template.jinja")):
        with open(os.path.join(d, "chat_template.jinja"), encoding="utf-8") as f:
            written = f.read()
    ids = [tok.apply_chat_template(m, tokenize=True, return_dict=True)["input_ids"] for m in PLAIN[:4]]
    print(json.dumps({"chat_template": tok.chat_template, "equal_to_chat_template_jinja": tok.chat_template == written,
                      "ids": ids}))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--check-lutra":
        check_lutra(sys.argv[2])
    else:
        main(sys.argv[1])
