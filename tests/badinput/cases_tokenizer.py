"""tokenizer.json (Hugging Face's byte-level BPE, and lutra's char format): each error names the
file and the place inside the JSON (model.vocab['he'], added_tokens[3].id, model.merges[0])."""
import json

from badinput import case, edit_json

# the error names the file: "tokenizer.json: <what> (<path>/model/tokenizer.json)"
WHERE = r".*\(\S*model/tokenizer\.json\)"


def generate(fx, model):
    return fx.lutra_cmd("generate", model, "--prompt", "hi", "--max_new_tokens=1")


def tok_case(name, edit, expect, exit=1, char=False):
    """A case that edits model/tokenizer.json of the llama fixture (byte-level BPE, 300 tokens, three
    added tokens at 297-299) with edit(obj), or of the gpt2 fixture's char tokenizer (char=True)."""
    @case("tokenizer.json: " + name, expect=(r"tokenizer\.json: " + expect + WHERE) if exit else expect, exit=exit)
    def _(fx, tmp):
        model = fx.model_dir(tmp) if char else fx.llama_model_dir(tmp)
        edit_json(model / "tokenizer.json", edit)
        return generate(fx, model)


def raw_case(name, edit_text, expect, char=False):
    """The same, editing the file's text (what a JSON value cannot say: a key given twice)."""
    @case("tokenizer.json: " + name, expect=r"tokenizer\.json: " + expect + WHERE)
    def _(fx, tmp):
        model = fx.model_dir(tmp) if char else fx.llama_model_dir(tmp)
        path = model / "tokenizer.json"
        text = json.dumps(json.loads(path.read_text()))
        new = edit_text(text)
        assert new != text, "the edit changed nothing"
        path.write_text(new)
        return generate(fx, model)


def vocab(fn):
    return lambda t: fn(t["model"]["vocab"])


def added(fn):
    return lambda t: fn(t["added_tokens"])


def model(fn):
    return lambda t: fn(t["model"])


# ---- added tokens whose id is another token's -----------------------------------------------
tok_case("an added token whose id collides with a vocab id (another text)",
         added(lambda a: a.append({"id": 256, "content": "<|tool|>", "special": True})),
         r"added_tokens\[3\]\.id: id 256 is '<\|tool\|>' there but model\.vocab\['he'\] has the same id")
tok_case("an added token's text changed under its vocab entry",
         added(lambda a: a[0].update(content="<|other|>")),
         r"added_tokens\[0\]\.id: id 297 is '<\|other\|>' there but model\.vocab\['<\|endoftext\|>'\] has the same id")
tok_case("two added tokens with one id", added(lambda a: a[1].update(id=297)),
         r"added_tokens: id 297 is used twice \(added_tokens\[0\] and \[1\]\)")
tok_case("added_tokens[1].id negative", added(lambda a: a[1].update(id=-1)),
         r"added_tokens\[1\]\.id is not an integer in \[0, 268435456\)")
tok_case("added_tokens[1].id 1.5", added(lambda a: a[1].update(id=1.5)), r"added_tokens\[1\]\.id is not an integer")
tok_case("added_tokens[1].id a string", added(lambda a: a[1].update(id="298")), r"added_tokens\[1\]\.id is not an integer")
tok_case("added_tokens[2].content empty", added(lambda a: a[2].update(content="")),
         r"added_tokens\[2\]\.content is not a non-empty string")
tok_case("added_tokens[2].content missing", added(lambda a: a[2].pop("content") and None), r"added_tokens\[2\]\.content is not")
tok_case("added_tokens[0].special \"yes\"", added(lambda a: a[0].update(special="yes")),
         r"added_tokens\[0\]\.special is not true or false")
tok_case("added_tokens[0].lstrip 1", added(lambda a: a[0].update(lstrip=1)), r"added_tokens\[0\]\.lstrip is not true or false")
tok_case("added_tokens is an object", lambda t: t.update(added_tokens={"a": 1}), r"added_tokens is not an array")


@case("tokenizer.json: more tokens than config.json's vocab_size",
      expect=r"model/tokenizer\.json has 302 tokens, more than vocab_size 300")
def _(fx, tmp):
    model = fx.llama_model_dir(tmp)
    edit_json(model / "tokenizer.json",
              added(lambda a: a.extend([{"id": 300, "content": "<|a|>"}, {"id": 301, "content": "<|b|>"}])))
    return generate(fx, model)


