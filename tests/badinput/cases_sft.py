"""SFT and DPO JSONL files: every bad line is an error naming the file, the line and the field
(`bad.jsonl:3: messages[1].role: unknown role "robot"`), run through recipes/sft.lua and
recipes/dpo.lua on a small chat model; the documented behaviours (CRLF and blank lines accepted,
a chat without an assistant turn dropped and counted, --on_bad_pair=skip) run to the end."""
from pathlib import Path

from badinput import case

SFT_GOOD = ['{"messages": [{"role": "user", "content": "upper: cup"}, {"role": "assistant", "content": "CUP"}]}',
            '{"prompt": "reverse: star", "completion": "rats"}',
            '{"messages": [{"role": "system", "content": "Answer in few words."}, {"role": "user", "content": "hi"}, '
            '{"role": "assistant", "content": "Hello!"}]}',
            '{"prompt": "3+4?", "completion": "7"}']
DPO_GOOD = ['{"prompt": "8+1?", "chosen": "8+1=9.", "rejected": "8+1=7."}',
            '{"prompt": "upper: rain", "chosen": "RAIN", "rejected": "rain"}',
            '{"prompt": "hello", "chosen": "Hello! How can I help?", "rejected": "What do you want?"}',
            '{"prompt": "6+0?", "chosen": "6+0=6.", "rejected": "6+0=3."}']


def write(path, content):
    Path(path).write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def good(lines):
    return "\n".join(lines * 2) + "\n"


def sft(fx, tmp, train, val=None, *extra):
    """recipes/sft.lua fine-tuning the chat model one step on train (a path) and val."""
    model = fx.chat_model(tmp)
    val = val or write(tmp / "val.jsonl", good(SFT_GOOD))
    return fx.lutra_cmd(fx.root / "recipes/sft.lua", "--model=%s" % model, "--train_data=%s" % train,
                        "--val_data=%s" % val, "--steps=1", "--batch=2", "--warmup=0", "--eval_answers=0",
                        "--threads=1", "--run_dir=%s" % (tmp / "s"), *extra)


def dpo(fx, tmp, train, val=None, *extra):
    """recipes/dpo.lua (LoRA) one step on train (a path) and val."""
    model = fx.chat_model(tmp)
    val = val or write(tmp / "val.jsonl", good(DPO_GOOD))
    return fx.lutra_cmd(fx.root / "recipes/dpo.lua", "--model=%s" % model, "--train_data=%s" % train,
                        "--val_data=%s" % val, "--steps=1", "--batch=2", "--warmup=0", "--eval_every=0",
                        "--threads=1", "--out=%s" % (tmp / "d"), *extra)


def sft_case(name, bad_line, expect, line=3, exit=1):
    """The train file: two good lines, then bad_line (a str, or bytes written as they are)."""
    @case("sft: " + name, expect=expect, exit=exit)
    def _(fx, tmp):
        head = ("\n".join(SFT_GOOD[:line - 1]) + "\n").encode()
        body = bad_line if isinstance(bad_line, bytes) else bad_line.encode()
        return sft(fx, tmp, write(tmp / "bad.jsonl", head + body + b"\n" + SFT_GOOD[0].encode() + b"\n"))


def dpo_case(name, bad_line, expect, line=2, exit=1, extra=()):
    @case("dpo: " + name, expect=expect, exit=exit)
    def _(fx, tmp):
        head = "\n".join(DPO_GOOD[:line - 1]) + "\n"
        return dpo(fx, tmp, write(tmp / "bad.jsonl", head + bad_line + "\n" + "\n".join(DPO_GOOD) + "\n"), None,
                   *extra)


def msg(role, content):
    return '{"role": %s, "content": %s}' % (role, content)


def chat(*messages):
    return '{"messages": [%s]}' % ", ".join(messages)


USER = msg('"user"', '"hi"')

