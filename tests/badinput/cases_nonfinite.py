"""Numbers that go bad in flight: a step whose loss or gradient norm is nan or inf.

By default the run stops (exit 1) with a message naming the step, the loss, the gradient norm
and the first parameter whose gradient holds a nan or inf, without taking the step and without
saving anything after it (no checkpoint, no model directory); --nonfinite=skip skips such steps
and --nonfinite=rollback goes back to the last checkpoint (lua/lutra/train/nonfinite.lua). The bad
steps are made deterministically: --lr=1e30 (step 1's update leaves weights near 1e30, and step 2's
forward overflows to nan in any precision) or LUTRA_FAULT=nan:S (the loss of step S is nan, once
per process: lua/lutra/train/fault.lua).
"""
import json
import subprocess
from pathlib import Path

from badinput import case

STOP = (r"train: step %d: loss nan, gradient norm nan; the first parameter whose gradient holds a nan or inf "
        r"is wte\.weight\. Stopped \(%s\) before the optimizer step, saving nothing of it; %s")


def records(run):
    return [json.loads(line) for line in (Path(run) / "latest/metrics.jsonl").read_text().splitlines() if line.strip()]


def ckpt_steps(run):
    d = Path(run) / "ckpt"
    return sorted(p.name for p in d.glob("step_*")) if d.exists() else []


def nothing_saved(tmp):
    run = tmp / "run"
    if (run / "model").exists():
        return "a model directory was saved after the bad step"
    if ckpt_steps(run):
        return "checkpoints were saved: %s" % ckpt_steps(run)
    return None


def newest_is(step, model_from=None):
    """A check: the run's newest checkpoint is step_<step> (and `latest` names it); no model directory
    was written, or (model_from) the one there is byte for byte the fixture's."""
    def check(tmp):
        run = tmp / "run"
        steps = ckpt_steps(run)
        want = "step_%06d" % step
        if not steps or steps[-1] != want:
            return "checkpoints %s, want the newest to be %s" % (steps, want)
        if (run / "ckpt/latest").read_text().strip() != want:
            return "latest names %s" % (run / "ckpt/latest").read_text().strip()
        if model_from is None and (run / "model").exists():
            return "a model directory was saved after the bad step"
        if model_from is not None:
            ref = tmp / "ref"
            if (run / "model/model.safetensors").read_bytes() != (ref / "model/model.safetensors").read_bytes():
                return "the fixture's model directory was overwritten"
        return None
    return check


def pretrain(fx, tmp, *opts, steps=4):
    fx.corpus(tmp)
    return fx.pretrain(tmp / "run", *opts, steps=steps)


# ---- stop (the default) ---------------------------------------------------------------------------

for precision in ("fp32", "bf16", "fp16"):
    @case("--lr=1e30, %s: the loss turns nan at step 2; stops, saving nothing" % precision,
          expect=STOP % (2, "nonfinite=stop", "the run saved no checkpoint"), check=nothing_saved)
    def _(fx, tmp, precision=precision):
        return pretrain(fx, tmp, "--lr=1e30", "--precision=" + precision)


@case("--lr=1e30 --grad_accum=2: stops at step 2", expect=STOP % (2, "nonfinite=stop", "the run saved no checkpoint"),
      check=nothing_saved)
def _(fx, tmp):
    return pretrain(fx, tmp, "--lr=1e30", "--grad_accum=2")


def stopped_at_3(tmp):
    why = newest_is(2)(tmp)
    if why:
        return why
    last = records(tmp / "run")[-1]
    if (last.get("step"), last.get("nonfinite"), last.get("nonfinite_param"), last.get("loss")) != (3, "stop", "wte.weight", None):
        return "metrics.jsonl ends with %s" % last
    return None


@case("a nan loss at step 3 (LUTRA_FAULT=nan:3): stops; the step 2 checkpoint stays the newest",
      expect=STOP % (3, "nonfinite=stop", r"the newest checkpoint is \S*/run/ckpt/step_000002\."),
      env={"LUTRA_FAULT": "nan:3"}, check=stopped_at_3)
def _(fx, tmp):
    return pretrain(fx, tmp)


@case("a nan loss in the first micro-batch of step 2 (--grad_accum=2): stops at step 2",
      expect=STOP % (2, "nonfinite=stop", "the run saved no checkpoint"), env={"LUTRA_FAULT": "nan:2"},
      check=nothing_saved)
def _(fx, tmp):
    return pretrain(fx, tmp, "--grad_accum=2")


def resumed(fx, tmp, *opts, steps=8):
    run = fx.run(tmp)
    fx.model_dir(tmp / "ref")  # the fixture's model directory, to compare with
    return fx.pretrain(run, "--resume=auto", *opts, steps=steps)