# ---- the vocab -------------------------------------------------------------------------------
tok_case("model.vocab is a list", model(lambda m: m.update(vocab=["a", "b"])), r"model\.vocab is missing or not an object")
tok_case("model.vocab missing", model(lambda m: m.pop("vocab") and None), r"model\.vocab is missing or not an object")
tok_case("model.vocab['he'] a string", vocab(lambda v: v.update(he="abc")),
         r"model\.vocab\['he'\] is not an integer id in \[0, 268435456\)")
tok_case("model.vocab['he'] negative", vocab(lambda v: v.update(he=-1)), r"model\.vocab\['he'\] is not an integer id")
tok_case("model.vocab['he'] 1.5", vocab(lambda v: v.update(he=256.5)), r"model\.vocab\['he'\] is not an integer id")
tok_case("model.vocab['he'] 2^40", vocab(lambda v: v.update(he=2 ** 40)), r"model\.vocab\['he'\] is not an integer id")
tok_case("model.vocab['he'] null", vocab(lambda v: v.update(he=None)), r"model\.vocab\['he'\] is not an integer id")
tok_case("two vocab tokens with one id", vocab(lambda v: v.update(he=257)), r"model\.vocab: id 257 is used by 'he' and 'do'")
tok_case("sparse ids", vocab(lambda v: v.update(he=100000000)), r"model\.vocab: the ids are sparse \(max id 100000000")
tok_case("an empty vocab token", vocab(lambda v: v.update({"": 300})), r"model\.vocab\[''\] \(id 300\) is an empty token")
tok_case("a vocab token outside the byte-level alphabet", vocab(lambda v: v.update({"\u20ac": 300})),
         r"model\.vocab\['\u20ac'\] \(id 300\) has a character outside the byte-level alphabet")
tok_case("a vocab key with a quote and a newline", vocab(lambda v: v.update({"a'\nb": "x"})),
         r"model\.vocab\['a\\'\\x0ab'\] is not an integer id")
raw_case("a vocab key given twice", lambda s: s.replace('"hello": 261', '"hello": 261, "hello": 300'),
         r"model\.vocab\['hello'\] appears twice \(ids 261 and 300\)")
raw_case("a vocab key with \\u0000 (would read as another token)", lambda s: s.replace('"hello": 261', '"he\\u0000llo": 261'),
         r"a string holds \\u0000 \(NUL\) at byte \d+")
raw_case("an added token with \\u0000", lambda s: s.replace('"<|im_end|>"', '"<|im_end|>\\u0000x"', 1),
         r"a string holds \\u0000 \(NUL\)")

# ---- merges ------------------------------------------------------------------------------------
tok_case("a merge of a token not in the vocab", model(lambda m: m["merges"].insert(0, "h zz")),
         r"model\.merges\[0\]: 'zz' is not in the vocab")
tok_case("a merge whose result is not in the vocab", model(lambda m: m["merges"].insert(1, "z z")),
         r"model\.merges\[1\]: 'z' \+ 'z' is not in the vocab")
tok_case("merges is an object", model(lambda m: m.update(merges={"h": "e"})), r"model\.merges is not an array")
tok_case("a merge of three parts", model(lambda m: m["merges"].insert(2, "h e l")), r"model\.merges\[2\] is not \"a b\"")
tok_case("a merge that is a number", model(lambda m: m["merges"].insert(0, 7)), r"model\.merges\[0\] is not \"a b\"")
tok_case("a merge pair with a number", model(lambda m: m["merges"].insert(0, ["h", 5])), r"model\.merges\[0\] is not")

# ---- the pipeline: parts lutra does not run must not change the ids ---------------------------
tok_case("model.type Unigram", model(lambda m: m.update(type="Unigram")), r"model\.type 'Unigram' is not supported")
tok_case("model.type WordPiece", model(lambda m: m.update(type="WordPiece")), r"model\.type 'WordPiece' is not supported")
tok_case("pre_tokenizer null behind a ByteLevel decoder", lambda t: t.update(pre_tokenizer=None),
         r"decoder: a ByteLevel decoder needs a ByteLevel pre_tokenizer")
tok_case("pre_tokenizer Whitespace", lambda t: t.update(pre_tokenizer={"type": "Whitespace"}),
         r"pre_tokenizer\.type 'Whitespace' is not supported")
