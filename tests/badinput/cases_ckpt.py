"""Damaged trainer checkpoints: manifest paths out of the checkpoint directory (../, absolute, NUL,
symlinks), edited steps, dtypes, shapes and extra state, and checkpoints of another model. Each is
named (file, tensor or field, problem) by `lutra ckpt ls --verify` and by a resume from it; with
--resume=auto the run falls back to the previous checkpoint, saying why, and with none left it stops
listing each and leaves them as they were."""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from badinput import case, edit_json

S2, S4 = "step_000002", "step_000004"


def ckpt_dir(run, name=S4):
    return run / "ckpt" / name


def ls(fx, run):
    return fx.lutra_cmd("ckpt", "ls", run / "ckpt", "--verify")


def kept(names, files=("manifest.json",)):
    """A check: the damaged checkpoints are still there, as damaged (nothing saved over them)."""
    def check(tmp):
        for name in names:
            for f in files:
                saved = tmp / ("saved-%s-%s" % (name, f))
                now = tmp / "run" / "ckpt" / name / f
                if not now.exists() or now.read_bytes() != saved.read_bytes():
                    return "%s/%s was changed or removed" % (name, f)
        return None
    return check


def remember(tmp, run, names, files=("manifest.json",)):
    for name in names:
        for f in files:
            shutil.copy(run / "ckpt" / name / f, tmp / ("saved-%s-%s" % (name, f)))


def damage_cases(title, damage, expect, modes=("ls", "path", "auto", "auto_all")):
    """Registers a case per mode for damage(tmp, run, name) applied to step 4 (or both):
    ls: `lutra ckpt ls --verify` says INVALID and why; path: --resume=PATH stops naming it;
    auto: --resume=auto skips it, saying why, and resumes from step 2; auto_all: both damaged,
    --resume=auto stops listing each, and neither is changed."""
    if "ls" in modes:
        @case("%s: ckpt ls --verify says invalid" % title, expect=r"step_000004: INVALID: .*" + expect)
        def _(fx, tmp):
            run = fx.run(tmp)
            damage(tmp, run, S4)
            return ls(fx, run)
    if "path" in modes:
        @case("%s: --resume=PATH stops naming it" % title, expect=expect)
        def _(fx, tmp):
            run = fx.run(tmp)
            damage(tmp, run, S4)
            return fx.pretrain(run, "--resume=%s" % ckpt_dir(run))
    if "auto" in modes:
        @case("%s: --resume=auto falls back to step 2" % title, exit=0,
              expect=r"(?s)(?=.*skipping \S*step_000004: .*%s)(?=.*resumed from \S*step_000002 at step 2)" % expect)
        def _(fx, tmp):
            run = fx.run(tmp)
            damage(tmp, run, S4)
            return fx.pretrain(run, "--resume=auto")
    if "auto_all" in modes:
        @case("%s in both: --resume=auto stops, listing each, nothing saved over them" % title,
              expect=r"resume=auto: 2 checkpoints under \S*ckpt, none .*step_000004: .*%s.*step_000002: " % expect,
              check=kept([S4, S2]))
        def _(fx, tmp):
            run = fx.run(tmp)
            for name in (S4, S2):
                damage(tmp, run, name)
            remember(tmp, run, [S4, S2])
            return fx.pretrain(run, "--resume=auto")


def manifest_edit(fn):
    """A damage that edits the manifest: fn(manifest, tmp, run, name)."""
    def damage(tmp, run, name):
        edit_json(ckpt_dir(run, name) / "manifest.json", lambda m: fn(m, tmp, run, name))
    return damage


def extra_edit(fn):
    """A damage that edits rank 0's extra state: fn(extra)."""
    def damage(tmp, run, name):
        edit_json(ckpt_dir(run, name) / "extra_rank_00000.json", fn)
    return damage


def tensor(m, name):
    return next(t for t in m["tensors"] if t["name"] == name)


# ---- paths out of the checkpoint directory --------------------------------------------------

def outside_extra(m, tmp, run, name):
    shutil.copy(ckpt_dir(run, name) / "extra_rank_00000.json", tmp / "outside.json")
    m["extra"] = ["../../../outside.json"]


damage_cases("manifest extra entry '../../../outside.json'", manifest_edit(outside_extra),
             r"manifest\.json: extra\[0\] = '\.\./\.\./\.\./outside\.json': entries must be plain file names")