@case("resumed at step 4, a nan at step 6: stops; the checkpoint it resumed from stays the newest, the model "
      "directory is untouched",
      expect=STOP % (6, "nonfinite=stop", r"the newest checkpoint is \S*/run/ckpt/step_000004\."),
      env={"LUTRA_FAULT": "nan:6"}, check=newest_is(4, model_from=True))
def _(fx, tmp):
    return resumed(fx, tmp)


# ---- skip ----------------------------------------------------------------------------------------

def skipped_3(tmp):
    recs = [r for r in records(tmp / "run") if r.get("step") == 3 and "val_loss" not in r]
    if len(recs) != 1 or (recs[0].get("skipped"), recs[0].get("nonfinite_skips")) != (1, 1):
        return "metrics.jsonl's step 3: %s" % recs
    if not (tmp / "run/model/model.safetensors").exists():
        return "no model directory"
    return None


@case("--nonfinite=skip: the nan step is skipped, counted in the metrics, and the run goes on",
      expect=r"step 3: loss nan, gradient norm nan; the first parameter whose gradient holds a nan or inf is "
             r"wte\.weight; step skipped \(nonfinite=skip: 1 in a row, 1 in all\).*trained 4 steps",
      exit=0, env={"LUTRA_FAULT": "nan:3"}, check=skipped_3)
def _(fx, tmp):
    return pretrain(fx, tmp, "--nonfinite=skip")


@case("--nonfinite=skip --nonfinite_max_skips=1 --lr=1e30: the second bad step in a row stops",
      expect=STOP % (3, r"nonfinite=skip: 1 step in a row skipped before it, nonfinite_max_skips = 1",
                     r"the newest checkpoint is \S*/run/ckpt/step_000002\."),
      check=newest_is(2))
def _(fx, tmp):
    return pretrain(fx, tmp, "--lr=1e30", "--nonfinite=skip", "--nonfinite_max_skips=1")


@case("--nonfinite=skip --lr=1e30: documented: skipping does not repair weights, every later step is skipped "
      "too (up to nonfinite_max_skips in a row)",
      expect=r"step 4: loss nan, gradient norm nan; .*step skipped \(nonfinite=skip: 3 in a row, 3 in all\)", exit=0)
def _(fx, tmp):
    return pretrain(fx, tmp, "--lr=1e30", "--nonfinite=skip")


# ---- rollback -------------------------------------------------------------------------------------

def same_model_as_fixture(tmp):
    ref = tmp / "ref"
    if (tmp / "run/model/model.safetensors").read_bytes() != (ref / "model/model.safetensors").read_bytes():
        return "the rolled-back run's model differs from the uninterrupted run's"
    return None


@case("--nonfinite=rollback: a nan at step 3 goes back to step 2 and ends bitwise as the run without it",
      expect=r"step 3: loss nan, gradient norm nan; the first parameter whose gradient holds a nan or inf is "
             r"wte\.weight; rolled back to \S*/run/ckpt/step_000002 \(step 2; nonfinite=rollback, 1 of at most 3\)",
      exit=0, env={"LUTRA_FAULT": "nan:3"}, check=same_model_as_fixture)
def _(fx, tmp):
    fx.model_dir(tmp / "ref")  # the fixture: the same 4 steps, uninterrupted
    return pretrain(fx, tmp, "--nonfinite=rollback")


@case("--nonfinite=rollback, resumed at step 4, a nan at step 5: goes back to the checkpoint it resumed from",
      expect=r"step 5: loss nan, .*rolled back to \S*/run/ckpt/step_000004 \(step 4; nonfinite=rollback, 1 of at most 3\)"
             r".*trained 8 steps",
      exit=0, env={"LUTRA_FAULT": "nan:5"})
def _(fx, tmp):
    return resumed(fx, tmp, "--nonfinite=rollback")


@case("--nonfinite=rollback --lr=1e30: no checkpoint yet at step 2: stops",
      expect=STOP % (2, "nonfinite=rollback: no checkpoint to roll back to yet", "the run saved no checkpoint"),
      check=nothing_saved)
def _(fx, tmp):
    return pretrain(fx, tmp, "--lr=1e30", "--nonfinite=rollback")


@case("--nonfinite=rollback --lr=1e30 --ckpt_every=1: the replayed step fails again: stops",
      expect=STOP % (2, r"nonfinite=rollback: it failed again after rolling back to \S*/run/ckpt/step_000001",
                     r"the newest checkpoint is \S*/run/ckpt/step_000001\."),
      check=newest_is(1))
def _(fx, tmp):
    return pretrain(fx, tmp, "--lr=1e30", "--nonfinite=rollback", "--ckpt_every=1")