# ---- SFT: the form of a line -------------------------------------------------------------
sft_case("invalid JSON (cut short)", '{"messages": [{"role": "user"', r"bad\.jsonl:3: invalid JSON")
sft_case("garbage after the object", '{"prompt": "a", "completion": "b"} x', r"bad\.jsonl:3: invalid JSON")
sft_case("a line that is an array", '[1, 2]', r"bad\.jsonl:3: expected a JSON object, got an array")
sft_case("a line that is a string", '"hello"', r"bad\.jsonl:3: expected a JSON object, got a string")
sft_case("a line that is a number", '42', r"bad\.jsonl:3: expected a JSON object, got a number")
sft_case("a line that is null", 'null', r"bad\.jsonl:3: expected a JSON object, got null")
sft_case("nesting 100000 deep", "[" * 100000, r"bad\.jsonl:3: invalid JSON: nesting deeper than")
sft_case("neither messages nor prompt/completion", '{"text": "hello"}',
         r'bad\.jsonl:3: expected "messages" or "prompt" and "completion" \(strings\); the object has keys "text"')
sft_case("both messages and prompt", '{"messages": [%s], "prompt": "x", "completion": "y"}' % USER,
         r'bad\.jsonl:3: has both "messages" and "prompt"/"completion"')
sft_case("the error's line number counts blank lines", '\n\n{"messages": 7}',
         r"bad\.jsonl:5: messages: expected a list")

# ---- SFT: messages ----------------------------------------------------------------------
sft_case("messages is an object", '{"messages": {"role": "user", "content": "hi"}}',
         r"bad\.jsonl:3: messages: expected a list of \{\"role\", \"content\"\} messages, got an object")
sft_case("messages is a string", '{"messages": "hi"}', r"bad\.jsonl:3: messages: expected a list.*got a string")
sft_case("messages is null", '{"messages": null}', r"bad\.jsonl:3: messages: expected a list.*got null")
sft_case("an empty conversation", '{"messages": []}', r"bad\.jsonl:3: messages: the conversation is empty")
sft_case("a message that is a string", chat(USER, '"hello"'),
         r"bad\.jsonl:3: messages\[1\]: expected an object \{\"role\", \"content\"\}, got a string")
sft_case("a message without a role", chat(USER, '{"content": "x"}'),
         r"bad\.jsonl:3: messages\[1\]\.role: missing \(expected \"system\", \"user\" or \"assistant\"\)")
sft_case("a role that is a number", chat(msg("1", '"x"')),
         r"bad\.jsonl:3: messages\[0\]\.role: expected a string, got a number")
sft_case("an unknown role", chat(USER, msg('"robot"', '"beep"')),
         r'bad\.jsonl:3: messages\[1\]\.role: unknown role "robot" \(expected "system", "user" or "assistant"\)')
sft_case("a role in capitals", chat(USER, msg('"Assistant"', '"x"')),
         r'bad\.jsonl:3: messages\[1\]\.role: unknown role "Assistant"')
sft_case("a message without content", chat(USER, '{"role": "assistant"}'),
         r"bad\.jsonl:3: messages\[1\]\.content: missing")
sft_case("content null", chat(USER, msg('"assistant"', "null")),
         r"bad\.jsonl:3: messages\[1\]\.content: expected a string, got null")
sft_case("content as a list of parts", chat(USER, msg('"assistant"', '[{"type": "text", "text": "hi"}]')),
         r"bad\.jsonl:3: messages\[1\]\.content: expected a string, got an array")
sft_case("content a number", chat(USER, msg('"assistant"', "42")),
         r"bad\.jsonl:3: messages\[1\]\.content: expected a string, got a number")
sft_case("a number out of range (1e400)", chat(USER, msg('"assistant"', "1e400")),
         r"bad\.jsonl:3: invalid JSON: number 1e400 is out of range")

# ---- SFT: prompt / completion -----------------------------------------------------------
sft_case("a prompt without a completion", '{"prompt": "hi"}', r"bad\.jsonl:3: completion: missing")
sft_case("a completion without a prompt", '{"completion": "hi"}', r"bad\.jsonl:3: prompt: missing")
sft_case("a completion that is a number", '{"prompt": "hi", "completion": 7}',
         r"bad\.jsonl:3: completion: expected a string, got a number")
sft_case("a prompt that is a list", '{"prompt": [%s], "completion": "x"}' % USER,
         r"bad\.jsonl:3: prompt: expected a string, got an array")

# ---- SFT: text the char tokenizer cannot encode ----------------------------------------------
sft_case("a character the char tokenizer cannot encode", chat(USER, msg('"assistant"', '"caf\\u00e9"')),
         r"bad\.jsonl:3: messages\[1\]\.content: the tokenizer cannot encode it: "
         r"character U\+00E9 .*\(the character \u00e9\)")
