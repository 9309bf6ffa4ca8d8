"""Links planted where lutra writes, and run directories it cannot write.

Documented behaviour (lutra.h, "files written safely"; README, Training): every file lutra
writes goes to a temporary beside it and is renamed over it, so a symbolic link planted at that
name is replaced by the file (lutra says so on stderr) and its target is never written; appended
files (metrics.jsonl, samples.txt) are opened without following links, a link there replaced by a
fresh file. Each case plants a link to a file (or directory) outside the run, runs the command
(exit 0), and `check` asserts the target is unchanged and the name now holds a regular file.
A run directory that cannot be written is an error naming the place and the reason.
"""
import json
import os
import shutil
import subprocess
from pathlib import Path

from badinput import case

VICTIM = "precious: not lutra's to write\n"


def plant(tmp, where, name="victim.txt"):
    """A file outside the run (tmp/outside/NAME) and a symbolic link to it at `where`."""
    outside = Path(tmp) / "outside"
    outside.mkdir(exist_ok=True)
    target = outside / name
    target.write_text(VICTIM)
    where = Path(where)
    if where.is_symlink() or where.exists():
        where.unlink()
    where.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, where)
    return target


def untouched(*names):
    """check(tmp): each tmp/outside/NAME still holds VICTIM, and each link path given by the
    case (relative to tmp) is a regular file or directory now, not a link."""
    def check(tmp):
        for name in names:
            target = Path(tmp) / "outside" / name
            if target.read_text() != VICTIM:
                return "%s was written through the link: %r" % (target, target.read_text()[:80])
        return None
    return check


def regular(*paths):
    def check(tmp):
        for p in paths:
            p = Path(tmp) / p
            if p.is_symlink():
                return "%s is still a link" % p
            if not p.exists():
                return "%s is missing" % p
        return None
    return check


def both(*checks):
    def check(tmp):
        for c in checks:
            why = c(tmp)
            if why:
                return why
        return None
    return check


REPLACED = r"was a symbolic link \(to [^)]*/outside/[^)]*\): replaced by a regular file"


def all_of(*patterns):
    """A regex that matches when every pattern is found, in any order (stdout comes before stderr)."""
    return "".join(r"(?=[\s\S]*?%s)" % p for p in patterns)


# ---- the trainer's run directory ---------------------------------------------------------------

@case("link at run_dir/model/config.json: replaced, its target untouched",
      expect=all_of(REPLACED, r"model: saved to"), exit=0,
      check=both(untouched("victim.txt"), regular("run/model/config.json")))
def _(fx, tmp):
    run = fx.run(tmp)
    plant(tmp, run / "model/config.json")
    return fx.pretrain(run, "--resume=auto", steps=6)


@case("link at run_dir/model/chat_template.json: replaced, its target untouched",
      expect=REPLACED, exit=0, check=both(untouched("victim.txt"), regular("run/model/chat_template.json")))
def _(fx, tmp):
    run = fx.run(tmp)
    plant(tmp, run / "model/chat_template.json")
    return fx.pretrain(run, "--resume=auto", steps=6)


@case("link at run_dir/model/model.safetensors and tokenizer.json: replaced, targets untouched",
      expect=REPLACED, exit=0,
      check=both(untouched("w.bin", "t.json"), regular("run/model/model.safetensors", "run/model/tokenizer.json")))
def _(fx, tmp):
    run = fx.run(tmp)
    plant(tmp, run / "model/model.safetensors", "w.bin")
    plant(tmp, run / "model/tokenizer.json", "t.json")
    return fx.pretrain(run, "--resume=auto", steps=6)


@case("link at the run's metrics.jsonl (a resumed run appends): a fresh file, the target untouched",
      expect=REPLACED, exit=0, check=both(untouched("victim.txt"), regular("run/latest/metrics.jsonl")))
def _(fx, tmp):
    run = fx.run(tmp)
    plant(tmp, run / "latest/metrics.jsonl")
    return fx.pretrain(run, "--resume=auto", steps=6)