# ---- the settings -----------------------------------------------------------------------------------

@case("--nonfinite=rollback --ckpt_every=0: nothing to roll back to",
      expect=r'config\.nonfinite = "rollback" goes back to the last checkpoint: set run_dir and ckpt_every')
def _(fx, tmp):
    return pretrain(fx, tmp, "--nonfinite=rollback", "--ckpt_every=0")


for option, expect in [("--nonfinite=ignore", r"nonfinite.*ignore"),
                       ("--nonfinite_max_skips=0", r"config\.nonfinite_max_skips must be an integer >= 1, got 0"),
                       ("--nonfinite_max_skips=2.5", r"nonfinite_max_skips.*2\.5"),
                       ("--nonfinite_max_rollbacks=-1", r"nonfinite_max_rollbacks.*-1")]:
    @case("pretrain %s" % option, expect=expect)
    def _(fx, tmp, option=option):
        return pretrain(fx, tmp, option)


# ---- sft and dpo ------------------------------------------------------------------------------------

def model64(fx, tmp):
    """A model directory with block_size 64 (room for a short chat), trained one step on the corpus."""
    def build(out):
        data = fx.corpus(out)
        cmd = fx.lutra_cmd(fx.root / "recipes/pretrain.lua", "--data=%s" % data, "--steps=1", "--model.n_layer=1",
                           "--model.d_model=16", "--model.n_head=2", "--model.block_size=64", "--batch=2",
                           "--eval_every=0", "--threads=1", "--sample_tokens=0", "--run_dir=%s" % (out / "run"))
        p = subprocess.run(cmd, cwd=out, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError("model64: %s\n%s" % (p.stdout, p.stderr))
    return fx._once("model64", build) / "run/model"


def chats(tmp):
    """SFT and DPO data in the corpus's characters."""
    msg = {"messages": [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "the quick fox"}]}
    pair = {"prompt": "hello", "chosen": " world", "rejected": " dog"}
    for name, obj, n in (("sft_train", msg, 20), ("sft_val", msg, 4), ("dpo_train", pair, 16), ("dpo_val", pair, 4)):
        (tmp / (name + ".jsonl")).write_text("".join(json.dumps(obj) + "\n" for _ in range(n)))


def sft(fx, tmp, *opts):
    chats(tmp)
    return fx.lutra_cmd(fx.root / "recipes/sft.lua", "--model=%s" % model64(fx, tmp), "--train_data=sft_train.jsonl",
                        "--val_data=sft_val.jsonl", "--steps=3", "--batch=2", "--eval_answers=1", "--threads=1",
                        "--run_dir=%s" % (tmp / "run"), *opts)


@case("sft: a nan loss at step 2 stops before the update; no model directory is written",
      expect=STOP % (2, "nonfinite=stop", "the run saved no checkpoint"), env={"LUTRA_FAULT": "nan:2"},
      check=nothing_saved)
def _(fx, tmp):
    return sft(fx, tmp)


@case("sft --nonfinite=rollback without --ckpt_every: nothing to roll back to",
      expect=r'config\.nonfinite = "rollback" goes back to the last checkpoint: set run_dir and ckpt_every')
def _(fx, tmp):
    return sft(fx, tmp, "--nonfinite=rollback")


def dpo(fx, tmp, *opts):
    chats(tmp)
    return fx.lutra_cmd(fx.root / "recipes/dpo.lua", "--model=%s" % model64(fx, tmp), "--train_data=dpo_train.jsonl",
                        "--val_data=dpo_val.jsonl", "--steps=3", "--batch=2", "--mode=full", "--lr=1e30", "--threads=1",
                        "--out=%s" % (tmp / "out"), *opts)


def dpo_nothing_saved(tmp):
    return "dpo saved %s" % list((tmp / "out").iterdir()) if (tmp / "out").exists() else None


@case("dpo --lr=1e30: its own loop stops at step 2 before the update, saving nothing",
      expect=r"dpo: step 2: loss nan, gradient norm nan; the first parameter whose gradient holds a nan or inf is "
             r"wte\.weight; stopped before the optimizer step, saving nothing", check=dpo_nothing_saved)
def _(fx, tmp):
    return dpo(fx, tmp)


@case("dpo --lr=1e30 --nonfinite=skip: documented: the bad steps are skipped and said",
      expect=r"step 3: loss nan, gradient norm nan; .*step skipped \(nonfinite=skip: 2 in a row\)", exit=0)
def _(fx, tmp):
    return dpo(fx, tmp, "--nonfinite=skip")


@case("dpo --nonfinite=rollback: not a choice of its loop", expect=r"nonfinite.*rollback")
def _(fx, tmp):
    return dpo(fx, tmp, "--nonfinite=rollback")