sft_case("an emoji the tokenizer cannot encode", '{"prompt": "hi \\ud83d\\ude42", "completion": "x"}',
         r"bad\.jsonl:3: prompt: the tokenizer cannot encode it: character U\+1F642")
sft_case("invalid UTF-8 in a string", b'{"prompt": "hi \xff", "completion": "x"}',
         r"bad\.jsonl:3: prompt: the tokenizer cannot encode it: byte 0xff")
sft_case("a NUL character in a string", chat(msg('"user"', '"a\\u0000b"'), msg('"assistant"', '"x"')),
         r"bad\.jsonl:3: messages\[0\]\.content: the tokenizer cannot encode it: character U\+0000")


# ---- SFT: whole files ---------------------------------------------------------------------
@case("sft: a byte order mark (BOM) at the start", expect=r"bad\.jsonl:1: the file starts with a UTF-8 byte order mark")
def _(fx, tmp):
    return sft(fx, tmp, write(tmp / "bad.jsonl", b"\xef\xbb\xbf" + good(SFT_GOOD).encode()))


@case("sft: an empty file", expect=r"sft: .*bad\.jsonl: no records: the file is empty")
def _(fx, tmp):
    return sft(fx, tmp, write(tmp / "bad.jsonl", ""))


@case("sft: blank lines only", expect=r"bad\.jsonl: no records: the file is empty \(3 blank lines\)")
def _(fx, tmp):
    return sft(fx, tmp, write(tmp / "bad.jsonl", "\n  \n\t\n"))


@case("sft: a missing file", expect=r"sft: cannot open .*nothere\.jsonl: No such file")
def _(fx, tmp):
    return sft(fx, tmp, tmp / "nothere.jsonl")


@case("sft: a directory as the data", expect=r"sft: .*/adir: cannot read: Is a directory")
def _(fx, tmp):
    (tmp / "adir").mkdir()
    return sft(fx, tmp, tmp / "adir")


@case("sft: the val file's bad line is named", expect=r"val_bad\.jsonl:2: messages\[0\]\.role: unknown role \"bot\"")
def _(fx, tmp):
    train = write(tmp / "train.jsonl", good(SFT_GOOD))
    return sft(fx, tmp, train, write(tmp / "val_bad.jsonl", SFT_GOOD[0] + "\n" + chat(msg('"bot"', '"x"')) + "\n"))


@case("sft: CRLF line ends and blank lines are accepted (documented)", exit=0,
      expect=r"data: .*crlf\.jsonl: 8 examples .*trained 1 steps")
def _(fx, tmp):
    return sft(fx, tmp, write(tmp / "crlf.jsonl", good(SFT_GOOD).replace("\n", "\r\n\r\n")))


@case("sft: a chat without an assistant turn is dropped and counted (documented)", exit=0,
      expect=r"data: .*noreply\.jsonl: 8 examples .*; 1 without a loss token dropped")
def _(fx, tmp):
    return sft(fx, tmp, write(tmp / "noreply.jsonl", good(SFT_GOOD) + chat(USER) + "\n"))


# ---- DPO ------------------------------------------------------------------------------------
dpo_case("chosen == rejected == \"\"", '{"prompt": "hi", "chosen": "", "rejected": ""}',
         r"dpo: .*bad\.jsonl:2: chosen and rejected are both empty")
dpo_case("chosen == rejected", '{"prompt": "hi", "chosen": "same", "rejected": "same"}',
         r'bad\.jsonl:2: chosen and rejected are the same text \("same"\): the pair states no preference')
dpo_case("an empty chosen", '{"prompt": "hi", "chosen": "", "rejected": "no"}',
         r"bad\.jsonl:2: chosen: the response is empty")
dpo_case("an empty rejected", '{"prompt": "hi", "chosen": "yes", "rejected": ""}',
         r"bad\.jsonl:2: rejected: the response is empty")
dpo_case("no rejected", '{"prompt": "hi", "chosen": "yes"}', r"bad\.jsonl:2: rejected: missing")
dpo_case("no prompt", '{"chosen": "yes", "rejected": "no"}', r"bad\.jsonl:2: prompt: missing")
dpo_case("chosen a number", '{"prompt": "hi", "chosen": 1, "rejected": "no"}',
         r"bad\.jsonl:2: chosen: a response must be a string or one assistant message, got a number")
