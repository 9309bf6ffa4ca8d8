#!/usr/bin/env python3
"""Writes tests/hf/fixtures/tokenizers: small tokenizer.json files of each kind the model families
ship, trained with Hugging Face's `tokenizers` on a generated corpus, and what the library gives
for >= 1000 varied strings each.

    python gen_tokenizers.py OUTDIR                        (tests/hf/regen.sh tokenizers)
    python gen_tokenizers.py --check-lutra LUTRA_BIN DIR   lutra saves each kind, tokenizers reads it

--check-lutra: lutra loads each DIR/<kind>.json and saves it again (tok:save); the tokenizers library
loads lutra's file and encodes every case text of DIR/<kind>.cases.jsonl, with and without special
tokens; the ids must equal the fixture's (what the library gave for its own file). Prints the
strings matched per kind; exits 1 on any difference.

Per kind, OUTDIR/<kind>.json is the tokenizer and OUTDIR/<kind>.cases.jsonl holds one case a line:
  t  the text
  a  the ids of encode(t) (add_special_tokens=True, the library's default)
  b  the ids of encode(t, add_special_tokens=False), absent when equal to a without its first `lead`
     ids (kinds.json: how many special ids the post-processor puts before the text)
  o  the offsets of a in bytes of t's UTF-8 (the library gives them in characters of the Python
     str; converted here), as differences to keep the files small: start0, end0 - start0,
     start1 - end0, end1 - start1, ... (each value minus the one before it)
  d  decode(ids without specials, skip_special_tokens=False), absent when equal to t
  s  decode(the same ids, skip_special_tokens=True), absent when equal to d (or t)
For the kinds of PAIR_KINDS, OUTDIR/<kind>.pairs.jsonl: encode(t, u) of pairs of strings, a and o as
above (each id's offsets index its own string, t's or u's).
Kinds (kinds.json lists them): gpt2 (byte-level), llama3 (Split regex + ByteLevel + TemplateProcessing BOS, ignore_merges),
qwen2 (NFC + Split + ByteLevel), llama2 (Prepend + Replace normalizer, BPE byte_fallback, ByteFallback
+ Fuse + Strip decoders, BOS), mistral (Metaspace prepend_scheme first), smollm2 (Digits + ByteLevel),
nfkc_lower (NFKC + Lowercase, Metaspace split, Metaspace decoder), nfd_strip (NFD + Strip, Digits runs + ByteLevel with a prefix space),
added (added tokens with lstrip, rstrip, single_word and normalized behind a Lowercase normalizer),
unk_fused (no byte fallback: a run of characters outside the vocab is one <unk>, Metaspace split).
Deterministic: fixed seeds, the versions of requirements.txt.
"""
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                  r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
N_CASES = 1000
N_PAIRS = 100
PAIR_KINDS = ["gpt2", "llama3", "llama2", "nfd_strip"]

WORDS = ("the of and to in is was he for it with as his on be at by I had not are but from or have an they which "
         "one you were her all she there would their we him been has when who will more no if out so said what up its "
         "about into than them can only other new some could time these two may then do first any my now such like our "
         "over man me even most made after also did many before must through back years where much your way well down "
         "should because each just those people Mr how too little state good very make world still own see men work long "
         "get here between both life being under never day same another know while last might us great old year off "
         "come since against go came right used take three Hello World Python tokenizer Citizen Speak resolved famish "
         "don't we're it's they've I'll you'd I'm HELLO Über naïve café résumé façade jalapeño Ελληνικά кириллица "
         "Straße İstanbul ΣΊΣΥΦΟΣ").split()
ACCENTED = ["café", "cafe\u0301", "naïve", "nai\u0308ve", "résumé", "re\u0301sume\u0301", "Å", "A\u030a", "ñ", "n\u0303",
            "ế", "e\u0302\u0301", "ệ", "e\u0323\u0302", "ǖ", "u\u0308\u0304", "q\u0307\u0323", "ḍ\u0307", "Ω", "Ω",
            "한국어", "\u1100\u1161\u11a8", "각", "ά", "ά"]
