#!/usr/bin/env python3
"""Writes the tokenizer fixtures of tests/data with Hugging Face's `tokenizers` library.

    pip install tokenizers && python3 tests/data/gen_tokenizer_fixture.py

Outputs (committed, so that the tests need no Python):
  tokenizer_hf_bytelevel.json  ByteLevel BPE as the library trains and saves it: special
                               tokens first (ids 0, 1), merges as [a, b] arrays.
  tokenizer_hf_sequence.json   the same model behind Sequence[Split(GPT-2 regex),
                               ByteLevel(use_regex=false)], merges rewritten as "a b" strings
                               (the older format), plus a non-special added token.
  tokenizer_hf_prefix.json     ByteLevel(add_prefix_space=true), an lstrip/rstrip special token
                               as RoBERTa's <mask>, an rstrip one and a single_word added token.
  tokenizer_hf_llama3.json     Sequence[Split(Llama 3's regex), ByteLevel] and ignore_merges.
  tokenizer_hf_qwen2_prefix.json  Qwen2's regex, ByteLevel(add_prefix_space=true): a space before
                               every word.
  tokenizer_hf_expected.txt    one line per (file, text): file, the text in hex, the ids the
                               library gives (comma-separated).
"""
import json
import os

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                  r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")

CORPUS = [
    "First Citizen: Before we proceed any further, hear me speak.",
    "All: Speak, speak. You are all resolved rather to die than to famish?",
    "We're sure it's the 2nd time they've said I'll go, and you'd know I'm right.",
    "Numbers 12345 and 3.14159 and 1,000,000 in 2024; tabs\tand   spaces   everywhere.\n\n",
    "Unicode: café naïve résumé Ελληνικά кириллица 中文字符 日本語 한국어 ١٢٣ ½ ².",
    "Emoji 🙂🚀 and symbols ©®™ — “quotes” ‘single’ … «guillemets»",
    "Whitespace: non\u00a0breaking, ideographic\u3000space, line\u2028separator, trailing   \n",
    "<|endoftext|> marks documents; code: def f(x): return x**2 + 1  # comment\n",
]


def corpus_lines():
    for i in range(60):
        for j, line in enumerate(CORPUS):
            yield line if (i + j) % 3 else line.upper()


TEXTS = [
    "Hello world",
    "We're sure it's the 2nd time they've said I'll go, and you'd know I'm right.",
    "  leading spaces and trailing   ",
    "line one\nline two\n\n\tindented\r\n",
    "café naïve Ελληνικά 中文字符 ١٢٣ ½²",
    "Emoji 🙂🚀 mixed with text🙂text",
    "non\u00a0breaking ideographic\u3000space line\u2028sep",
    "first<|endoftext|>second<|endoftext|><|endoftext|>third",
    "tricky '''s 'S 'Ll x'x''re ' s",
    "numbers 12345 3.14159 1,000,000 a1b2c3",
    "unseen: zqxj ЖЖЖ ꙮ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "a <mask> b <mask>c d<mask> e",
    "added word: lutra lutra's lutrae",
    "CAPS WE'RE HE'S THEY'LL I'M x'Ve 1234567 12 (word) ((x)) \r\n\r\n  y\n\n\n z \t\n",
    "Unicode 16 letters \u1c89\u1c8a\U000105c0 and separators x\x1cy\x1fz \x85next\u2029",
    "lut lutra xlut lut. _lut lut_ \u00e9lut 1lut lut1 (lut)",
    "a\u3000<mask>b a\u00a0\u00a0<mask>\u3000 b x [R]\u3000\t y[R]z",
    "0987654321",  # with a prefix space per word: more ids than bytes
    "7",
    "",
    "   ",
    "\n",
]


def train(pre_tokenizer, specials, **bpe):
    tok = Tokenizer(models.BPE(**bpe))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    return tok


def main():
    out = {}
    plain = train(pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>", "<|pad|>"])
    out["tokenizer_hf_bytelevel.json"] = plain

    seq = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GPT2_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), ["<|endoftext|>"])
    seq.add_tokens(["lutra"])
    out["tokenizer_hf_sequence.json"] = seq

    prefix = train(pre_tokenizers.ByteLevel(add_prefix_space=True), ["<|endoftext|>"])
    prefix.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, special=True),
                               AddedToken("[R]", rstrip=True, special=True)])
    prefix.add_tokens([AddedToken("lut", single_word=True)])
    out["tokenizer_hf_prefix.json"] = prefix

    llama = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), ["<|begin_of_text|>"], ignore_merges=True)
    out["tokenizer_hf_llama3.json"] = llama

    qwen = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False)]), ["<|im_start|>"])
    out["tokenizer_hf_qwen2_prefix.json"] = qwen

    lines = []
    for name, tok in out.items():
        path = os.path.join(HERE, name)
        tok.save(path)
        if name == "tokenizer_hf_sequence.json":  # the older merges format, "a b"
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            data["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in data["model"]["merges"]]
            with open(path, "w", encoding="utf-8") as f:
                json.dump(data, f, ensure_ascii=False, indent=2)
        tok = Tokenizer.from_file(path)  # the ids of the file as written
        for text in TEXTS:
            ids = tok.encode(text, add_special_tokens=False).ids
            assert tok.decode(ids, skip_special_tokens=False) == text or "prefix" in name, (name, text)
            lines.append(f"{name} {text.encode().hex() or '-'} {','.join(map(str, ids)) or '-'}")
    with open(os.path.join(HERE, "tokenizer_hf_expected.txt"), "w") as f:
        f.write(f"# written by gen_tokenizer_fixture.py with tokenizers {tokenizers.__version__}\n")
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
