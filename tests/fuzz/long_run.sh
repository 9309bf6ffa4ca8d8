#!/usr/bin/env bash
# long_run.sh BUILD_DIR RUNS [NAME...] — the long search: every fuzzer (the libFuzzer harnesses built
# in BUILD_DIR/tests/fuzz and the Lua targets of tests/fuzz/targets_*.lua) runs RUNS executions from
# a seed other than the ctest one, two at a time, and a table of executions, seconds and failures is
# printed at the end. NAMEs (fuzz_json, lua:sft_jsonl, ...) limit the run to those.
#
#   bash tests/fuzz/long_run.sh build 10000000
#
# A failure's input is left in BUILD_DIR/tests/fuzz/long/ (crash-*); rerun the harness on it to see.
set -u
build=$(realpath "${1:?usage: long_run.sh BUILD_DIR RUNS [NAME...]}")
runs=${2:?usage: long_run.sh BUILD_DIR RUNS [NAME...]}
shift 2
src=$(cd "$(dirname "$0")" && pwd)
out=$build/tests/fuzz/long
mkdir -p "$out"
rm -f "$out"/*.summary
seed=${LUTRA_LONG_FUZZ_SEED:-7}

jobs=()
for bin in "$build"/tests/fuzz/fuzz_*; do
  [ -x "$bin" ] && [ -f "$bin" ] && jobs+=("$(basename "$bin")")
done
for t in "$src"/targets_*.lua; do
  [ -f "$t" ] || continue
  for name in $("$build/lutra" -e "local t = dofile('$t'); local n = {}; for k in pairs(t) do n[#n + 1] = k end; table.sort(n); print(table.concat(n, ' '))"); do
    jobs+=("lua:$name:$t")
  done
done
if [ $# -gt 0 ]; then
  keep=()
  for j in "${jobs[@]}"; do
    for want in "$@"; do [[ $j == "$want" || $j == "$want":* ]] && keep+=("$j"); done
  done
  jobs=("${keep[@]}")
fi

run_one() {
  local job=$1 log start rc label=$1
  [[ $job == lua:* ]] && label=${job%:*}
  start=$SECONDS
  if [[ $job == lua:* ]]; then
    local name=${job#lua:}; local file=${name#*:}; name=${name%%:*}
    log=$out/lua_$name.log
    (cd "$src/../.." && CUDA_VISIBLE_DEVICES= "$build/lutra" "$src/lua_fuzz.lua" "$file" "$name" --runs="$runs" \
      --seed="$seed" --crash_dir="$out") >"$log" 2>&1
    rc=$?
    execs=$(grep -o '[0-9]* executions in' "$log" | tail -1 | cut -d' ' -f1)
  else
    log=$out/$job.log
    local corpus=$out/corpus_${job#fuzz_}
    rm -rf "$corpus" && mkdir -p "$corpus"
    local dict=() seeds=$src/corpus_${job#fuzz_}
    [ -f "$src/${job#fuzz_}.dict" ] && dict=(-dict="$src/${job#fuzz_}.dict")
    "$build/tests/fuzz/$job" -runs="$runs" -seed="$seed" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
      -detect_leaks=0 -print_final_stats=1 -artifact_prefix="$out/crash-${job#fuzz_}-" "${dict[@]}" \
      "$corpus" $( [ -d "$seeds" ] && echo "$seeds" ) >"$log" 2>&1
    rc=$?
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  fi
  printf '%-22s %12s executions %6d s  %s\n' "$label" "${execs:-?}" $((SECONDS - start)) \
    "$([ "$rc" = 0 ] && echo "0 failures" || echo "FAILED (exit $rc): $log")" >"$log.summary"
}

for ((i = 0; i < ${#jobs[@]}; i += 2)); do
  run_one "${jobs[i]}" &
  [ $((i + 1)) -lt ${#jobs[@]} ] && run_one "${jobs[i + 1]}" &
  wait
done
echo "long_run: $runs executions each, seed $seed"
cat "$out"/*.summary
! grep -q FAILED "$out"/*.summary