tok_case("pre_tokenizer.add_prefix_space \"yes\"", lambda t: t["pre_tokenizer"].update(add_prefix_space="yes"),
         r"pre_tokenizer\.add_prefix_space is not true or false")
tok_case("pre_tokenizer.use_regex \"true\"", lambda t: t["pre_tokenizer"].update(use_regex="true"),
         r"pre_tokenizer\.use_regex is not true or false")
tok_case("a Split with an unknown regex",
         lambda t: t.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
             {"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated"},
             {"type": "ByteLevel", "use_regex": False}]}),
         r"pre_tokenizer\.pretokenizers\[0\]\.pattern: only the regexes of GPT-2, Llama 3 \(cl100k\) and Qwen2")
tok_case("decoder WordPiece", lambda t: t.update(decoder={"type": "WordPiece"}), r"decoder\.type 'WordPiece' is not supported")
tok_case("post_processor Mystery", lambda t: t.update(post_processor={"type": "Mystery"}), r"post_processor\.type 'Mystery'")
tok_case("model.dropout 0.1", model(lambda m: m.update(dropout=0.1)), r"model\.dropout is not supported")
tok_case("model.byte_fallback \"no\"", model(lambda m: m.update(byte_fallback="no")),
         r"model\.byte_fallback is not true or false")
tok_case("model.ignore_merges \"yes\"", model(lambda m: m.update(ignore_merges="yes")),
         r"model\.ignore_merges is not true or false")
tok_case("model.continuing_subword_prefix ##", model(lambda m: m.update(continuing_subword_prefix="##")),
         r"model\.continuing_subword_prefix is not supported")

# ---- components of the pipeline lutra does not run: refused by their JSON path ------------------
def seq(key, items):
    return {"type": "Sequence", key: items}


BL = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
for name, path, edit, expect in [
    ("normalizer Precompiled in a Sequence", "normalizer",
     seq("normalizers", [{"type": "NFC"}, {"type": "Precompiled", "precompiled_charsmap": "AAAA"}]),
     r"normalizer\.normalizers\[1\]\.type 'Precompiled' is not supported \(lutra supports NFC, NFD, NFKC, NFKD, "
     r"Lowercase, Prepend, Replace, Strip and Sequence\)"),
    ("normalizer BertNormalizer", "normalizer", {"type": "BertNormalizer"}, r"normalizer\.type 'BertNormalizer' is not"),
    ("normalizer StripAccents", "normalizer", {"type": "StripAccents"}, r"normalizer\.type 'StripAccents' is not"),
    ("normalizer Replace with a regex", "normalizer", {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
     r"normalizer\.pattern\.Regex ' \{2,\}' is not supported \(only a String pattern\)"),
    ("normalizer Prepend without its string", "normalizer", {"type": "Prepend"}, r"normalizer\.prepend is not a non-empty string"),
    ("normalizer Strip with strip_left 1", "normalizer", {"type": "Strip", "strip_left": 1},
     r"normalizer\.strip_left is not true or false"),
    ("pre_tokenizer Whitespace in a Sequence", "pre_tokenizer", seq("pretokenizers", [{"type": "Whitespace"}, BL]),
     r"pre_tokenizer\.pretokenizers\[0\]\.type 'Whitespace' is not supported \(lutra supports ByteLevel, Split, "
     r"Metaspace, Digits and Sequence\)"),
    ("pre_tokenizer Punctuation", "pre_tokenizer", seq("pretokenizers", [BL, {"type": "Punctuation"}]),
     r"pre_tokenizer\.pretokenizers\[1\]\.type 'Punctuation' is not supported"),
    ("pre_tokenizer UnicodeScripts", "pre_tokenizer", {"type": "UnicodeScripts"}, r"pre_tokenizer\.type 'UnicodeScripts'"),
    ("a Split with behavior Removed", "pre_tokenizer",
     seq("pretokenizers", [{"type": "Split", "pattern": {"Regex": "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},
                            "behavior": "Removed"}, dict(BL, use_regex=False)]),
     r"pre_tokenizer\.pretokenizers\[0\]: only behavior 'Isolated' without invert is supported"),
    ("Metaspace prepend_scheme sometimes", "pre_tokenizer",
     seq("pretokenizers", [{"type": "Metaspace", "replacement": "_", "prepend_scheme": "sometimes"}, BL]),
     r"pre_tokenizer\.pretokenizers\[0\]\.prepend_scheme is not \"always\", \"first\" or \"never\""),
    ("Metaspace without its replacement", "pre_tokenizer", seq("pretokenizers", [{"type": "Metaspace"}, BL]),
     r"pre_tokenizer\.pretokenizers\[0\]\.replacement is not a non-empty string"),
    ("decoder CTC in a Sequence", "decoder", seq("decoders", [{"type": "ByteLevel"}, {"type": "CTC"}]),
     r"decoder\.decoders\[1\]\.type 'CTC' is not supported \(lutra supports ByteLevel, ByteFallback, Fuse, Replace, "
     r"Strip, Metaspace and Sequence\)"),
    ("decoder BPEDecoder", "decoder", {"type": "BPEDecoder"}, r"decoder\.type 'BPEDecoder' is not supported"),
    ("decoder Strip with start -1", "decoder", {"type": "Strip", "content": " ", "start": -1, "stop": 0},
     r"decoder: start and stop are not counts"),
    ("post_processor RobertaProcessing", "post_processor", {"type": "RobertaProcessing"},
     r"post_processor\.type 'RobertaProcessing' is not supported \(lutra supports ByteLevel, TemplateProcessing and "
     r"Sequence\)"),
    ("post_processor BertProcessing in a Sequence", "post_processor",
     seq("processors", [{"type": "ByteLevel"}, {"type": "BertProcessing"}]),
     r"post_processor\.processors\[1\]\.type 'BertProcessing' is not supported"),
    ("TemplateProcessing naming a special token it does not list", "post_processor",
     {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                              {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [], "special_tokens": {}},
     r"post_processor\.single\[0\] is not a Sequence A/B or a SpecialToken of special_tokens"),
    ("TemplateProcessing with an id past the vocab", "post_processor",
     {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}], "pair": [],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [300], "tokens": ["<s>"]}}},
     r"post_processor\.special_tokens\['<s>'\]\.ids\[0\] is not an id of the vocab"),
    ("two TemplateProcessing", "post_processor",
     seq("processors", [{"type": "TemplateProcessing", "single": [], "pair": [], "special_tokens": {}}] * 2),
     r"post_processor\.processors\[1\]: a second TemplateProcessing is not supported"),
]:
    tok_case(name, (lambda p, e: lambda t: t.update({p: e}))(path, edit), expect)
