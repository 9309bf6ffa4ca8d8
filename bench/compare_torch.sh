#!/usr/bin/env bash
# bench/compare_torch.sh — the GPT-2 training step, ours against three PyTorch peers, interleaved.
#   bench/compare_torch.sh [-n RUNS] [-p PEERS] [-- OPTIONS...]
# Runs bench/gpt_step.lua and the peer script (../shared/peers/torch_gpt.py) RUNS times each
# (default 3), in rounds: lutra, then each peer, then lutra again... so that the machine's
# noise falls on all of them alike. The peers (PEERS: a comma list, default all):
#   t113     PyTorch 1.13 from Debian (python3-torch, system python), eager; it has no SDPA,
#            so attention is the peer's matmul/softmax path
#   eager    PyTorch 2.x from PyPI (the venv of bench/peers.sh), eager + SDPA
#   compile  the same, torch.compile (inductor, C++ codegen: needs g++) + SDPA; its
#            compilation happens in the warm-up steps, which are not timed
# A peer that is not installed is a "not installed" row, one that fails a "failed" row.
# The same OPTIONS go to every run (--layers --heads --dim --seq --vocab --batch --steps
# --warmup --threads; default: the scripts' defaults, L4 H4 d256 T256 V4096 B8, 2 threads).
# The peers also get OMP_NUM_THREADS set to the same thread count.
# Prints every run, then a table: median tokens/s, median peak RSS (ru_maxrss of the process)
# and the ratios lutra/peer; the goal is against PyTorch 2.x compiled. It also prints the load
# average before and after: PyTorch's OpenMP workers spin-wait, which costs it much more than
# lutra when other processes share the cores, so a busy machine widens the gap.
# Environment: LUTRA (default build/lutra, else the first build*/lutra found), TORCH_GPT (the
# peer script), PYTHON (the 1.13 interpreter, default /usr/bin/python3), LUTRA_PEER_VENV (the
# venv of bench/peers.sh, default bench/.venv-peers), TORCH_ENV (variables for the peers' runs
# only, e.g. TORCH_ENV=OMP_WAIT_POLICY=passive: PyTorch's OpenMP workers spin between ops,
# which costs it much on a machine whose cores are busy with other work).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=3
peers="t113,eager,compile"
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) runs="$2"; shift 2 ;;
    -p) peers="$2"; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done

lutra="${LUTRA:-}"
if [[ -z "$lutra" ]]; then
  for c in build/lutra build*/lutra; do
    if [[ -x "$c" ]]; then lutra="$c"; break; fi
  done
fi
[[ -x "$lutra" ]] || { echo "compare_torch: no lutra binary (set LUTRA=path)" >&2; exit 2; }
peer="${TORCH_GPT:-../shared/peers/torch_gpt.py}"
[[ -f "$peer" ]] || { echo "compare_torch: no peer script at $peer (set TORCH_GPT=path)" >&2; exit 2; }
py113="${PYTHON:-/usr/bin/python3}"
venv="${LUTRA_PEER_VENV:-bench/.venv-peers}"
py2="$venv/bin/python"

threads=2
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --threads) threads="${args[i + 1]:-2}" ;;
    --threads=*) threads="${args[i]#--threads=}" ;;
  esac
done

