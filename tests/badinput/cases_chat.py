"""A model's own chat template (chat_template.jinja, tokenizer_config.json's chat_template), run by
lutra.jinja: what it cannot run, what the template itself refuses (raise_exception), a template
that is not a text, and bounds against a hostile template. Each error names the template's file
and line (`chat template (model/chat_template.jinja) line 3: {% extends %} is not supported ...`),
and, in an SFT file, the file and line of the row. Run through `lutra generate` and recipes/sft.lua
on the small llama (byte-level BPE) model; the documented behaviour (a model's own template used)
runs to the end."""
import json
from pathlib import Path

from badinput import case

JINJA = r"chat template \(\S*model/chat_template\.jinja\) "
CONFIG = r"chat template \(\S*model/tokenizer_config\.json\) "
SFT_ROWS = ['{"messages": [{"role": "user", "content": "upper: cup"}, {"role": "assistant", "content": "CUP"}]}',
            '{"prompt": "3+4?", "completion": "7"}']


def generate(fx, model, *extra):
    return fx.lutra_cmd("generate", model, "--prompt", "hi", "--max_new_tokens=1", *extra)


def with_template(fx, tmp, text, where="chat_template.jinja"):
    """The llama model directory with text as its only chat template (in chat_template.jinja or
    tokenizer_config.json)."""
    model = fx.llama_model_dir(tmp)
    for name in ("chat_template.json", "chat_template.jinja", "tokenizer_config.json"):
        (model / name).unlink(missing_ok=True)
    if where == "chat_template.jinja":
        (model / where).write_text(text)
    else:
        (model / where).write_text(json.dumps({"chat_template": text, "eos_token": "<|endoftext|>"}))
    return model


def sft(fx, tmp, model, rows):
    data = Path(tmp) / "train.jsonl"
    data.write_text("\n".join(rows * 2) + "\n")
    return fx.lutra_cmd(fx.root / "recipes/sft.lua", "--model=%s" % model, "--train_data=%s" % data,
                        "--val_data=%s" % data, "--steps=1", "--batch=2", "--warmup=0", "--eval_answers=0",
                        "--threads=1", "--run_dir=%s" % (Path(tmp) / "s"))


def template_case(name, text, expect, where="chat_template.jinja"):
    @case("generate: " + name, expect=(JINJA if where == "chat_template.jinja" else CONFIG) + expect)
    def _(fx, tmp):
        return generate(fx, with_template(fx, tmp, text, where))


CHAT = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"

# ---- what lutra.jinja does not run: refused by name, at the line ------------------------------
template_case("{% extends %}", "{# a base #}\n\n{% extends 'base.jinja' %}" + CHAT,
              r"line 3: \{% extends %\} is not supported in chat templates")
template_case("{% include %} (tokenizer_config.json)", CHAT + "\n{% include 'tools.jinja' %}",
              r"line 3: \{% include %\} is not supported in chat templates", where="tokenizer_config.json")
template_case("{% import %}", "{% import 'macros.jinja' as m %}" + CHAT, r"line 1: \{% import %\} is not supported")
template_case("{% filter %} block", "{% filter upper %}x{% endfilter %}", r"line 1: \{% filter %\} is not supported")
template_case("{% raw %}", "a\n{% raw %}{{ x }}{% endraw %}", r"line 2: \{% raw %\} is not supported")
template_case("a recursive loop", "{% for m in messages recursive %}{{ m.role }}{% endfor %}",
              r"line 1: recursive for loops are not supported")
template_case("an unknown tag", "x\n{% frobnicate %}", r"line 2: unknown tag 'frobnicate'")
template_case("an unknown filter", CHAT + "{{ messages[0].content | wordwrap(5) }}", r"line 2: no filter named 'wordwrap'")
template_case("an unknown test", "{% if messages is frozen %}x{% endif %}", r"line 1: no test named 'frozen'")
template_case("an unclosed if", "{% if messages %}\n{{ 'x' }}", r"line 1: 'if' is not closed \(expected \{% endif %\}")
template_case("an unclosed {{", CHAT + "{{ messages", r"line 2: unexpected end of template: a \{\{ was not closed")
template_case("an endfor without a for", CHAT + "{% endfor %}", r"line 2: unexpected \{% endfor %\}")
template_case("an unclosed string", "{{ 'abc }}", r"line 1: unexpected end of template: a \{\{ was not closed")
template_case("a stray character", "{{ messages ? 1 }}", r"line 1: unexpected character '\?'")

# ---- what the template refuses, and undefined values used ----------------------------------
template_case("raise_exception", "{% if messages[0].role == 'user' %}\n\n{{ raise_exception('Only system-first chats') }}"
              "{% endif %}", r"line 3: raise_exception: Only system-first chats")