def absolute_extra(m, tmp, run, name):
    shutil.copy(ckpt_dir(run, name) / "extra_rank_00000.json", tmp / "outside.json")
    m["extra"] = [str(tmp / "outside.json")]


damage_cases("manifest extra entry an absolute path", manifest_edit(absolute_extra),
             r"manifest\.json: extra\[0\] = '/\S*outside\.json': entries must be plain file names", modes=("ls", "path"))
damage_cases("manifest extra entry '..'", manifest_edit(lambda m, *_: m.update(extra=[".."])),
             r"extra\[0\] = '\.\.': entries must be plain file names", modes=("ls",))
damage_cases("manifest files entry '../rank_00000.lz4'",
             manifest_edit(lambda m, *_: m.update(files=["../" + S4 + "/rank_00000.lz4"])),
             r"manifest\.json: files\[0\] = '\.\./step_000004/rank_00000\.lz4': entries must be plain file names",
             modes=("ls", "path"))
damage_cases("manifest files entry an absolute path", manifest_edit(lambda m, *_: m.update(files=["/etc/passwd"])),
             r"files\[0\] = '/etc/passwd': entries must be plain file names", modes=("ls",))
damage_cases("manifest copied entry '../../config.lua'", manifest_edit(lambda m, *_: m.update(copied=["../../config.lua"])),
             r"copied\[0\] = '\.\./\.\./config\.lua': entries must be plain file names", modes=("ls", "path"))
damage_cases("manifest extra entry with a NUL",
             manifest_edit(lambda m, *_: m.update(extra=["extra_rank_00000.json\u0000/../../../outside.json"])),
             r'manifest\.json: the string "extra_rank_00000\.json\\u0000/\.\./\.\./\.\./outside\.json" holds a NUL',
             modes=("ls", "path", "auto"))
damage_cases("manifest files entry with a NUL",
             manifest_edit(lambda m, *_: m.update(files=["rank_00000.lz4\u0000x"])),
             r'the string "rank_00000\.lz4\\u0000x" holds a NUL character', modes=("ls",))
damage_cases("tensor name with a NUL",
             manifest_edit(lambda m, *_: tensor(m, "wte.weight").update(name="wte.weight\u0000x")),
             r'manifest\.json: the string "wte\.weight\\u0000x" holds a NUL character', modes=("ls",))
damage_cases("manifest extra list shorter than the rank files", manifest_edit(lambda m, *_: m.update(extra=[])),
             r"manifest\.json: extra lists 0 files, one per rank's file \(1\)", modes=("ls",))
damage_cases("manifest world edited to 2", manifest_edit(lambda m, *_: m.update(world=2)),
             r"manifest\.json: world must be the number of rank files \(1\)", modes=("ls",))


def link_out(fname):
    """A damage: the checkpoint's file fname moved outside and a symlink to it left in its place."""
    def damage(tmp, run, name):
        here = ckpt_dir(run, name) / fname
        there = tmp / ("outside-%s-%s" % (name, fname))
        shutil.move(here, there)
        os.symlink(there, here)
    return damage


damage_cases("extra_rank_00000.json a symlink to a file outside", link_out("extra_rank_00000.json"),
             r"extra_rank_00000\.json \(in manifest\.json's extra\) leads to \S*outside-step_00000\d-extra_rank_00000\.json, "
             r"outside the checkpoint directory", modes=("ls", "path", "auto"))
damage_cases("rank_00000.lz4 a symlink to a file outside", link_out("rank_00000.lz4"),
             r"rank_00000\.lz4 \(in manifest\.json's files\) leads to \S*outside\S*, outside the checkpoint directory",
             modes=("ls", "path"))
damage_cases("tokenizer.json (copied in) a symlink to a file outside", link_out("tokenizer.json"),
             r"tokenizer\.json \(in manifest\.json's copied\) leads to \S*, outside the checkpoint directory",
             modes=("ls",))


@case("extra_rank_00000.json a symlink to a file inside the checkpoint: accepted (documented)",
      expect=r"step_000004\s+4 .* valid", exit=0)
def _(fx, tmp):
    run = fx.run(tmp)
    d = ckpt_dir(run)
    shutil.move(d / "extra_rank_00000.json", d / "extra.copy.json")
    os.symlink("extra.copy.json", d / "extra_rank_00000.json")
    return ls(fx, run)


