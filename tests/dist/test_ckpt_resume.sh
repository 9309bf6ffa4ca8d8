#!/usr/bin/env bash
# Checkpoints through the trainer, across processes (ctest: bash FILE LUTRA MPIRUN, label dist),
# small gpt2 in f64 (resharding between every pair of layouts: test_ckpt_reshard.sh):
# - exact resume: N steps + save + resume + N steps == 2N straight steps, bitwise, under the
#   same layout (dp, zero 1, zero 3);
# - automatic restart: `lutra launch --max-restarts` survives a rank killed at steps 2, 5 and 7
#   (fixed: a failure reproduces; the final weights and loss equal the unfaulted run's
#   bitwise), a hang (the watchdog), and a rank lost (--min-ranks: the job comes back on
#   fewer ranks, resharded, within 1e-9 relative of one process).
# scripts/ckpt_train.lua is the job; scripts/ckpt_compare.lua compares the gathered weights.
LUTRA=$(realpath "${1:?usage: test_ckpt_resume.sh LUTRA MPIRUN}")
export LUTRA_QUIET=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} # the ranks' threads: as ctest was run, 1 when unset
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
S=tests/dist/scripts
T=$(mktemp -d)
export TMPDIR=$T
trap 'rm -rf "$T"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/../cli/check.sh"
job() { # NP RUN_DIR OUT STEPS LAYOUT [UNTIL]  (NP 0: one process, no launcher)
  local np=$1
  shift
  if [ "$np" = 0 ]; then timeout 300 "$LUTRA" $S/ckpt_train.lua "$@"; else
    timeout 300 "$LUTRA" launch -n "$np" $S/ckpt_train.lua "$@"; fi
}
same() { # WHAT A B TOL
  local out
  if out=$("$LUTRA" $S/ckpt_compare.lua "$2" "$3" "$4" 2>&1); then ok; echo "  $1: $out"; else bad "$1: $out"; fi
}
last_loss() { grep '^loss 8 ' "$1" | tail -1 | cut -d' ' -f3; }

# one process, 8 steps straight: the reference
job 0 "$T/ref" "$T/ref.st" 8 single >"$T/ref.log" 2>&1 || bad "reference run failed: $(tail -3 "$T/ref.log")"

# ---- exact resume, same layout -------------------------------------------------------------
for layout in dp=2 dp=2,zero=1 dp=2,zero=3; do
  job 2 "$T/s_$layout" "$T/s_$layout.st" 8 "$layout" >"$T/s.log" 2>&1 || bad "$layout straight: $(tail -3 "$T/s.log")"
  job 2 "$T/r_$layout" "$T/x.st" 8 "$layout" 4 >"$T/r1.log" 2>&1 || bad "$layout first half: $(tail -3 "$T/r1.log")"
  job 2 "$T/r_$layout" "$T/r_$layout.st" 8 "$layout" >"$T/r2.log" 2>&1 || bad "$layout resumed: $(tail -3 "$T/r2.log")"
  same "exact resume $layout (bitwise weights)" "$T/s_$layout.st" "$T/r_$layout.st" 0
  [ "$(last_loss "$T/s.log")" = "$(last_loss "$T/r2.log")" ] && ok ||
    bad "exact resume $layout: step-8 loss $(last_loss "$T/r2.log") vs $(last_loss "$T/s.log") straight"
done

# ---- automatic restart ---------------------------------------------------------------------
job 2 "$T/u" "$T/u.st" 8 dp=2 >"$T/u.log" 2>&1 || bad "unfaulted dp2 run: $(tail -3 "$T/u.log")"
tried=0
survived=0
k=0
for step in 2 5 7; do
  k=$((k + 1))
  tried=$((tried + 1))
  if LUTRA_FAULT="step:$step@1" timeout 300 "$LUTRA" launch -n 2 --max-restarts 2 $S/ckpt_train.lua "$T/f$k" \
    "$T/f$k.st" 8 dp=2 >"$T/f.log" 2>"$T/f.err" && grep -q "fault injected" "$T/f.err" &&
    grep -q "restart 1 of 2" "$T/f.err" &&
    "$LUTRA" $S/ckpt_compare.lua "$T/u.st" "$T/f$k.st" 0 >/dev/null &&
    [ "$(last_loss "$T/f.log")" = "$(last_loss "$T/u.log")" ]; then
    survived=$((survived + 1))
  else
    echo "  fault at step $step: $(tail -3 "$T/f.err")"
  fi
done
echo "  restart: $survived of $tried runs with rank 1 killed at steps 2, 5, 7 finished with the unfaulted weights and loss"
[ "$survived" = "$tried" ] && ok || bad "restart: $survived of $tried survived"

# a hang: rank 0 stops after a step; rank 1's watchdog ends the job, which restarts and finishes
if LUTRA_FAULT="hang:4@0" LUTRA_COMM_TIMEOUT=3 timeout 300 "$LUTRA" launch -n 2 --max-restarts 1 $S/ckpt_train.lua \
  "$T/h" "$T/h.st" 8 dp=2 >"$T/h.log" 2>"$T/h.err" && grep -q "has not completed after 3 s" "$T/h.err" &&
  grep -q "restart 1 of 1" "$T/h.err"; then ok; else bad "hang: $(tail -5 "$T/h.err")"; fi
same "hang, watchdog, restart: the unfaulted weights" "$T/u.st" "$T/h.st" 0

# a rank lost: the job comes back on 2 of its 4 ranks (dp = "auto"), resharded
if LUTRA_FAULT="lose:3@3" timeout 300 "$LUTRA" launch -n 4 --max-restarts 1 --min-ranks 2 $S/ckpt_train.lua "$T/l" \
  "$T/l.st" 8 zero=1 >"$T/l.log" 2>"$T/l.err" && grep -q "restart 1 of 1 on 2 ranks" "$T/l.err"; then ok; else
  bad "lost rank: $(grep -m5 -E 'lua:|rror' "$T/l.err") $(tail -3 "$T/l.err")"
fi
same "lost rank: 4 ranks, then 2, vs one process" "$T/ref.st" "$T/l.st" 1e-9
# below --min-ranks: the launcher gives up, with the job's status
LUTRA_FAULT="lose:3@1" timeout 300 "$LUTRA" launch -n 2 --max-restarts 1 --min-ranks 2 $S/ckpt_train.lua "$T/g" \
  "$T/g.st" 8 dp=2 >/dev/null 2>"$T/g.err"
st=$?
[ "$st" != 0 ] && grep -q "below --min-ranks 2: giving up" "$T/g.err" && ok || bad "min-ranks: status $st, $(tail -2 "$T/g.err")"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
