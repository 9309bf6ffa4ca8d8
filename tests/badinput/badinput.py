#!/usr/bin/env python3
"""The bad-input suite's driver: runs the cases of one file against the lutra executable.

    python3 tests/badinput/badinput.py LUTRA tests/badinput/cases_ckpt.py [NAME_SUBSTRING]
    python3 tests/badinput/badinput.py --count [--at-least N] tests/badinput/cases_*.py

A case (in a cases_*.py file) builds a bad input in its own empty directory and returns the
command that reads it:

    from badinput import case, edit_json

    @case("manifest step edited: resume names the file and the field",
          expect=r"step_000004/manifest\\.json.*step")
    def _(fx, tmp):
        run = fx.run(tmp)                        # a copy of a small trained run directory
        edit_json(run / "ckpt/step_000004/manifest.json", lambda m: m.update(step=999))
        return fx.pretrain(run, "--resume=auto")  # the command, as an argument list

The driver runs it (working directory: the case's directory; 120 s limit) and asserts:
- the exit status is `exit` (default 1: a clear error; 2: a usage error; 0: documented
  behaviour, which `expect` must then describe);
- stderr matches `expect` (a Python regex, searched; with exit 0, stdout and stderr);
- nothing crashed or hung: no signal, no timeout, no sanitizer report, no raw Lua error
  ("attempt to index a nil value" and its kin name neither file nor field);
- `check(tmp)` (optional) returns None: it is where a case asserts that nothing already
  saved was lost or written through a link; a string it returns is the failure.

Fixtures (fx) are built once per driver run from the repository's own recipes and copied
into each case's directory, so a case cannot damage another's input.
"""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = []

# Errors that say nothing about the input: a Lua runtime error from inside lutra, a crash.
RAW_ERRORS = re.compile(
    r"attempt to (index|call|perform arithmetic on|compare|concatenate|get length of)"
    r"|bad argument #\d+ to|stack overflow|ERROR: AddressSanitizer|runtime error:"
    r"|LeakSanitizer|Segmentation fault|core dumped|PANIC: unprotected error")


def case(name, expect, exit=1, check=None, timeout=120, env=None):
    """Registers the decorated function fn(fx, tmp) -> argv as a case."""
    def register(fn):
        CASES.append(dict(name=name, expect=expect, exit=exit, check=check, timeout=timeout,
                          env=env or {}, build=fn))
        return fn
    return register


# ---- editing files ---------------------------------------------------------------------

def edit_json(path, fn):
    """Loads the JSON file, calls fn(obj) (which edits it in place or returns a new one), writes it."""
    path = Path(path)
    obj = json.loads(path.read_text())
    new = fn(obj)
    path.write_text(json.dumps(obj if new is None else new))


def write_json(path, obj):
    Path(path).write_text(json.dumps(obj))


def write_safetensors(path, tensors, metadata=None, raw_header=None):
    """tensors: {name: (dtype, shape, data bytes)}; raw_header (bytes) replaces the header."""
    header, blob = {}, b""
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    if metadata is not None:
        header["__metadata__"] = metadata
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    Path(path).write_bytes(struct.pack("<Q", len(h)) + h + blob)


def read_safetensors(path):
    """(header dict, data bytes) of a safetensors file."""
    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def rewrite_safetensors(path, fn):
    """Calls fn(header, data) -> (header, data) on the file and writes the result."""
    header, data = read_safetensors(path)
    header, data = fn(header, data)
    h = json.dumps(header).encode()
    Path(path).write_bytes(struct.pack("<Q", len(h)) + h + data)


def f32(*values):
    return struct.pack("<%df" % len(values), *values)


# ---- fixtures --------------------------------------------------------------------------