def old_format(tmp, run, name):
    d = ckpt_dir(run, name)
    for f in list(d.iterdir()):
        f.unlink()
    (tmp / "secret.bin").write_bytes(b"\0" * 64)
    (d / "manifest.lua").write_text('return {format = "lutra-train-checkpoint", version = 1, step = 4, '
                                    'tensors = {{name = "wte.weight", path = "../../../../secret.bin"}}}\n')


damage_cases("old-format manifest.lua with '../' tensor paths", old_format,
             r"step_000004/manifest\.lua: the single-process checkpoint format \(manifest\.lua\) is no longer read",
             modes=("path", "auto"))


@case("old-format manifest.lua with '../' tensor paths: convert refuses it",
      expect=r"step_000004/manifest\.lua: the single-process checkpoint format \(manifest\.lua\) is no longer read")
def _(fx, tmp):
    run = fx.run(tmp)
    old_format(tmp, run, S4)
    return fx.lutra_cmd("convert", ckpt_dir(run), tmp / "hf")


# ---- the step --------------------------------------------------------------------------------

damage_cases("manifest step edited 4 -> 999", manifest_edit(lambda m, *_: m.update(step=999)),
             r"step_000004/manifest\.json: step is 999 but the directory is step_000004")


@case("manifest step edited 4 -> 999: plain ckpt ls (no --verify) sees it too",
      expect=r"step_000004: INVALID: .*step is 999 but the directory is step_000004")
def _(fx, tmp):
    run = fx.run(tmp)
    edit_json(ckpt_dir(run) / "manifest.json", lambda m: m.update(step=999))
    return fx.lutra_cmd("ckpt", "ls", run / "ckpt")


def renamed_step(step):
    """A damage: the manifest's step edited and the directory renamed to match (latest too)."""
    def damage(tmp, run, name):
        edit_json(ckpt_dir(run, name) / "manifest.json", lambda m: m.update(step=step))
        new = "step_%06d" % step
        ckpt_dir(run, name).rename(ckpt_dir(run, new))
        (run / "ckpt" / "latest").write_text(new + "\n")
    return damage


@case("manifest step 4 -> 999 and the directory renamed step_000999: the loader's position disagrees",
      expect=r"step_000999: INVALID: .*step_000999/extra_rank_00000\.json: loader\.step is 4 but the checkpoint's step "
             r"is 999")
def _(fx, tmp):
    run = fx.run(tmp)
    renamed_step(999)(tmp, run, S4)
    return ls(fx, run)


@case("manifest step 4 -> 999 and the directory renamed: --resume=PATH stops",
      expect=r"step_000999/extra_rank_00000\.json: loader\.step is 4 but the checkpoint's step is 999")
def _(fx, tmp):
    run = fx.run(tmp)
    renamed_step(999)(tmp, run, S4)
    return fx.pretrain(run, "--resume=%s" % ckpt_dir(run, "step_000999"))


@case("manifest step 4 -> 1 and the directory renamed step_000001: the optimizer took more steps",
      expect=r"step_000001/extra_rank_00000\.json: optim\.steps must be an integer from 0 to the checkpoint's step "
             r"\(1\), got number 4")
def _(fx, tmp):
    run = fx.run(tmp)
    renamed_step(1)(tmp, run, S4)
    return ls(fx, run)


damage_cases("manifest step a string", manifest_edit(lambda m, *_: m.update(step="4")),
             r"manifest\.json: step must be a non-negative integer", modes=("ls", "path"))
damage_cases("manifest step negative", manifest_edit(lambda m, *_: m.update(step=-4)),
             r"manifest\.json: step must be a non-negative integer", modes=("ls",))

# ---- dtypes and shapes -----------------------------------------------------------------------

damage_cases("tensor wte.weight's dtype edited f32 -> i32",
             manifest_edit(lambda m, *_: tensor(m, "wte.weight").update(dtype="i32")),
             r"manifest\.json: tensor 'wte\.weight' is i32", modes=("ls", "auto", "auto_all"))


@case("tensor wte.weight's dtype edited f32 -> i32: --resume=PATH names it",
      expect=r"step_000004/manifest\.json does not match this model:\s+tensor 'wte\.weight' is i32 in the checkpoint, "
             r"the model's parameter is f32")
def _(fx, tmp):
    run = fx.run(tmp)
    edit_json(ckpt_dir(run) / "manifest.json", lambda m: tensor(m, "wte.weight").update(dtype="i32"))
    return fx.pretrain(run, "--resume=%s" % ckpt_dir(run))


