#!/usr/bin/env bash
# bench/compare_torch.sh — the GPT-2 training step, ours against PyTorch's, interleaved.
#   bench/compare_torch.sh [-n RUNS] [-- OPTIONS...]
# Runs bench/gpt_step.lua and the peer script (../shared/peers/torch_gpt.py) RUNS times
# each (default 3), alternating, with the same OPTIONS (--layers --heads --dim --seq
# --vocab --batch --steps --warmup --threads; default: the peer's defaults). Prints every
# run, then the median tokens/s and peak RSS of each and the ratios ours/torch.
# Environment: LUTRA (default build/lutra, else the first build*/lutra found),
# TORCH_GPT (the peer script), PYTHON (default /usr/bin/python3), TORCH_ENV (variables for
# the peer's runs only, e.g. TORCH_ENV=OMP_WAIT_POLICY=passive: PyTorch's OpenMP workers spin
# between ops, which costs it much on a machine whose cores are busy with other work).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=3
if [[ "${1:-}" == "-n" ]]; then
  runs="$2"
  shift 2
fi
[[ "${1:-}" == "--" ]] && shift

lutra="${LUTRA:-}"
if [[ -z "$lutra" ]]; then
  for c in build/lutra build*/lutra; do
    if [[ -x "$c" ]]; then lutra="$c"; break; fi
  done
fi
[[ -x "$lutra" ]] || { echo "compare_torch: no lutra binary (set LUTRA=path)" >&2; exit 2; }
peer="${TORCH_GPT:-../shared/peers/torch_gpt.py}"
python="${PYTHON:-/usr/bin/python3}"
[[ -f "$peer" ]] || { echo "compare_torch: no peer script at $peer (set TORCH_GPT=path)" >&2; exit 2; }

field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" <<<"$2"; }

ours_tps=() ours_rss=() torch_tps=() torch_rss=()
echo "ours:  $lutra bench/gpt_step.lua $*"
echo "torch: ${TORCH_ENV:+$TORCH_ENV }$python $peer $*"
for ((r = 1; r <= runs; r++)); do
  line=$("$lutra" bench/gpt_step.lua "$@" | tail -n 1)
  echo "run $r ours:  $line"
  ours_tps+=("$(field tokens_per_s "$line")")
  ours_rss+=("$(field peak_rss_mb "$line")")
  line=$(env ${TORCH_ENV:-} "$python" "$peer" "$@" | tail -n 1)
  echo "run $r torch: $line"
  torch_tps+=("$(field tokens_per_s "$line")")
  torch_rss+=("$(field peak_rss_mb "$line")")
done

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
ot=$(median "${ours_tps[@]}") orss=$(median "${ours_rss[@]}")
tt=$(median "${torch_tps[@]}") trss=$(median "${torch_rss[@]}")
awk -v ot="$ot" -v tt="$tt" -v orss="$orss" -v trss="$trss" 'BEGIN {
  printf "median ours:  tokens_per_s=%.1f peak_rss_mb=%.1f\n", ot, orss
  printf "median torch: tokens_per_s=%.1f peak_rss_mb=%.1f\n", tt, trss
  printf "ratio tokens_per_s ours/torch = %.2f (goal >= 1.3)\n", ot / tt
  printf "ratio peak_rss ours/torch = %.2f (goal <= 0.7)\n", orss / trss
}'