class Fixtures:
    """Inputs built once (under base/) and copied per case."""

    def __init__(self, lutra, base):
        self.lutra = str(lutra)
        self.base = Path(base)
        self.root = ROOT

    def lutra_cmd(self, *args):
        return [self.lutra, *map(str, args)]

    def _once(self, name, build):
        out = self.base / name
        if not out.exists():
            tmp = self.base / (name + ".building")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            build(tmp)
            tmp.rename(out)
        return out

    def _copy(self, name, build, tmp, as_name=None):
        src = self._once(name, build)
        dst = Path(tmp) / (as_name or name)
        if src.is_dir():
            shutil.copytree(src, dst, symlinks=True)
        else:
            shutil.copy(src, dst)
        return dst

    # A small text corpus (words, lines): data/corpus.txt.
    def _build_corpus(self, out):
        import random
        rng = random.Random(1)
        words = "the quick brown fox jumps over a lazy dog hello world".split()
        (out / "corpus.txt").write_text("\n".join(" ".join(rng.choice(words) for _ in range(8)) for _ in range(400)) + "\n")

    def corpus(self, tmp):
        """A copy of the data directory: tmp/data/corpus.txt. Returns the text file's path."""
        return self._copy("data", self._build_corpus, tmp) / "corpus.txt"

    PRETRAIN_SMALL = ["--model.n_layer=1", "--model.d_model=16", "--model.n_head=2", "--model.block_size=16",
                      "--batch=2", "--eval_every=2", "--eval_iters=1", "--ckpt_every=2", "--threads=1",
                      "--sample_tokens=0"]

    def pretrain(self, run, *extra, data=None, steps=4):
        """The command that trains (or resumes) the small model of run() in run_dir `run`."""
        data = data or Path(run).parent / "data" / "corpus.txt"
        return self.lutra_cmd(ROOT / "recipes/pretrain.lua", "--data=%s" % data, "--steps=%d" % steps,
                              *self.PRETRAIN_SMALL, "--run_dir=%s" % run, *extra)

    def _build_run(self, out):
        data = self.corpus(out)
        cmd = self.pretrain(out / "run", data=data)
        p = subprocess.run(cmd, cwd=out, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError("fixture run: %s\n%s%s" % (" ".join(cmd), p.stdout, p.stderr))

    def run(self, tmp):
        """A trained run directory (tmp/run: ckpt/step_000002, step_000004, latest, model/,
        metrics.jsonl) and its corpus (tmp/data/corpus.txt). Returns tmp/run."""
        src = self._once("trained", self._build_run)
        for name in ("run", "data"):
            shutil.copytree(src / name, Path(tmp) / name, symlinks=True)
        return Path(tmp) / "run"

    def model_dir(self, tmp):
        """A Hugging Face style model directory (config.json, model.safetensors, tokenizer.json,
        chat_template.json) of the trained run: tmp/model."""
        src = self._once("trained", self._build_run) / "run" / "model"
        dst = Path(tmp) / "model"
        shutil.copytree(src, dst, symlinks=True)
        return dst

    def _build_llama(self, out):
        data = self.corpus(out)
        cmd = self.pretrain(out / "run", "--model.arch=llama", "--tokenizer=bpe", "--vocab=300", data=data, steps=2)
        p = subprocess.run(cmd, cwd=out, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError("fixture llama run: %s\n%s%s" % (" ".join(cmd), p.stdout, p.stderr))

    def llama_model_dir(self, tmp):
        """model_dir() of a small llama (RoPE, RMSNorm, SwiGLU; config.json in llama's keys) with a byte-level
        BPE tokenizer.json in Hugging Face's format: tmp/model."""
        src = self._once("llama", self._build_llama) / "run" / "model"
        dst = Path(tmp) / "model"
        shutil.copytree(src, dst, symlinks=True)
        return dst

    def checkpoint(self, tmp):
        """A trainer checkpoint directory (manifest.json, rank_00000.lz4, extras): tmp/ckpt."""
        src = self._once("trained", self._build_run) / "run" / "ckpt" / "step_000004"
        dst = Path(tmp) / "ckpt"
        shutil.copytree(src, dst, symlinks=True)
        return dst

    def lutra_script(self, code, cwd, **env):
        """Runs `lutra -e code` (building a case's input; env: extra environment variables);
        a failure is the case's setup failing. Returns its stdout."""
        p = subprocess.run([self.lutra, "-e", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, LUTRA_QUIET="1", CUDA_VISIBLE_DEVICES="", **env))
        if p.returncode != 0:
            raise RuntimeError("lutra -e: %s%s" % (p.stdout, p.stderr))
        return p.stdout

    # A model directory whose char vocabulary has every character of the shipped SFT/DPO data
    # (and the ChatML tokens), with room for a chat: block_size 64.
    def _build_chat_model(self, out):
        lines = []
        for name in ("sft_train.jsonl", "dpo_train.jsonl"):
            lines += (ROOT / "recipes/data" / name).read_text().splitlines()
        (out / "chats.txt").write_text("\n".join(lines) + "\n")
        cmd = self.lutra_cmd(ROOT / "recipes/pretrain.lua", "--data=%s" % (out / "chats.txt"), "--steps=2",
                             "--model.n_layer=1", "--model.d_model=16", "--model.n_head=2", "--model.block_size=64",
                             "--batch=2", "--eval_every=0", "--threads=1", "--sample_tokens=0",
                             "--run_dir=%s" % (out / "run"))
        p = subprocess.run(cmd, cwd=out, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError("fixture chat model: %s\n%s%s" % (" ".join(cmd), p.stdout, p.stderr))

    def chat_model(self, tmp):
        """A model directory (tmp/chat_model) that the SFT and DPO recipes fine-tune: every character
        of recipes/data/*.jsonl in its char vocabulary, block_size 64."""
        src = self._once("chat", self._build_chat_model) / "run" / "model"
        dst = Path(tmp) / "chat_model"
        shutil.copytree(src, dst, symlinks=True)
        return dst

    def sft_data(self, tmp, name="sft_train.jsonl", lines=40):
        """The first `lines` lines of a shipped SFT/DPO JSONL file (recipes/data/NAME) in tmp."""
        src = (ROOT / "recipes/data" / name).read_text().splitlines()[:lines]
        dst = Path(tmp) / name
        dst.write_text("\n".join(src) + "\n")
        return dst


# ---- running ---------------------------------------------------------------------------

def run_case(fx, c, tmp, verbose):
    argv = c["build"](fx, tmp)
    env = dict(os.environ, LUTRA_QUIET="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", **c["env"])
    t0 = time.time()
    try:
        p = subprocess.run([str(a) for a in argv], cwd=tmp, capture_output=True, timeout=c["timeout"], env=env,
                           start_new_session=True)
    except subprocess.TimeoutExpired as e:
        return "hung: no exit within %d s\n%s" % (c["timeout"], (e.output or b"").decode(errors="replace")[-2000:])
    out = (p.stdout + p.stderr).decode(errors="replace")
    # an error is judged by what it says on stderr (stdout has the settings dump, which names
    # every option); documented behaviour (exit 0) by everything it printed
    said = out if c["exit"] == 0 else p.stderr.decode(errors="replace")
    took = time.time() - t0
    if verbose:
        print("  $ %s  (%.1f s, exit %d)\n%s" % (" ".join(map(str, argv)), took, p.returncode,
                                                "".join("  | " + line + "\n" for line in out.splitlines()[-12:])))
    if p.returncode < 0:
        return "killed by %s\n%s" % (signal.Signals(-p.returncode).name, out[-3000:])
    raw = RAW_ERRORS.search(out)
    if raw:
        return "unclear error or crash (%r)\n%s" % (raw.group(0), out[-3000:])
    if p.returncode != c["exit"]:
        return "exit %d, want %d\n%s" % (p.returncode, c["exit"], out[-3000:])
    if not re.search(c["expect"], said, re.S):
        return ("stderr" if c["exit"] else "output") + " does not match /%s/\n%s" % (c["expect"], said[-3000:])
    if c["check"]:
        why = c["check"](Path(tmp))
        if why:
            return "check: %s\n%s" % (why, out[-1500:])
    return None


def load_cases(path):
    CASES.clear()
    sys.modules.setdefault("badinput", sys.modules[__name__])  # the cases register here
    code = compile(Path(path).read_text(), str(path), "exec")
    exec(code, {"__name__": "cases", "__file__": str(path)})
    return list(CASES)


def main(argv):
    if argv[:1] == ["--count"]:
        at_least, paths = 0, argv[1:]
        if paths[:1] == ["--at-least"]:
            at_least, paths = int(paths[1]), paths[2:]
        total, names = 0, set()
        for path in paths:
            cases = load_cases(path)
            for c in cases:
                if c["name"] in names:
                    print("two cases are named %r (%s)" % (c["name"], path))
                    return 1
                names.add(c["name"])
            total += len(cases)
            print("%5d  %s" % (len(cases), path))
        print("%5d  cases in all%s" % (total, "" if total >= at_least else ", fewer than %d" % at_least))
        return 0 if total >= at_least else 1
    if len(argv) < 2:
        print(__doc__)
        return 2
    lutra, path = Path(argv[0]).resolve(), argv[1]
    only = argv[2] if len(argv) > 2 else None
    cases = [c for c in load_cases(path) if not only or only in c["name"]]
    verbose = os.environ.get("BADINPUT_VERBOSE") == "1"
    base = Path(tempfile.mkdtemp(prefix="badinput-"))
    failed = []
    try:
        fx = Fixtures(lutra, base / "fixtures")
        (base / "fixtures").mkdir()
        for i, c in enumerate(cases):
            tmp = base / ("case%03d" % i)
            tmp.mkdir()
            try:
                why = run_case(fx, c, tmp, verbose)
            except Exception as e:  # a case that cannot even build its input is a failure too
                why = "setup: %s: %s" % (type(e).__name__, e)
            print("%s %s" % ("ok  " if why is None else "FAIL", c["name"]))
            if why is not None:
                failed.append(c["name"])
                print("".join("    " + line + "\n" for line in why.splitlines()))
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("%s: %d cases, %d passed, %d failed" % (path, len(cases), len(cases) - len(failed), len(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
