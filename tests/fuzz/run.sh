#!/usr/bin/env bash
# run.sh HARNESS WORK_DIR [libFuzzer options and corpus dirs...] — one fuzz.* run that
# replays the same inputs every time, so that a failure reproduces by running it again:
# - WORK_DIR (the corpus libFuzzer writes to) starts empty: only the committed seeds count;
# - the options carry a fixed -seed and -runs (tests/fuzz/CMakeLists.txt); -reload=0 and
#   -len_control=0 take out libFuzzer's clock (re-reading the corpus, growing the input
#   length once a second); -detect_leaks=0 its per-input leak check, which its own threads'
#   allocations trigger at random (leaks still fail the run: LeakSanitizer checks at exit,
#   ASAN_OPTIONS=detect_leaks=1, and the input is found again by running it with the check);
# - no address-space randomisation (setarch -R, where the system allows it): the parsers
#   compare pointers (lz4's bounds), and libFuzzer feeds compared values back into its
#   mutations, so random addresses would mean different inputs.
set -u
harness=${1:?usage: run.sh HARNESS WORK_DIR [libFuzzer args...]}
work=${2:?usage: run.sh HARNESS WORK_DIR [libFuzzer args...]}
shift 2
rm -rf "$work" && mkdir -p "$work" || exit 1
cmd=("$harness" -reload=0 -len_control=0 -detect_leaks=0 "$@")
if setarch -R true 2>/dev/null; then
  cmd=(setarch -R "${cmd[@]}")
else
  echo "run.sh: setarch -R is not allowed here: addresses are random, the run may not replay exactly"
fi
echo "run.sh: ${cmd[*]}"
exec "${cmd[@]}"