def latest_repointed(tmp):
    """check: run/latest is a link into run/runs again, and nothing was written outside."""
    latest = Path(tmp) / "run/latest"
    if not latest.is_symlink() or not os.readlink(latest).startswith("runs/"):
        return "run/latest does not point at a run: %s" % (os.readlink(latest) if latest.is_symlink() else "not a link")
    written = list((Path(tmp) / "outside").iterdir())
    return "written outside the run: %s" % written if written else None


@case("link at run_dir/latest to a directory outside (a fresh run): repointed at the new run, nothing written there",
      expect=r"run [0-9-]+: .*run/runs/[0-9-]+", exit=0, check=latest_repointed)
def _(fx, tmp):
    fx.corpus(tmp)
    run = tmp / "run"
    run.mkdir()
    (tmp / "outside").mkdir()
    os.symlink(tmp / "outside", run / "latest")
    return fx.pretrain(run, steps=2)


@case("link at a run's own directory, runs/ID (a resumed run): its records go to a new run, the target untouched",
      expect=r"runs/[0-9-]+ is a symbolic link: this run's records go to a new run directory", exit=0,
      check=latest_repointed)
def _(fx, tmp):
    run = fx.run(tmp)
    (tmp / "outside").mkdir()
    run_id = os.readlink(run / "latest")
    shutil.rmtree(run / run_id)
    os.symlink(tmp / "outside", run / run_id)
    return fx.pretrain(run, "--resume=auto", steps=6)


@case("hard link at the run's metrics.jsonl to a file outside: not appended through",
      expect=r"metrics\.jsonl has 2 hard links: replaced by a fresh regular file", exit=0,
      check=untouched("victim.txt"))
def _(fx, tmp):
    run = fx.run(tmp)
    (tmp / "outside").mkdir()
    (tmp / "outside/victim.txt").write_text(VICTIM)
    (run / "latest/metrics.jsonl").unlink()
    os.link(tmp / "outside/victim.txt", run / "latest/metrics.jsonl")
    return fx.pretrain(run, "--resume=auto", steps=6)


@case("link at run_dir/config.json: replaced, its target untouched",
      expect=REPLACED, exit=0, check=both(untouched("victim.txt"), regular("run/config.json")))
def _(fx, tmp):
    run = fx.run(tmp)
    plant(tmp, run / "config.json")
    return fx.pretrain(run, "--resume=auto", steps=6)


@case("link at run_dir/tokenizer.json: replaced, its target untouched",
      expect=REPLACED, exit=0, check=both(untouched("victim.txt"), regular("run/tokenizer.json")))
def _(fx, tmp):
    run = fx.run(tmp)
    plant(tmp, run / "tokenizer.json")
    return fx.pretrain(run, "--resume=auto", steps=6)


@case("link at the run's samples.txt: a fresh file, the target untouched",
      expect=all_of(REPLACED, r"---- sample at step"), exit=0,
      check=both(untouched("victim.txt"), regular("run/latest/samples.txt")))
def _(fx, tmp):
    run = fx.run(tmp)
    plant(tmp, run / "latest/samples.txt")
    return fx.pretrain(run, "--resume=auto", "--sample_every=1", "--sample_tokens=4", steps=5)


@case("link at ckpt/latest: replaced, its target untouched",
      expect=all_of(REPLACED, r"step 6/6"), exit=0, check=both(untouched("victim.txt"), regular("run/ckpt/latest")))
def _(fx, tmp):
    run = fx.run(tmp)
    plant(tmp, run / "ckpt/latest")
    return fx.pretrain(run, "--resume=auto", steps=6)


@case("link at the next step's checkpoint directory (to a directory outside): replaced, nothing written there",
      expect=r"step 6/6", exit=0, check=both(untouched("dir/victim.txt"), regular("run/ckpt/step_000006")))