damage_cases("optimizer state's dtype edited f32 -> i32",
             manifest_edit(lambda m, *_: tensor(m, "optim.wte.weight.exp_avg").update(dtype="i32")),
             r"tensor 'optim\.wte\.weight\.exp_avg' is i32", modes=("ls",))


@case("optimizer state's dtype edited f32 -> i32: --resume=PATH names it",
      expect=r"step_000004/manifest\.json does not match this model:\s+optimizer state 'optim\.wte\.weight\.exp_avg' is "
             r"i32: optimizer state is floating-point")
def _(fx, tmp):
    run = fx.run(tmp)
    edit_json(ckpt_dir(run) / "manifest.json", lambda m: tensor(m, "optim.wte.weight.exp_avg").update(dtype="i32"))
    return fx.pretrain(run, "--resume=%s" % ckpt_dir(run))


def widened_bf16(m, *_):
    # f32 -> bf16 with the last dim doubled: the same bytes, so only the shard's element size tells
    m.pop("kind")
    t = tensor(m, "wte.weight")
    t["dtype"] = "bf16"
    t["shape"][1] *= 2
    for p in t["pieces"]:
        p["shape"][1] *= 2


damage_cases("dtype f32 -> bf16 with the shape widened to keep the bytes (no trainer kind)",
             manifest_edit(widened_bf16),
             r"tensor 'wte\.weight' piece 1: the manifest says bf16, but rank_00000\.lz4 piece \d+ holds 4-byte elements: "
             r"dtype mismatch", modes=("ls",))


def transposed(m, *_):
    t = tensor(m, "wte.weight")
    t["shape"].reverse()
    for p in t["pieces"]:
        p["shape"].reverse()


damage_cases("parameter's shape edited (transposed, same bytes)", manifest_edit(transposed),
             r"optimizer state 'optim\.wte\.weight\.exp_avg(_sq)?' is \{\d+, 16\}, its parameter 'wte\.weight' \{16, \d+\}",
             modes=("ls",))


@case("parameter's shape edited (transposed, same bytes): --resume=PATH names it",
      expect=r"does not match this model:.*tensor 'wte\.weight' is \{16, \d+\} in the checkpoint, the model's is \{\d+, 16\}")
def _(fx, tmp):
    run = fx.run(tmp)
    edit_json(ckpt_dir(run) / "manifest.json", lambda m: transposed(m))
    return fx.pretrain(run, "--resume=%s" % ckpt_dir(run))


damage_cases("a parameter renamed (blocks.0.ln_1.weight -> blocks.0.ln_9.weight)",
             manifest_edit(lambda m, *_: tensor(m, "blocks.0.ln_1.weight").update(name="blocks.0.ln_9.weight")),
             r"optimizer state 'optim\.blocks\.0\.ln_1\.weight\.exp_avg(_sq)?' is for 'blocks\.0\.ln_1\.weight', which the "
             r"checkpoint does not hold", modes=("ls",))


@case("a parameter renamed: --resume=PATH lists the missing and the unexpected tensor",
      expect=r"(?s)has no tensor 'blocks\.0\.ln_1\.weight'.*unexpected tensor 'blocks\.0\.ln_9\.weight'")
def _(fx, tmp):
    run = fx.run(tmp)
    edit_json(ckpt_dir(run) / "manifest.json",
              lambda m: tensor(m, "blocks.0.ln_1.weight").update(name="blocks.0.ln_9.weight"))
    return fx.pretrain(run, "--resume=%s" % ckpt_dir(run))


# ---- the extra state -------------------------------------------------------------------------

damage_cases("RNG seed edited to a string", extra_edit(lambda x: x["rng"].update(seed="abc")),
             r"step_000004/extra_rank_00000\.json: rng\.seed must be an integer >= 0, got string \"abc\"")
damage_cases("RNG state missing", extra_edit(lambda x: x.pop("rng") and None),
             r"extra_rank_00000\.json: rng must be a table \{seed, offset\}, got nothing", modes=("ls", "path"))
damage_cases("RNG offset negative", extra_edit(lambda x: x["rng"].update(offset=-5)),
             r"extra_rank_00000\.json: rng\.offset must be an integer >= 0, got number -5", modes=("ls",))
damage_cases("RNG seed 1.5", extra_edit(lambda x: x["rng"].update(seed=1.5)),
             r"extra_rank_00000\.json: rng\.seed must be an integer >= 0, got number 1\.5", modes=("path",))
