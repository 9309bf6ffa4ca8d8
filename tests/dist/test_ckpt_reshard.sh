#!/usr/bin/env bash
# Resharding is data movement: every pair of layouts among one process, dp2 zero1, dp2 zero3,
# tp2, pp2, tp2 pp2 and dp2 tp2 (ctest: bash FILE LUTRA MPIRUN, label dist). Small gpt2 in f64:
# - each layout trains 4 steps and saves; its state is gathered whole (ckpt_reshard.lua save);
# - each layout loads every save and gathers what it loaded, before any step: bitwise equal
#   to what was saved (weights, AdamW moments, step, optimizer numbers, RNG, loader position);
# - then trains on to step 8: parameters and losses within 1e-9 relative of one process
#   trained 8 steps straight (f64: the same math in another order agrees to ~1e-12).
# 7 saves and 7 loading jobs (each loads all 7) and one process for the 147 checks.
LUTRA=$(realpath "${1:?usage: test_ckpt_reshard.sh LUTRA MPIRUN}")
export LUTRA_QUIET=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} # the ranks' threads: as ctest was run, 1 when unset
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
S=tests/dist/scripts
T=$(mktemp -d)
export TMPDIR=$T
trap '[ -n "$LUTRA_KEEP_TMP" ] || rm -rf "$T"' EXIT
fail=0

# name -> ranks and layout
names=(single dp2z1 dp2z3 tp2 pp2 tp2pp2 dp2tp2)
declare -A np=([single]=0 [dp2z1]=2 [dp2z3]=2 [tp2]=2 [pp2]=2 [tp2pp2]=4 [dp2tp2]=4)
declare -A layout=([single]=single [dp2z1]=dp=2,zero=1 [dp2z3]=dp=2,zero=3 [tp2]=tp=2 [pp2]=pp=2
  [tp2pp2]=tp=2,pp=2 [dp2tp2]=dp=2,tp=2)

job() { # NP ARGS...  (NP 0: one process, no launcher)
  local n=$1
  shift
  if [ "$n" = 0 ]; then timeout 600 "$LUTRA" $S/ckpt_reshard.lua "$@"; else
    timeout 600 "$LUTRA" launch -n "$n" $S/ckpt_reshard.lua "$@"; fi
}

job 0 straight "$T/ref" >"$T/ref.log" 2>&1 || { echo "FAIL: the straight run: $(tail -3 "$T/ref.log")"; fail=1; }
dirs=()
for a in "${names[@]}"; do
  mkdir -p "$T/$a"
  dirs+=("$T/$a")
  job "${np[$a]}" save "$T/$a" "${layout[$a]}" >"$T/save.log" 2>&1 ||
    { echo "FAIL: save under $a: $(tail -3 "$T/save.log")"; fail=1; }
done
list=$T/checks
: >"$list"
for b in "${names[@]}"; do
  job "${np[$b]}" load "$b" "${layout[$b]}" "${dirs[@]}" >"$T/load.log" 2>&1 ||
    { echo "FAIL: loads under $b: $(tail -5 "$T/load.log")"; fail=1; }
  for a in "${names[@]}"; do
    same=0
    [ "$a" = "$b" ] && same=1
    echo "state $T/$a/saved $T/$a/$b.loaded $same" >>"$list"
    echo "final $T/$a/$b.final.safetensors $T/ref.final.safetensors" >>"$list"
    echo "losses $T/$a/$b.losses $T/ref.losses" >>"$list"
  done
done
"$LUTRA" $S/state_compare.lua "$list" >"$T/compare.log" 2>&1 || fail=1
sed "s|$T/||g" "$T/compare.log"
[ "$fail" = 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
[ "$fail" = 0 ]