torch_version() { [[ -x "$1" || "$1" == */* ]] && "$1" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null; }

# name, label, command prefix (peer runs), status ("" when runnable)
names=(lutra) labels=("lutra") status=("") cmds=("")
v113=$(torch_version "$py113" || true) v2=$(torch_version "$py2" || true)
IFS=, read -r -a want <<<"$peers"
for p in "${want[@]}"; do
  case "$p" in
    t113)
      names+=(t113) cmds+=("$py113 $peer")
      if [[ "$v113" == 1.* ]]; then labels+=("torch $v113 eager (Debian)") status+=("")
      else labels+=("torch 1.13 eager (Debian)") status+=("not installed (apt-get install python3-torch)"); fi ;;
    eager | compile)
      names+=("$p")
      flag="--sdpa" && [[ "$p" == compile ]] && flag="--sdpa --compile"
      cmds+=("$py2 $peer $flag")
      what="eager+SDPA" && [[ "$p" == compile ]] && what="compile+SDPA"
      if [[ "$v2" == 2.* ]]; then labels+=("torch $v2 $what") status+=("")
      else labels+=("torch 2.x $what") status+=("not installed (bash bench/peers.sh)"); fi
      if [[ "$p" == compile && -z "${status[-1]}" ]] && ! command -v g++ >/dev/null && ! command -v c++ >/dev/null; then
        status[-1]="not runnable: torch.compile needs a C++ compiler (g++)"
      fi ;;
    *) echo "compare_torch: unknown peer $p (t113, eager, compile)" >&2; exit 2 ;;
  esac
done

field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" <<<"$2"; }
declare -A tps rss
shape="${*:-defaults: L4 H4 d256 T256 V4096 B8 fp32}"
echo "shape: $shape; threads $threads; $runs rounds; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for k in "${!names[@]}"; do
  if [[ $k -eq 0 ]]; then echo "${labels[k]}: $lutra bench/gpt_step.lua $*"
  elif [[ -z "${status[k]}" ]]; then echo "${labels[k]}: OMP_NUM_THREADS=$threads ${TORCH_ENV:+$TORCH_ENV }${cmds[k]} $*"
  else echo "${labels[k]}: ${status[k]}"; fi
done
for ((r = 1; r <= runs; r++)); do
  for k in "${!names[@]}"; do
    [[ -n "${status[k]}" ]] && continue
    if [[ $k -eq 0 ]]; then
      out=$("$lutra" bench/gpt_step.lua "$@" 2>&1) || true
    else
      # shellcheck disable=SC2086 # cmds[k] is an interpreter, the script and its flags
      out=$(env OMP_NUM_THREADS="$threads" ${TORCH_ENV:-} ${cmds[k]} "$@" 2>&1) || true
    fi
    line=$(grep 'tokens_per_s=' <<<"$out" | tail -n 1 || true)
    if [[ -z "$line" ]]; then
      status[k]="failed: $(tail -n 1 <<<"$out" | cut -c1-100)"
      echo "run $r ${names[k]}: failed:"
      tail -n 5 <<<"$out" | sed 's/^/    /'
      continue
    fi
    echo "run $r ${names[k]}: $line"
    tps[$k]+="$(field tokens_per_s "$line") " rss[$k]+="$(field peak_rss_mb "$line") "
  done
done

echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
[[ -n "${tps[0]:-}" ]] || { echo "compare_torch: lutra did not run" >&2; exit 1; }
ot=$(median "${tps[0]}") orss=$(median "${rss[0]}")
echo
printf '| %-30s | %12s | %12s | %17s | %15s |\n' "median of $runs runs" "tokens/s" "peak RSS MB" "lutra/peer tok/s" "lutra/peer RSS"
printf '|%s|%s|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..32})" "$(printf -- '-%.0s' {1..14})" "$(printf -- '-%.0s' {1..14})" \
  "$(printf -- '-%.0s' {1..19})" "$(printf -- '-%.0s' {1..17})"
for k in "${!names[@]}"; do
  if [[ -n "${tps[$k]:-}" && ( -z "${status[k]}" || $k -eq 0 ) ]]; then
    t=$(median "${tps[$k]}") m=$(median "${rss[$k]}")
    awk -v l="${labels[k]}" -v t="$t" -v m="$m" -v ot="$ot" -v om="$orss" -v k="$k" 'BEGIN {
      if (k == 0) printf "| %-30s | %12.1f | %12.1f | %17s | %15s |\n", l, t, m, "", ""
      else printf "| %-30s | %12.1f | %12.1f | %16.2fx | %14.2fx |\n", l, t, m, ot / t, om / m }'
  else
    printf '| %-30s | %s |\n' "${labels[k]}" "${status[k]}"
  fi
done
for k in "${!names[@]}"; do
  if [[ "${names[k]}" == compile && -n "${tps[$k]:-}" && -z "${status[k]}" ]]; then
    awk -v t="$(median "${tps[$k]}")" -v m="$(median "${rss[$k]}")" -v ot="$ot" -v om="$orss" 'BEGIN {
      printf "goal vs torch.compile: tokens/s %.2fx (>= 1.5: %s), peak RSS %.2fx (<= 0.5: %s)\n",
        ot / t, (ot / t >= 1.5) ? "met" : "not met", om / m, (om / m <= 0.5) ? "met" : "not met" }'
  fi
done