template_case("an attribute of an undefined value", CHAT + "{{ nothing.attr }}", r"line 2: 'nothing' is undefined")
template_case("a missing attribute used", "{{ messages[0].content.nope + 'x' }}",
              r"line 1: 'str object' has no attribute 'nope'")
template_case("adding a string and a number", "{{ messages[0].content + 1 }}",
              r'line 1: can only concatenate str \(not "int"\) to str')
template_case("changing a list", "{% set x = messages.append(1) %}", r"line 1: access to attribute 'append' of 'list' "
              r"object is unsafe")
template_case("an underscore attribute on a namespace", "{% set ns = namespace() %}{% set ns._x = 1 %}",
              r"line 1: chat templates cannot store underscore-prefixed attributes")

# ---- bounds: a hostile template stops with a message, never hangs or overflows --------------
template_case("a macro calling itself", "{% macro f() %}{{ f() }}{% endmacro %}\n{{ f() }}",
              r"line 1: macro calls nested deeper than 100")
template_case("loops without end", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
              r"line 1: the template ran more than 1000000 loop iterations")
template_case("a string of a terabyte", "{{ 'x' * 1000000000000 }}", r"line 1: a string of more than \d+ bytes")


# ---- a template that is not a text -----------------------------------------------------------
@case("tokenizer_config.json: chat_template is a number",
      expect=r"model/tokenizer_config\.json: chat_template is not a text \(a Jinja template\), got number")
def _(fx, tmp):
    model = with_template(fx, tmp, "x", where="tokenizer_config.json")
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": 5}))
    return generate(fx, model)


@case("tokenizer_config.json: the default template of the list is not a text",
      expect=r"model/tokenizer_config\.json: chat_template\[\"default\"\]\.template is not a text")
def _(fx, tmp):
    model = with_template(fx, tmp, "x", where="tokenizer_config.json")
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "default", "template": None}]}))
    return generate(fx, model)


# ---- SFT: the row's file and line, then the template's -----------------------------------------
@case("sft: a row the template refuses (raise_exception)",
      expect=r"sft: \S*train\.jsonl:1: " + JINJA + r"line 2: raise_exception: no prompt/completion rows")
def _(fx, tmp):
    model = with_template(fx, tmp, "{% if messages|length < 3 %}\n{{ raise_exception('no prompt/completion rows') }}"
                          "{% endif %}" + CHAT)
    return sft(fx, tmp, model, SFT_ROWS)


@case("sft: an assistant content the template changes, without {% generation %}",
      expect=r"sft: \S*train\.jsonl:1: " + JINJA.replace(r"\) ", r"\): ")
             + r"messages\[2\] \(assistant\): its content is not in the rendered text")
def _(fx, tmp):
    model = with_template(fx, tmp, "{% for m in messages %}{{ m.role }}: {{ m.content | lower }}\n{% endfor %}")
    return sft(fx, tmp, model, SFT_ROWS)


@case("sft: tools that are not a list", expect=r"sft: \S*train\.jsonl:1: tools: expected a list of tool schemas")
def _(fx, tmp):
    model = with_template(fx, tmp, CHAT)
    row = '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "tools": "x"}'
    return sft(fx, tmp, model, [row])


# ---- documented: the model's own template is used -----------------------------------------------
@case("generate with the model's own template (documented)", exit=0, expect=r"\S")
def _(fx, tmp):
    return generate(fx, with_template(fx, tmp, "{{ bos_token }}" + CHAT + "{% if add_generation_prompt %}assistant: "
                                      "{% endif %}", where="tokenizer_config.json"))


@case("sft with the model's own template, {% generation %} marking the loss (documented)", exit=0,
      expect=r"data: \S*train\.jsonl: .* examples \(\S*chat_template\.jinja template\)")
def _(fx, tmp):
    model = with_template(fx, tmp, "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
                          "{{ m.content }}<|endoftext|>{% endgeneration %}{% else %}{{ m.content }}{% endif %}"
                          "{% endfor %}")
    return sft(fx, tmp, model, SFT_ROWS)


@case("dpo with the model's own template: the response's span carries the loss (documented)", exit=0,
      expect=r"template: \S*chat_template\.jinja")
def _(fx, tmp):
    model = with_template(fx, tmp, "{% for m in messages %}{{ m.content }}{% if m.role == 'assistant' %}<|endoftext|>"
                          "{% endif %}{% endfor %}")
    data = Path(tmp) / "pairs.jsonl"
    data.write_text('{"prompt": "8+1?", "chosen": "9", "rejected": "7"}\n'
                    '{"prompt": "upper: rain", "chosen": "RAIN", "rejected": "rain"}\n' * 2)
    return fx.lutra_cmd(fx.root / "recipes/dpo.lua", "--model=%s" % model, "--train_data=%s" % data,
                        "--val_data=%s" % data, "--steps=1", "--batch=2", "--warmup=0", "--eval_every=0",
                        "--threads=1", "--out=%s" % (Path(tmp) / "d"))