def _(fx, tmp):
    run = fx.run(tmp)
    (tmp / "outside/dir").mkdir(parents=True)
    (tmp / "outside/dir/victim.txt").write_text(VICTIM)
    os.symlink(tmp / "outside/dir", run / "ckpt/step_000006")
    return fx.pretrain(run, "--resume=auto", steps=6)


@case("link at the next step's temporary checkpoint directory: removed as a link, its target's files kept",
      expect=r"step 6/6", exit=0, check=untouched("dir/victim.txt", "dir/rank_00000.lz4"))
def _(fx, tmp):
    run = fx.run(tmp)
    (tmp / "outside/dir").mkdir(parents=True)
    for name in ("victim.txt", "rank_00000.lz4"):
        (tmp / "outside/dir" / name).write_text(VICTIM)
    os.symlink(tmp / "outside/dir", run / "ckpt/step_000006.tmp")
    return fx.pretrain(run, "--resume=auto", steps=6)


@case("links at the shard and extra files of the next step's temporary checkpoint: replaced, targets untouched",
      expect=r"step 6/6", exit=0, check=both(untouched("shard", "extra"), regular("run/ckpt/step_000006/rank_00000.lz4")))
def _(fx, tmp):
    run = fx.run(tmp)
    (run / "ckpt/step_000006.tmp").mkdir()
    plant(tmp, run / "ckpt/step_000006.tmp/rank_00000.lz4", "shard")
    plant(tmp, run / "ckpt/step_000006.tmp/extra_rank_00000.json", "extra")
    return fx.pretrain(run, "--resume=auto", steps=6)


# ---- convert's destination --------------------------------------------------------------------

@case("convert: link at the destination's config.json: replaced, its target untouched",
      expect=REPLACED, exit=0, check=both(untouched("victim.txt"), regular("hf/config.json")))
def _(fx, tmp):
    run = fx.run(tmp)
    plant(tmp, tmp / "hf/config.json")
    return fx.lutra_cmd("convert", run, tmp / "hf", "--force")


@case("convert: links at the destination's model.safetensors and tokenizer.json: replaced, targets untouched",
      expect=REPLACED, exit=0,
      check=both(untouched("w.bin", "t.json"), regular("hf/model.safetensors", "hf/tokenizer.json")))
def _(fx, tmp):
    run = fx.run(tmp)
    plant(tmp, tmp / "hf/model.safetensors", "w.bin")
    plant(tmp, tmp / "hf/tokenizer.json", "t.json")
    return fx.lutra_cmd("convert", run, tmp / "hf", "--force")


@case("convert HF -> lutra: links at the destination checkpoint's files: replaced, targets untouched",
      expect=r"lutra checkpoint", exit=0,
      check=both(untouched("m.json", "t.json"), regular("ck/manifest.json", "ck/tokenizer.json")))
def _(fx, tmp):
    model = fx.model_dir(tmp)
    plant(tmp, tmp / "ck/manifest.json", "m.json")
    plant(tmp, tmp / "ck/tokenizer.json", "t.json")
    return fx.lutra_cmd("convert", model, tmp / "ck", "--force")


# ---- run directories that cannot be written ------------------------------------------------------

@case("run_dir is a file: the error names it",
      expect=r"cannot create the (cache )?directory .*runfile[^:]*: .*runfile: a file of that name is in the way")
def _(fx, tmp):
    fx.corpus(tmp)
    (tmp / "runfile").write_text("a file, not a directory\n")
    return fx.pretrain(tmp / "runfile", steps=2)


@case("run_dir inside a file: the error names the file in the way",
      expect=r"cannot create the (cache )?directory .*runfile[^:]*: .*runfile: a file of that name is in the way")
def _(fx, tmp):
    fx.corpus(tmp)
    (tmp / "runfile").write_text("a file, not a directory\n")
    return fx.pretrain(tmp / "runfile/run", data=tmp / "data/corpus.txt", steps=2)