damage_cases("loader step a string", extra_edit(lambda x: x["loader"].update(step="4")),
             r"extra_rank_00000\.json: loader\.step must be an integer >= 0, got string \"4\"", modes=("ls",))
damage_cases("loader state missing", extra_edit(lambda x: x.pop("loader") and None),
             r"extra_rank_00000\.json: loader must be a table, got nothing", modes=("path",))
damage_cases("val_loader a number", extra_edit(lambda x: x.update(val_loader=7)),
             r"extra_rank_00000\.json: val_loader must be a table, got number 7", modes=("ls",))
damage_cases("optimizer steps a string", extra_edit(lambda x: x["optim"].update(steps="x")),
             r"extra_rank_00000\.json: optim\.steps must be an integer", modes=("ls",))
damage_cases("optimizer kind a number", extra_edit(lambda x: x["optim"].update(kind=3)),
             r"extra_rank_00000\.json: optim\.kind must be a string, got number 3", modes=("ls",))
damage_cases("a parameter's AdamW step a string",
             extra_edit(lambda x: x["optim"]["numbers"]["wte.weight"].update(step="4")),
             r'extra_rank_00000\.json: optim\.numbers\["wte\.weight"\]\.step must be a finite number, got string', modes=("ls",))
damage_cases("tokens negative", extra_edit(lambda x: x.update(tokens=-1)),
             r"extra_rank_00000\.json: tokens must be a number >= 0, got number -1", modes=("ls",))
damage_cases("best_val a string", extra_edit(lambda x: x.update(best_val="low")),
             r"extra_rank_00000\.json: best_val must be a number, got string \"low\"", modes=("ls",))
damage_cases("precision loss_scale 0",
             extra_edit(lambda x: x.update(precision={"mode": "fp16", "loss_scale": 0, "good_steps": 0, "skipped": 0})),
             r"extra_rank_00000\.json: precision\.loss_scale must be a finite number > 0, got number 0", modes=("ls",))
damage_cases("extra state a JSON list", extra_edit(lambda x: [1, 2]),
             r"extra_rank_00000\.json: rng must be a table", modes=("ls",))


def not_json(tmp, run, name):
    (ckpt_dir(run, name) / "extra_rank_00000.json").write_text('{"rng": {"seed": 1,')


damage_cases("extra state not JSON", not_json, r"extra_rank_00000\.json is corrupt: json: ", modes=("ls", "auto"))
damage_cases("optimizer kind edited adamw -> sgd", extra_edit(lambda x: x["optim"].update(kind="sgd")),
             r"step_000004: the checkpoint's optimizer is 'sgd', this one is 'adamw'", modes=("path",))


@case("RNG seed a string in a checkpoint without kind (an older trainer's): resume still names it",
      expect=r"step_000004/extra_rank_00000\.json: rng\.seed must be an integer >= 0, got string \"abc\"")
def _(fx, tmp):
    run = fx.run(tmp)
    edit_json(ckpt_dir(run) / "manifest.json", lambda m: m.pop("kind") and None)
    edit_json(ckpt_dir(run) / "extra_rank_00000.json", lambda x: x["rng"].update(seed="abc"))
    return fx.pretrain(run, "--resume=%s" % ckpt_dir(run))


# ---- a checkpoint of another model -----------------------------------------------------------

def two_layer_run(fx, tmp):
    """tmp/run: a 2-layer run (checkpoints at steps 2 and 4)."""
    fx.corpus(tmp)
    p = subprocess.run([str(a) for a in fx.pretrain(tmp / "run", "--model.n_layer=2")], cwd=tmp, capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, LUTRA_QUIET="1", CUDA_VISIBLE_DEVICES=""))
    if p.returncode != 0:
        raise RuntimeError("2-layer run: %s%s" % (p.stdout, p.stderr))
    return tmp / "run"


@case("2-layer checkpoint resumed into a 1-layer model: refused, naming the layer counts",
      expect=r"step_000004/manifest\.json does not match this model:\s+the checkpoint holds 2 layers \(blocks\.\*\), "
             r"the model 1: 12 tensors of blocks\.1 are in the checkpoint only")
def _(fx, tmp):
    run = two_layer_run(fx, tmp)
    return fx.pretrain(run, "--resume=%s" % ckpt_dir(run))


