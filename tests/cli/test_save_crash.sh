#!/usr/bin/env bash
# Saves that die: a training run (recipes/pretrain.lua, a checkpoint every step, saved in the
# background as by default) is killed with SIGKILL 20 times at random moments: half by kill -9
# from outside at a random delay once it is saving, half by the LUTRA_FAULT=write:N hook at a
# random byte of what it writes (a shard, an extra, the manifest, `latest`: lutra.h, "files
# written safely"). After each kill `lutra ckpt ls --verify` must find every listed checkpoint
# valid and list nothing but step_N directories (no temporary taken for a checkpoint), and the
# next run (--resume=auto) must resume from the step `latest` names, with no checkpoint skipped.
# Then a full disk: run_dir on a small tmpfs (in a mount namespace of its own: unshare -rm, or
# mount as root; else the test is skipped, 77) where the second checkpoint does not fit: the run
# stops (exit 1) with the shard file named and "no space left on device", leaves no temporary,
# and the first checkpoint still verifies and resumes once there is room.
# usage: test_save_crash.sh LUTRA  (SAVE_CRASH_SEED=N repeats a run's random moments)
set -u
LUTRA=$(realpath "${1:?usage: test_save_crash.sh path/to/lutra}")
cd "$(dirname "$0")/../.." || exit 1
. tests/cli/check.sh

MODEL=(--model.n_layer=2 --model.d_model=256 --model.n_head=4 --model.block_size=32 --batch=2 --eval_every=0
       --threads=1 --sample_tokens=0 --warmup=1)

# ---- a full disk (run inside a mount namespace by the part below) ----------------------------------
if [ "${2:-}" = --full-disk ]; then
  T=$3
  D=$T/disk
  SMALL=(--model.n_layer=2 --model.d_model=128 --model.n_head=4 --model.block_size=32 --batch=2 --eval_every=0
         --threads=1 --sample_tokens=0 --warmup=1 --ckpt_every=1 --ckpt_keep=2 --data="$T/c.txt")
  # the size of one checkpoint, from a run on the ordinary disk
  "$LUTRA" recipes/pretrain.lua "${SMALL[@]}" --steps=1 --run_dir="$T/sized" >/dev/null 2>&1
  one=$(du -sk "$T/sized/ckpt/step_000001" | cut -f1)
  [ "${one:-0}" -gt 500 ] || { echo "FAIL: sizing run: ${one:-no} KB"; exit 1; }
  mkdir -p "$D"
  # room for the run's small files and one checkpoint, not for a second
  mount -t tmpfs -o size=$((one * 3 / 2 + 256))k tmpfs "$D" || { echo "skipped: cannot mount a tmpfs"; exit 77; }
  out=$("$LUTRA" recipes/pretrain.lua "${SMALL[@]}" --steps=3 --run_dir="$D/run" 2>&1)
  rc=$?
  expect_eq "full disk: the run stops with an error" "$rc" 1
  expect_grep "full disk: the error names the file and the reason" "$out" \
    "cannot write $D/run/ckpt/step_000002\.tmp/[a-z_0-9.]+: no space left on device"
  expect_grep "full disk: the error says which save failed" "$out" "ckpt\.save: $D/run/ckpt/step_000002"
  left=$(find "$D/run" -name '*.tmp.*' | wc -l)
  expect_eq "full disk: the failed file's temporary is removed" "$left" 0
  expect_eq "full disk: latest still names step 1" "$(cat "$D/run/ckpt/latest")" step_000001
  ls_out=$("$LUTRA" ckpt ls "$D/run/ckpt" --verify 2>&1)
  expect_eq "full disk: ckpt ls --verify exits 0" "$?" 0
  expect_grep "full disk: step 1 is valid" "$ls_out" '^step_000001 .* valid  <- latest'
  expect_eq "full disk: nothing but step 1 is listed" "$(printf '%s\n' "$ls_out" | grep -c '^step_')" 1
  # with room again, the first checkpoint resumes and the run goes on to the end
  mount -o remount,size=$((one * 8 + 4096))k "$D"
  out=$("$LUTRA" recipes/pretrain.lua "${SMALL[@]}" --steps=3 --run_dir="$D/run" --resume=auto 2>&1)
  expect_eq "full disk: the resumed run ends well" "$?" 0
  expect_grep "full disk: resumed from step 1" "$out" "resumed from $D/run/ckpt/step_000001 at step 1"
  expect_grep "full disk: trained to step 3" "$out" 'step 3/3'
  umount "$D"
  echo "full disk: $pass passed, $fail failed"
  [ "$fail" = 0 ]
  exit
fi

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
seed=${SAVE_CRASH_SEED:-$(( $$ % 32768 ))}
RANDOM=$seed
echo "seed $seed (SAVE_CRASH_SEED=$seed repeats these moments)"
"$LUTRA" -e "require('lutra.testing').word_corpus('$T/c.txt', {'the', 'quick', 'brown', 'fox', 'jumps', 'over',
  'a', 'lazy', 'dog', 'hello', 'world'}, 30000, 7)" || exit 1

RUN=$T/run
ARGS=(recipes/pretrain.lua --data="$T/c.txt" "${MODEL[@]}" --steps=100000 --ckpt_every=1 --ckpt_keep=2
      --run_dir="$RUN" --resume=auto)