@case("run_dir/ckpt is a file: the save fails naming it; the run stops",
      expect=r"ckpt\.save: .*run/ckpt/step_000002.*cannot create the directory .*run/ckpt: a file of that name")
def _(fx, tmp):
    fx.corpus(tmp)
    (tmp / "run").mkdir()
    (tmp / "run/ckpt").write_text("a file\n")
    return fx.pretrain(tmp / "run", steps=2)


def read_only(argv, directory):
    """argv run with `directory` read-only: a read-only bind mount in a mount namespace of its own
    (unshare -rm), as root's permissions ignore chmod; chmod where unshare is not there."""
    if shutil.which("unshare") and subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0:
        d = str(directory)
        script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
        return ["unshare", "-rm", "sh", "-c", script, "sh", d, *map(str, argv)]
    os.chmod(directory, 0o555)
    return argv


@case("read-only run_dir, fresh run: the error names the run's directory and the reason",
      expect=r"cannot create the directory .*run/runs: (read-only file system|permission denied)")
def _(fx, tmp):
    fx.corpus(tmp)
    (tmp / "run").mkdir()
    return read_only(fx.pretrain(tmp / "run", "--cache_dir=%s" % (tmp / "cache"), steps=2), tmp / "run")


@case("read-only run_dir, resumed run: the error names metrics.jsonl; the checkpoints are kept",
      expect=r"metrics: cannot write .*run/runs/[0-9-]+/metrics\.jsonl.*(read-only file system|permission denied)",
      check=regular("run/ckpt/step_000004/manifest.json", "run/ckpt/step_000002/manifest.json"))
def _(fx, tmp):
    run = fx.run(tmp)
    return read_only(fx.pretrain(run, "--resume=auto", "--cache_dir=%s" % (tmp / "cache"), steps=6), run)


@case("read-only run_dir with its data cache inside: the error names the cache and the reason",
      expect=r"cannot create the cache directory .*run/cache.: .*run/cache: (read-only file system|permission denied)")
def _(fx, tmp):
    fx.corpus(tmp)
    (tmp / "run").mkdir()
    return read_only(fx.pretrain(tmp / "run", steps=2), tmp / "run")


@case("read-only checkpoint directory: the save fails naming the directory and the reason",
      expect=r"ckpt\.save: .*step_000006.*cannot create the directory .*step_000006\.tmp: "
             r"(read-only file system|permission denied)",
      check=regular("run/ckpt/step_000004/manifest.json"))
def _(fx, tmp):
    run = fx.run(tmp)
    return read_only(fx.pretrain(run, "--resume=auto", steps=6), run / "ckpt")


# A run from step 1 in a run_dir that has runs gets a run of its own; the earlier one is untouched.
def earlier_run_kept(tmp):
    ids = sorted(p.name for p in (tmp / "run/runs").iterdir())
    if len(ids) != 2:
        return "runs/ holds %s, not the earlier run and a new one" % ids
    if (tmp / "run/runs" / ids[0] / "metrics.jsonl").read_bytes() != (tmp / "metrics.before").read_bytes():
        return "the earlier run's metrics.jsonl changed"
    if os.readlink(tmp / "run/latest") != "runs/" + ids[1]:
        return "latest is not the new run: %s" % os.readlink(tmp / "run/latest")
    now = tmp / "run/runs" / ids[1] / "metrics.jsonl"
    steps = [json.loads(line)["step"] for line in now.read_text().splitlines() if '"loss"' in line]
    if steps != [1, 2]:
        return "the new run's metrics.jsonl is not a run from the start: steps %s" % steps[:5]
    return None


@case("--resume=fresh in a run_dir with a run: a new run directory, the earlier one untouched",
      expect=r"run [0-9-]+: .*run/runs/[0-9-]+", exit=0, check=earlier_run_kept)
def _(fx, tmp):
    run = fx.run(tmp)
    shutil.copy(run / "latest/metrics.jsonl", tmp / "metrics.before")
    return fx.pretrain(run, "--resume=fresh", steps=2)