CJK = ["中文字符", "日本語", "漢字かな交じり文", "你好，世界", "東京タワー", "한국어", "ｶﾀｶﾅ", "々〆〤", "𠀀𠀁"]
EMOJI = ["🙂", "🚀", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🏳️\u200d🌈", "🇫🇷", "🇯🇵", "❤️", "🧑🏿\u200d💻", "☕", "1️⃣", "🫠"]
COMPAT = ["ﬁ", "ﬂ", "①", "②", "ｆｕｌｌ", "Ｗｉｄｅ", "㎏", "²", "½", "Ⅻ", "ℌ", "™", "…", "ǅ", "ｱｲｳ", "ＡＢＣ１２３",
          "\u00a0", "\u2009", "\u3000", "Ⓐ", "㍻", "ﷺ", "ﬀ", "ſt"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n ", "\n\n\n", "    ", " \t ", "\u00a0", "\u3000",
          "\u2028", "\u200b"]
DIGITS = ["0", "7", "42", "123", "2024", "3.14159", "1,000,000", "007", "١٢٣", "٤٥", "९८", "12345678", "x2", "v1.2.3"]
PUNCT = [".", ",", "!", "?", "...", "'", "''", "'s", "'S", "'ll", "\"", "(", ")", "[", "]", "{}", "#", "@", "$", "%",
         "—", "–", "“", "”", "‘", "’", "«", "»", "::", "->", "=>", "**", "__", "_", "<", ">", "/", "\\", "`"]


def corpus(seed, n):
    """n lines of generated text in several scripts, fixed seed."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(4, 16)):
            r = rng.random()
            pool = WORDS if r < 0.6 else ACCENTED if r < 0.68 else CJK if r < 0.73 else DIGITS if r < 0.8 else PUNCT \
                if r < 0.9 else SPACES if r < 0.95 else EMOJI
            parts.append(rng.choice(pool))
            parts.append(" " if rng.random() < 0.8 else "")
        lines.append("".join(parts))
    return lines


def strings(seed, specials, n=N_CASES):
    """n varied strings: words, accents (precomposed and combining), CJK, emoji with ZWJ, runs of spaces,
    tabs and newlines, digits, punctuation, compatibility characters, the tokenizer's special tokens."""
    rng = random.Random(seed)
    fixed = ["", " ", "  ", "\n", "Hello world", " Hello world", "Hello  world ", "hello\n\nworld\n", "\t\tindented",
             "naïve café", "nai\u0308ve cafe\u0301", "ﬁne ①②③ ｆｕｌｌ ㎏", "İstanbul ΣΊΣΥΦΟΣ Straße",
             "👨\u200d👩\u200d👧\u200d👦 family", "1234567890", "a1b2c3", "I'm sure it's they've we'll", "中文字符 日本語",
             "x" * 200, " " * 20, "\n" * 10 + "end"] + [s for s in specials] + ["a" + s + "b" for s in specials] + \
            [" " + s + " x" for s in specials] + [s + s for s in specials]
    out = list(fixed)
    pools = [WORDS] * 6 + [ACCENTED, CJK, EMOJI, COMPAT, SPACES, SPACES, DIGITS, PUNCT, PUNCT]
    while len(out) < n:
        parts = []
        for _ in range(rng.randint(1, 5)):
            if specials and rng.random() < 0.06:
                parts.append(rng.choice(specials))
            else:
                parts.append(rng.choice(rng.choice(pools)))
            if rng.random() < 0.6:
                parts.append(rng.choice([" ", " ", " ", "", "\n", "  "]))
        s = "".join(parts)
        if rng.random() < 0.1:
            s = s.upper()
        out.append(s)
    return out


def byte_offsets(text, offsets):
    """Character offsets of a Python str -> byte offsets of its UTF-8."""
    pos = [0]
    for ch in text:
        pos.append(pos[-1] + len(ch.encode("utf-8")))
    return [v for s, e in offsets for v in (pos[s], pos[e])]


def deltas(flat):
    """[v0, v1, v2, ...] -> [v0, v1 - v0, v2 - v1, ...]"""
    return [v - (flat[i - 1] if i else 0) for i, v in enumerate(flat)]


def write(outdir, kind, tok, specials, seed):
    """Writes the tokenizer and its cases; returns lead (see the head of this file)."""
    tok.save(os.path.join(outdir, kind + ".json"))
    tok = Tokenizer.from_file(os.path.join(outdir, kind + ".json"))  # what lutra reads
    lead = len(tok.encode("x").ids) - len(tok.encode("x", add_special_tokens=False).ids)
    with open(os.path.join(outdir, kind + ".cases.jsonl"), "w", encoding="utf-8") as f:
        for text in strings(seed, specials):
            enc = tok.encode(text)
            plain = tok.encode(text, add_special_tokens=False).ids
            case = {"t": text, "a": enc.ids, "o": deltas(byte_offsets(text, enc.offsets))}
            if plain != enc.ids[lead:]:
                case["b"] = plain
            dec = tok.decode(plain, skip_special_tokens=False)
            if dec != text:
                case["d"] = dec
            skipped = tok.decode(plain, skip_special_tokens=True)
            if skipped != dec:
                case["s"] = skipped
            f.write(json.dumps(case, ensure_ascii=False, separators=(",", ":")) + "\n")
    if kind in PAIR_KINDS:
        texts = strings(seed + 1000, specials, N_PAIRS * 2)[-2 * N_PAIRS:]
        with open(os.path.join(outdir, kind + ".pairs.jsonl"), "w", encoding="utf-8") as f:
            for t, u in zip(texts[0::2], texts[1::2]):
                enc = tok.encode(t, u)
                n_a = sum(1 for s in enc.sequence_ids if s == 0)
                offs = byte_offsets(t, [o for o, q in zip(enc.offsets, enc.sequence_ids) if q != 1])
                offs_u = byte_offsets(u, [o for o, q in zip(enc.offsets, enc.sequence_ids) if q == 1])
                o, iu, ia = [], 0, 0  # back in the order of the ids
                for q in enc.sequence_ids:
                    if q == 1:
                        o += offs_u[2 * iu:2 * iu + 2]
                        iu += 1
                    else:
                        o += offs[2 * ia:2 * ia + 2]
                        ia += 1
                assert n_a + iu <= len(enc.ids)
                case = {"t": t, "u": u, "a": enc.ids, "o": deltas(o)}
                f.write(json.dumps(case, ensure_ascii=False, separators=(",", ":")) + "\n")
    return lead


def train(tok, vocab, specials, seed, latin_only=False, initial_alphabet=()):
    """latin_only: the corpus without characters past U+02FF, so that the others fall back to bytes.
    (The trainer's limit_alphabet breaks ties between characters in no fixed order.)"""
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=list(initial_alphabet))
    lines = corpus(seed, 3000)
    if latin_only:
        lines = ["".join(ch for ch in line if ord(ch) <= 0x2FF) for line in lines]
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