latest_step() { sed -n 's/^step_0*\([0-9][0-9]*\)$/\1/p' "$RUN/ckpt/latest" 2>/dev/null; }
# the steps of the training records of the newest run, one a line
train_steps() { sed -n '/"loss"/s/.*"step":\([0-9]*\).*/\1/p' "$RUN/latest/metrics.jsonl" 2>/dev/null; }
mid_save=0
for i in $(seq 1 20); do
  before=$(latest_step)
  if [ $((i % 2)) = 1 ]; then
    # the hook: SIGKILL at a random byte of the files this run writes (about 17 MB a save)
    at=$(( (RANDOM * 32768 + RANDOM) % 60000000 ))
    how="LUTRA_FAULT=write:$at"
    LUTRA_FAULT=write:$at "$LUTRA" "${ARGS[@]}" >"$T/out" 2>"$T/err" &
    wait $! 2>/dev/null # (the shell's "Killed" notice goes with wait's stderr)
    rc=$?
  else
    # from outside: once the run has committed a save of its own, a random 0-400 ms later
    "$LUTRA" "${ARGS[@]}" >"$T/out" 2>"$T/err" &
    pid=$!
    for _ in $(seq 1 1500); do
      now=$(latest_step)
      [ -n "$now" ] && [ "$now" != "$before" ] && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.02
    done
    delay=$(( RANDOM % 400 ))
    how="kill -9 after a save and ${delay} ms"
    sleep "$(printf '0.%03d' "$delay")"
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    rc=$?
  fi
  expect_eq "kill $i ($how): the run died by SIGKILL" "$rc" 137
  [ "$rc" = 137 ] || { tail -5 "$T/err"; continue; }
  skipped=$(grep -c 'skipping' "$T/err")
  expect_eq "kill $i: resume=auto skipped no checkpoint" "$skipped" 0
  # the run resumed from the step `latest` named when it started, and its metrics read as one run
  # (records after that step, written before the kill, were dropped): steps 1, 2, ... n
  if [ -n "$before" ]; then
    grep -q "resumed from .*step_0*$before at step $before" "$T/out" && ok || bad "kill $i: resumed from step $before"
  fi
  seq_ok=$(train_steps | awk 'BEGIN { ok = 1 } { if ($1 != NR) ok = 0 } END { print ok }')
  expect_eq "kill $i: the run's metrics.jsonl has steps 1..n, once each" "$seq_ok" 1
  # inside a save: the next step's temporary directory is there, or its checkpoint is committed
  # and `latest` not yet replaced
  next=$(printf '%s/ckpt/step_%06d' "$RUN" $(( $(latest_step || true) + 1 )))
  if [ -d "$next.tmp" ] || [ -d "$next" ]; then mid_save=$((mid_save + 1)); fi
  if [ -n "$(latest_step)" ]; then
    ls_out=$("$LUTRA" ckpt ls "$RUN/ckpt" --verify 2>&1)
    expect_eq "kill $i: ckpt ls --verify: every listed checkpoint is valid" "$?" 0
    rows=$(printf '%s\n' "$ls_out" | tail -n +2 | grep -c .)
    steps=$(find "$RUN/ckpt" -maxdepth 1 -name 'step_*' | grep -cE '/step_[0-9]+$')
    expect_eq "kill $i: only step_N directories are listed" "$rows" "$steps"
    expect_grep "kill $i: the checkpoint latest names is listed valid" "$ls_out" \
      "^step_0*$(latest_step) .* valid  <- latest"
  fi
done
echo "$mid_save of 20 kills landed inside a save"
expect_num "most kills landed inside a save" "$mid_save" ">=" 10
# after all that, a run to the end resumes and cleans up what the kills left
end=$(( $(latest_step) + 2 ))
out=$("$LUTRA" recipes/pretrain.lua --data="$T/c.txt" "${MODEL[@]}" --steps=$end --ckpt_every=1 --ckpt_keep=2 \
  --run_dir="$RUN" --resume=auto 2>&1)
expect_eq "the last run ends well" "$?" 0
expect_grep "the last run resumed" "$out" "resumed from $RUN/ckpt/step_0*$((end - 2)) at step $((end - 2))"
expect_eq "the last run: its step is the latest" "$(latest_step)" "$end"
left=$(find "$RUN/ckpt" -maxdepth 1 \( -name '*.tmp' -o -name '*.tmp.*' -o -name '*.old-*' \) | wc -l)
expect_eq "the leftovers of killed saves are pruned" "$left" 0
"$LUTRA" ckpt ls "$RUN/ckpt" --verify >/dev/null 2>&1
expect_eq "the end: every checkpoint is valid" "$?" 0

# ---- a full disk, in a mount namespace of its own -----------------------------------------------
if unshare -rm true 2>/dev/null; then
  unshare -rm bash "$0" "$LUTRA" --full-disk "$T"
  rc=$?
elif [ "$(id -u)" = 0 ]; then
  bash "$0" "$LUTRA" --full-disk "$T"
  rc=$?
  umount "$T/disk" 2>/dev/null
else
  rc=77
fi
if [ "$rc" = 77 ]; then
  echo "$pass passed, $fail failed; the full disk part skipped (no unshare -rm, not root)"
  [ "$fail" = 0 ] && exit 77
  exit 1
fi
[ "$rc" = 0 ] && ok || bad "the full disk part failed"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