@case("2-layer checkpoints with --resume=auto into a 1-layer model: stops listing both, nothing saved over them",
      expect=r"(?s)none that this run can resume from:.*step_000004: .*holds 2 layers.*step_000002: .*holds 2 layers",
      check=kept([S4, S2], ("manifest.json", "rank_00000.lz4")))
def _(fx, tmp):
    run = two_layer_run(fx, tmp)
    remember(tmp, run, [S4, S2], ("manifest.json", "rank_00000.lz4"))
    return fx.pretrain(run, "--resume=auto")


@case("1-layer checkpoint resumed into a 2-layer model: refused, naming the layer counts",
      expect=r"the checkpoint holds 1 layer \(blocks\.\*\), the model 2: 12 tensors of blocks\.1 are missing from it")
def _(fx, tmp):
    run = fx.run(tmp)
    return fx.pretrain(run, "--resume=%s" % ckpt_dir(run), "--model.n_layer=2")


@case("1-layer checkpoints with --resume=auto into a 2-layer model: stops listing both, nothing saved over them",
      expect=r"(?s)none that this run can resume from:.*step_000004: .*holds 1 layer.*step_000002: .*holds 1 layer",
      check=kept([S4, S2], ("manifest.json", "rank_00000.lz4")))
def _(fx, tmp):
    run = fx.run(tmp)
    remember(tmp, run, [S4, S2], ("manifest.json", "rank_00000.lz4"))
    return fx.pretrain(run, "--resume=auto", "--model.n_layer=2")


@case("checkpoint of d_model 16 resumed into d_model 32: refused, naming the shapes",
      expect=r"does not match this model:.*tensor 'wte\.weight' is \{\d+, 16\} in the checkpoint, the model's is \{\d+, 32\}")
def _(fx, tmp):
    run = fx.run(tmp)
    return fx.pretrain(run, "--resume=%s" % ckpt_dir(run), "--model.d_model=32")


# ---- values that are not finite --------------------------------------------------------------

NAN_SCRIPT = """
local ckpt = require "lutra.ckpt"
local dir = os.getenv("CKPT")
local r = ckpt.load(dir)
local tensors = {}
for _, name in ipairs(r:names()) do
  local t = r:tensor(name)
  if name == os.getenv("NAME") then t:view(-1):narrow(0, 2, 1):fill_(0 / 0) end
  tensors[#tensors + 1] = {name = name, tensor = t}
end
local m = r.manifest
ckpt.save(dir, {step = m.step, layout = m.layout, config = m.config, tensors = tensors, extra = r:extra(0),
                kind = m.kind, files = {["tokenizer.json"] = os.getenv("TOK")}}, {latest = false})
"""


def nan_in(fx, tmp, run, tensor_name):
    """Step 4 saved again with one NaN in tensor_name."""
    shutil.copy(run / "tokenizer.json", tmp / "tok.json")
    fx.lutra_script(NAN_SCRIPT, cwd=tmp, CKPT=str(ckpt_dir(run)), NAME=tensor_name, TOK=str(tmp / "tok.json"))


def nan_cases(tensor_name, modes):
    expect = r"step_000004: tensor '%s': 1 of its \d+ values are not finite \(NaN or inf\)" % re.escape(tensor_name)

    @case("NaN in the checkpoint's %s: --resume=PATH stops naming it" % tensor_name, expect=expect)
    def _(fx, tmp):
        run = fx.run(tmp)
        nan_in(fx, tmp, run, tensor_name)
        return fx.pretrain(run, "--resume=%s" % ckpt_dir(run))

    if "auto" in modes:
        @case("NaN in the checkpoint's %s: --resume=auto falls back to step 2" % tensor_name, exit=0,
              expect=r"(?s)(?=.*skipping \S*step_000004: .*%s)(?=.*resumed from \S*step_000002 at step 2)" % expect)
        def _(fx, tmp):
            run = fx.run(tmp)
            nan_in(fx, tmp, run, tensor_name)
            return fx.pretrain(run, "--resume=auto")


nan_cases("blocks.0.mlp.fc.weight", ("auto",))
nan_cases("optim.wte.weight.exp_avg_sq", ())


@case("a valid checkpoint: ckpt ls --verify says valid (the fixture itself)", exit=0,
      expect=r"step_000004\s+4 .* valid .*step_000002\s+2 .* valid")
def _(fx, tmp):
    return ls(fx, fx.run(tmp))
