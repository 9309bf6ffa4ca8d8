"""Token files and the caches of the data: a damaged cache is verified when reused and tokenized
again (saying why), a damaged token file named directly is an error naming it (and the offset of
the first bad id), and nothing is written beside the user's text (a read-only data folder works)."""
import os
import struct
import subprocess
from pathlib import Path

from badinput import case

HEADER = 128


def fnv1a(data, h=0xcbf29ce484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def tokenized_run(fx, tmp, *extra):
    """Trains the small model one step (tmp/run), which leaves the corpus's token file in
    tmp/run/cache; returns its path."""
    fx.corpus(tmp)
    cmd = fx.pretrain(tmp / "run", *extra, steps=1)
    p = subprocess.run([str(a) for a in cmd], cwd=tmp, capture_output=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError("first run: %s" % (p.stdout + p.stderr).decode(errors="replace")[-2000:])
    bins = sorted((tmp / "run" / "cache").glob("*.tok-*.bin"))
    if len(bins) != 1:
        raise RuntimeError("expected one token file in run/cache, found %s" % bins)
    return bins[0]


def damage(path, fn, keep_mtime=True):
    """Rewrites the file at path with fn(bytearray) (same modification time unless told)."""
    st = os.stat(path)
    data = bytearray(Path(path).read_bytes())
    out = fn(data)
    Path(path).write_bytes(bytes(data if out is None else out))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def rehash(data):
    """The header's tokens hash (offset 40) recomputed over the tokens: a file consistent in itself."""
    data[40:48] = struct.pack("<Q", fnv1a(data[HEADER:]))
    return data


def put_u16(data, index, value):
    data[HEADER + 2 * index:HEADER + 2 * index + 2] = struct.pack("<H", value)


def tokens_rewritten(tmp):
    """check: the cache holds sane tokens again (not zeros, no 0xFFFF)."""
    bins = list((Path(tmp) / "run" / "cache").glob("*.tok-*.bin"))
    data = bins[0].read_bytes()[HEADER:] if bins else b""
    if not data or data.count(0) == len(data) or b"\xff\xff" in data:
        return "the token file was not tokenized again"
    return None


# ---- a damaged cache: verified when reused, tokenized again (saying why) ----------------------

def cache_case(name, fn, expect, keep_mtime=True):
    # (stdout, where the run reports, comes before stderr, where the cache's damage is said)
    @case("cache: " + name, expect=r"(?=.*trained 1 steps).*" + expect + r".*tokenizing .*corpus\.txt again", exit=0,
          check=tokens_rewritten)
    def _(fx, tmp):
        damage(tokenized_run(fx, tmp), fn, keep_mtime)
        return fx.pretrain(tmp / "run", steps=1)


def zero_tokens(d):
    d[HEADER:] = bytes(len(d) - HEADER)


def ffff_at_5_rehashed(d):
    put_u16(d, 5, 0xFFFF)
    rehash(d)


def ffff_at_5(d):
    put_u16(d, 5, 0xFFFF)


cache_case("data zeroed, size, header and mtime intact (the issue's case)", zero_tokens,
           r"run/cache/corpus\.txt-[0-9a-f]+\.tok-[0-9a-f]+\.bin': the tokens checksum is [0-9a-f]+, the header says")
cache_case("an id 0xFFFF with the hash recomputed", ffff_at_5_rehashed,
           r"\.tok-[0-9a-f]+\.bin': token 5 \(byte offset 138\) is 65535, "
           r"outside the vocabulary \[0, \d+\) of the header")
cache_case("an id 0xFFFF", ffff_at_5, r"token 5 \(byte offset 138\) is 65535.*checksum differs")
cache_case("one token flipped", lambda d: put_u16(d, 40, (d[HEADER + 80] ^ 1)),
           r"\.bin': (the tokens checksum|token 40)")
cache_case("cut short by one byte", lambda d: d[:-1], r"\.bin': truncated: the header says \d+ tokens")
cache_case("one byte too many", lambda d: d + b"\0", r"\.bin': size mismatch")
cache_case("the magic overwritten", lambda d: d.__setitem__(slice(0, 8), b"GARBAGE!"), r"not a lutra token file")
cache_case("the header's vocab_size edited", lambda d: d.__setitem__(slice(24, 32), struct.pack("<Q", 300)),
           r"the header's vocab_size 300 is not the tokenizer's \d+")
cache_case("a reserved header byte set", lambda d: d.__setitem__(100, 7), r"corrupt header: byte 100 is 7")
cache_case("an empty file", lambda d: b"", r"\.bin': 0 bytes, shorter than the 128-byte token file header")


@case("cache: a directory where the token file goes", expect=r"run/cache/corpus\.txt-[0-9a-f]+\.tok-[0-9a-f]+\.bin")
def _(fx, tmp):
    path = tokenized_run(fx, tmp)
    path.unlink()
    path.mkdir()
    return fx.pretrain(tmp / "run", steps=1)


@case("cache: the text changed after tokenizing: tokenized again, silently (documented)", exit=0,
      expect=r"^(?!.*tokenizing).*trained 1 steps")
def _(fx, tmp):
    tokenized_run(fx, tmp)
    with open(tmp / "data" / "corpus.txt", "a") as f:
        f.write("a zebra line\n")
    return fx.pretrain(tmp / "run", steps=1)


# ---- never beside the user's text -----------------------------------------------------------

def data_dir_unchanged(tmp):
    names = sorted(os.listdir(Path(tmp) / "data"))
    return None if names == ["corpus.txt"] else "the data folder holds %s" % names


@case("a read-only data folder: pretrain runs, writes nothing beside the text", exit=0,
      expect=r"trained 4 steps", check=data_dir_unchanged)
def _(fx, tmp):
    fx.corpus(tmp)
    os.chmod(tmp / "data", 0o555)
    return fx.pretrain(tmp / "run")


@case("--cache_dir: the tokenizer and token file go there", exit=0, expect=r"trained 1 steps",
      check=lambda tmp: data_dir_unchanged(tmp) or (
          None if len(list((Path(tmp) / "elsewhere").glob("corpus.txt-*"))) == 2 else "no cache in elsewhere/"))
def _(fx, tmp):
    fx.corpus(tmp)
    return fx.pretrain(tmp / "run", "--cache_dir=%s" % (tmp / "elsewhere"), steps=1)


@case("--cache_dir that cannot be made (a file in the way)", expect=r"cannot create the cache directory .*afile/sub")
def _(fx, tmp):
    fx.corpus(tmp)
    (tmp / "afile").write_text("x")
    return fx.pretrain(tmp / "run", "--cache_dir=%s" % (tmp / "afile" / "sub"), steps=1)


@case("a resumed run whose cache was zeroed: tokenized again, resumes", exit=0,
      expect=r"(?=.*resumed from .*step_000002 at step 2).*checksum.*tokenizing .*again", check=tokens_rewritten)
def _(fx, tmp):
    path = tokenized_run(fx, tmp, "--ckpt_every=2")
    p = subprocess.run([str(a) for a in fx.pretrain(tmp / "run", steps=2)], cwd=tmp, capture_output=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.decode(errors="replace"))
    damage(path, zero_tokens)
    return fx.pretrain(tmp / "run", "--resume=auto", steps=3)


# ---- a token file named directly (lt.data.tokens): an error naming it --------------------------

LOADER = """local lt = require "lutra"
local L = lt.data.tokens(arg[1], {seq_len = 8, batch = 2, vocab_size = tonumber(arg[2])})
print("loaded " .. L.path .. ": " .. L.ntokens .. " train tokens")
"""


def token_file(ids, vocab, width=2):
    data = struct.pack("<%d%s" % (len(ids), "H" if width == 2 else "I"), *ids)
    src = b"some text"
    head = b"LUTRATOK" + struct.pack("<IIqqQQqQq", 1, width, len(ids), vocab, 0x1234, fnv1a(data), len(src),
                                     fnv1a(src), 1700000000000000000)
    return bytearray(head + bytes(HEADER - len(head)) + data)


def direct_case(name, fn, expect, vocab_arg=None, exit=1):
    @case("token file: " + name, expect=expect, exit=exit)
    def _(fx, tmp):
        good = token_file([i % 40 for i in range(200)], 40)
        out = fn(good)
        (tmp / "tokens.bin").write_bytes(bytes(good if out is None else out))
        (tmp / "load.lua").write_text(LOADER)
        return fx.lutra_cmd(tmp / "load.lua", tmp / "tokens.bin", *([vocab_arg] if vocab_arg else []))


direct_case("ids 0xFFFF (the issue's case)", lambda d: (put_u16(d, 17, 0xFFFF), rehash(d))[1],
            r"tokens\.bin': token 17 \(byte offset 162\) is 65535, outside the vocabulary \[0, 40\) of the header")
direct_case("ids 0xFFFF in a file of vocab 65536, against the model's 40",
            lambda d: (d.__setitem__(slice(24, 32), struct.pack("<Q", 65536)), put_u16(d, 9, 0xFFFF), rehash(d))[2],
            r"tokens\.bin': token 9 \(byte offset 146\) is 65535, outside the vocabulary \[0, 40\) of the tokenizer",
            vocab_arg="40")
direct_case("the same file without the model's vocabulary loads (documented)",
            lambda d: (d.__setitem__(slice(24, 32), struct.pack("<Q", 65536)), put_u16(d, 9, 0xFFFF), rehash(d))[2],
            r"loaded .*tokens\.bin: 180 train tokens", exit=0)
direct_case("tokens zeroed", zero_tokens, r"tokens\.bin': the tokens checksum is [0-9a-f]+, the header says")
direct_case("cut short", lambda d: d[:-3], r"tokens\.bin': truncated: the header says 200 tokens of 2 bytes")
direct_case("a text file", lambda d: b"hello world, not tokens\n" * 10, r"tokens\.bin': not a lutra token file")
direct_case("format version 9", lambda d: d.__setitem__(8, 9), r"tokens\.bin': token file format version 9")
direct_case("tokens of 3 bytes", lambda d: d.__setitem__(12, 3), r"tokens\.bin': corrupt header: tokens of 3 bytes")
direct_case("a count of 2^62", lambda d: d.__setitem__(slice(16, 24), struct.pack("<Q", 1 << 62)),
            r"tokens\.bin': corrupt header: token count")
direct_case("vocab_size 0", lambda d: d.__setitem__(slice(24, 32), struct.pack("<Q", 0)),
            r"tokens\.bin': corrupt header: vocab_size 0")
direct_case("a negative source size", lambda d: d.__setitem__(slice(48, 56), struct.pack("<q", -5)),
            r"tokens\.bin': corrupt header: source_bytes -5")
direct_case("an empty file", lambda d: b"", r"tokens\.bin': 0 bytes, shorter than the 128-byte")
direct_case("too few tokens for a window", lambda d: token_file([1, 2, 3], 40),
            r"the train split of '.*tokens\.bin' has 2 tokens, fewer than the 10 that seq_len 8 needs")