dpo_case("chosen two messages", '{"prompt": "hi", "chosen": [%s, %s], "rejected": "no"}' % (
    msg('"assistant"', '"a"'), msg('"assistant"', '"b"')), r"bad\.jsonl:2: chosen: .*got a list of 2 messages")
dpo_case("chosen a user message", '{"prompt": "hi", "chosen": [%s], "rejected": "no"}' % USER,
         r"bad\.jsonl:2: chosen\[0\]\.role: a response is the assistant's, got \"user\"")
dpo_case("a prompt that is a number", '{"prompt": 3, "chosen": "a", "rejected": "b"}',
         r"bad\.jsonl:2: prompt: expected a string or a list of messages, got a number")
dpo_case("a prompt message with an unknown role",
         '{"prompt": [%s], "chosen": "a", "rejected": "b"}' % msg('"usr"', '"x"'),
         r'bad\.jsonl:2: prompt\[0\]\.role: unknown role "usr"')
dpo_case("an empty prompt conversation", '{"prompt": [], "chosen": "a", "rejected": "b"}',
         r"bad\.jsonl:2: prompt: the conversation is empty")
dpo_case("a response the char tokenizer cannot encode", '{"prompt": "hi", "chosen": "\\u65e5\\u672c", "rejected": "b"}',
         r"bad\.jsonl:2: chosen: the tokenizer cannot encode it: character U\+65E5")
dpo_case("invalid JSON", '{"prompt": "hi", "chosen": ', r"bad\.jsonl:2: invalid JSON")
dpo_case("a line that is an array", '["hi", "a", "b"]', r"bad\.jsonl:2: expected a JSON object, got an array")
dpo_case("--on_bad_pair=skip leaves bad pairs out and counts them (documented)",
         '{"prompt": "hi", "chosen": "", "rejected": ""}\n{"prompt": "hi", "chosen": "x", "rejected": "x"}',
         r"data: skipped 2 train and 0 held-out pairs with an empty response or chosen == rejected", exit=0,
         extra=("--on_bad_pair=skip",))
dpo_case("--on_bad_pair=skip does not skip a malformed line", '{"prompt": "hi", "chosen": 5, "rejected": ""}',
         r"bad\.jsonl:2: chosen: a response must be a string", extra=("--on_bad_pair=skip",))
dpo_case("--on_bad_pair=maybe", '{"prompt": "hi", "chosen": "a", "rejected": "b"}', r"on_bad_pair.*maybe",
         extra=("--on_bad_pair=maybe",))


@case("dpo: every pair skipped", expect=r"dpo: .*allbad\.jsonl: no pairs left: all 2 were skipped")
def _(fx, tmp):
    bad = '{"prompt": "a", "chosen": "x", "rejected": "x"}\n{"prompt": "b", "chosen": "", "rejected": "y"}\n'
    return dpo(fx, tmp, write(tmp / "allbad.jsonl", bad), None, "--on_bad_pair=skip")


@case("dpo: an empty file", expect=r"dpo: .*bad\.jsonl: no records: the file is empty")
def _(fx, tmp):
    return dpo(fx, tmp, write(tmp / "bad.jsonl", ""))


@case("dpo: a byte order mark (BOM)", expect=r"dpo: .*bad\.jsonl:1: the file starts with a UTF-8 byte order mark")
def _(fx, tmp):
    return dpo(fx, tmp, write(tmp / "bad.jsonl", b"\xef\xbb\xbf" + good(DPO_GOOD).encode()))


@case("dpo: the val file's bad line is named", expect=r"dpo: .*val_bad\.jsonl:3: chosen and rejected are both empty")
def _(fx, tmp):
    train = write(tmp / "train.jsonl", good(DPO_GOOD))
    val = write(tmp / "val_bad.jsonl", DPO_GOOD[0] + "\n\n" + '{"prompt": "a", "chosen": "", "rejected": ""}\n')
    return dpo(fx, tmp, train, val)


@case("dpo: CRLF line ends are accepted (documented)", exit=0, expect=r"data: 8 train pairs .*trained 1 steps")
def _(fx, tmp):
    return dpo(fx, tmp, write(tmp / "crlf.jsonl", good(DPO_GOOD).replace("\n", "\r\n")))