def byte_level_bpe(pre, specials, seed, vocab=520, ignore_merges=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    return train(tok, vocab, specials, seed, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


def split_byte_level(pattern):
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def sentencepiece_bpe(specials, seed, vocab=420, byte_fallback=True):
    """A sentencepiece-style BPE: trained behind a Metaspace pre-tokenizer, then rebuilt with <unk>, <s>,
    </s>, the 256 <0xXX> byte tokens first (as Llama 2's; not without byte_fallback: characters
    outside the vocab are then <unk>, one for a run of them) and byte_fallback, unk and fuse_unk."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    train(tok, vocab, [], seed, latin_only=True)
    model = json.loads(tok.to_str())["model"]
    vocab_items = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    new_vocab = {s: i for i, s in enumerate(specials)}
    for b in range(256 if byte_fallback else 0):
        new_vocab["<0x%02X>" % b] = len(new_vocab)
    for s, _ in vocab_items:
        if s not in new_vocab:
            new_vocab[s] = len(new_vocab)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    out = Tokenizer(models.BPE(new_vocab, merges, unk_token=specials[0], fuse_unk=True, byte_fallback=byte_fallback))
    out.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return out


def sp_decoder():
    return decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                              decoders.Strip(" ", 1, 0)])


def bos_template(bos, bos_id):
    return processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)])


def build(kind):
    if kind == "gpt2":
        specials = ["<|endoftext|>"]
        tok = byte_level_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False), specials, 1)
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
        return tok, specials
    if kind == "llama3":
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
        tok = byte_level_bpe(split_byte_level(LLAMA3_PATTERN), specials, 2, ignore_merges=True)
        tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False),
                                                  bos_template("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
        return tok, specials
    if kind == "qwen2":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tok = byte_level_bpe(split_byte_level(QWEN2_PATTERN), specials, 3)
        tok.normalizer = normalizers.NFC()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        return tok, specials
    if kind == "smollm2":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        pre = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                       pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        tok = byte_level_bpe(pre, specials, 4)
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
        return tok, specials
    if kind == "llama2":
        specials = ["<unk>", "<s>", "</s>"]
        tok = sentencepiece_bpe(specials, 5)
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = sp_decoder()
        tok.post_processor = bos_template("<s>", 1)
        return tok, specials
    if kind == "mistral":
        specials = ["<unk>", "<s>", "</s>"]
        tok = sentencepiece_bpe(specials, 6)
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = sp_decoder()
        tok.post_processor = bos_template("<s>", 1)
        return tok, specials
    if kind == "unk_fused":
        specials = ["<unk>", "<s>", "</s>"]
        tok = sentencepiece_bpe(specials, 10, byte_fallback=False)
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        return tok, specials
    if kind == "nfkc_lower":
        specials = ["<unk>", "<s>", "</s>"]
        tok = sentencepiece_bpe(specials, 7)
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        tok.decoder = decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="always"),
                                         decoders.ByteFallback(), decoders.Fuse()])
        return tok, specials
    if kind == "nfd_strip":
        specials = ["<|endoftext|>"]
        pre = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=False),
                                       pre_tokenizers.ByteLevel(add_prefix_space=True)])
        tok = byte_level_bpe(pre, specials, 8)
        tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Strip()])
        tok.post_processor = processors.ByteLevel(trim_offsets=True, add_prefix_space=True)
        return tok, specials
    if kind == "added":
        specials = ["<|endoftext|>"]
        tok = byte_level_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False), specials, 9)
        tok.normalizer = normalizers.Lowercase()
        tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
        tok.add_tokens([AddedToken("[R]", rstrip=True, normalized=False), AddedToken("the", single_word=True),
                        AddedToken("Hello", normalized=True), AddedToken("WORLD", normalized=False),
                        AddedToken("<both>", lstrip=True, rstrip=True, normalized=False),
                        AddedToken("__", single_word=True, normalized=False)])
        return tok, ["<|endoftext|>", "<mask>", "[R]", "the", "Hello", "WORLD", "<both>", "__", "HELLO", "World"]
    raise ValueError(kind)


KINDS = ["gpt2", "llama3", "qwen2", "smollm2", "llama2", "mistral", "nfkc_lower", "nfd_strip", "added", "unk_fused"]


def undiff(b, lead, a):
    return b if b is not None else a[lead:]


def check_lutra(lutra, fixdir):
    import subprocess
    import tempfile
    kinds = json.load(open(os.path.join(fixdir, "kinds.json")))
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for kind, info in kinds.items():
            saved = os.path.join(tmp, kind + ".json")
            script = ('local tok = require("lutra.tokenizer").load(%s); tok:save(%s)'
                      % (json.dumps(os.path.join(fixdir, kind + ".json")), json.dumps(saved)))
            subprocess.run([lutra, "-e", script], check=True)
            tok = Tokenizer.from_file(saved)
            cases = [json.loads(line) for line in open(os.path.join(fixdir, kind + ".cases.jsonl"), encoding="utf-8")]
            same = 0
            for c in cases:
                with_sp = tok.encode(c["t"]).ids
                without = tok.encode(c["t"], add_special_tokens=False).ids
                same += with_sp == c["a"] and without == undiff(c.get("b"), info["lead"], c["a"])
            bad += len(cases) - same
            print("%-11s lutra's save read by tokenizers: ids %d/%d" % (kind, same, len(cases)))
    sys.exit(1 if bad else 0)


def main():
    if sys.argv[1] == "--check-lutra":
        check_lutra(sys.argv[2], sys.argv[3])
        return
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    kinds = {}
    for i, kind in enumerate(KINDS):
        tok, specials = build(kind)
        kinds[kind] = {"lead": write(outdir, kind, tok, specials, 100 + i)}
        print(kind, tok.get_vocab_size())
    with open(os.path.join(outdir, "kinds.json"), "w") as f:
        json.dump(kinds, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