tok_case("model.fuse_unk \"yes\"", model(lambda m: m.update(fuse_unk="yes")), r"model\.fuse_unk is not true or false")

# ---- the document --------------------------------------------------------------------------------
tok_case("the top level is a list", lambda t: [t], r"the top level is not an object")
tok_case("no model", lambda t: t.pop("model") and None, r"no \"model\" object")


@case("tokenizer.json: truncated", expect=r"tokenizer\.json: not valid JSON \(truncated or corrupt\) near byte \d+" + WHERE)
def _(fx, tmp):
    model = fx.llama_model_dir(tmp)
    path = model / "tokenizer.json"
    path.write_bytes(path.read_bytes()[:1000])
    return generate(fx, model)


@case("tokenizer.json: empty", expect=r"tokenizer\.json: the text is empty" + WHERE)
def _(fx, tmp):
    model = fx.llama_model_dir(tmp)
    (model / "tokenizer.json").write_bytes(b"")
    return generate(fx, model)


# ---- lutra's char format --------------------------------------------------------------------------
tok_case("char: codepoints not sorted", lambda t: t["codepoints"].reverse(), r"codepoints: char tokenizer: code points are not sorted and distinct", char=True)
tok_case("char: a codepoint past Unicode", lambda t: t["codepoints"].append(2 ** 40), r"codepoints\[28\] is not a code point",
         char=True)
tok_case("char: lutra_tokenizer version 2", lambda t: t.update(lutra_tokenizer=2), r"lutra_tokenizer: unknown version",
         char=True)
tok_case("char: an added token's id out of order", lambda t: t["added_tokens"][0].update(id=40),
         r"added_tokens: id 40 should be 28 \(after the chars\)", char=True)
tok_case("char: added_tokens[1].special \"no\"", lambda t: t["added_tokens"][1].update(special="no"),
         r"added_tokens\[1\]\.special is not true or false", char=True)
