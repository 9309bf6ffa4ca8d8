#!/usr/bin/env bash
# recipes/custom_arch.lua end to end, tiny: a GPT with MoE feed-forward layers trained by
# lutra.train on a corpus written here; the loss falls and the aux (balance) loss is
# logged, both in the summary and per step in metrics.jsonl; the val loss is the LM loss.
set -u
LUTRA=$(realpath "${1:?usage: test_custom_arch.sh path/to/lutra}")
cd "$(dirname "$0")/../.." || exit 1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"

for i in $(seq 1 400); do echo "line $i: the quick brown fox $((i * 7 % 13)) jumps over the lazy dog."; done >"$T/c.txt"
TINY=(--data="$T/c.txt" --model.n_layer=1 --model.d_model=32 --model.n_head=2 --model.block_size=16 --batch=8
      --moe.hidden=32 --eval_iters=2 --sample_tokens=20 --threads=1)

out=$("$LUTRA" recipes/custom_arch.lua "${TINY[@]}" --steps=30 --warmup=3 --eval_every=15 --run_dir="$T/r1" 2>&1)
expect_grep "trains" "$out" 'trained 30 steps in'
expect_grep "the model has MoE layers" "$out" '4 experts \(top-2, hidden 32\)'
expect_grep "the aux loss is reported" "$out" '^aux loss [0-9.]+ -> [0-9.]+'
expect_grep "routing shares per layer" "$out" '^layer 1 routing share: [0-9.]+ [0-9.]+ [0-9.]+ [0-9.]+$'
expect_grep "a sample" "$out" '^---- sample ----'
# the LM loss falls: the mean of the last 10 steps well under that of the first 10
line=$(printf '%s\n' "$out" | grep -E '^lm loss ')
first=$(printf '%s\n' "$line" | sed -E 's/.*steps: ([0-9.]+) -> ([0-9.]+)\).*/\1/')
last=$(printf '%s\n' "$line" | sed -E 's/.*steps: ([0-9.]+) -> ([0-9.]+)\).*/\2/')
if [ -n "$first" ] && awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }'; then ok; else
  bad "the loss falls: [$line]"
fi
# the aux loss: near 1 (balanced), a finite positive number, logged per step with lm_loss
aux=$(printf '%s\n' "$out" | grep -E '^aux loss ' | sed -E 's/^aux loss ([0-9.]+) -> ([0-9.]+).*/\2/')
if [ -n "$aux" ] && awk -v a="$aux" 'BEGIN { exit !(a > 0.8 && a < 2) }'; then ok; else bad "aux loss in (0.8, 2): [$aux]"; fi
n=$(grep -c '"aux_loss":[0-9.]*.*"lm_loss":[0-9.]*' "$T/r1/latest/metrics.jsonl" 2>/dev/null || echo 0)
[ "$n" -eq 30 ] && ok || bad "metrics.jsonl: aux_loss and lm_loss on each of 30 steps (got $n)"
n=$(grep -c '"val_loss"' "$T/r1/latest/metrics.jsonl" 2>/dev/null || echo 0)
[ "$n" -eq 3 ] && ok || bad "metrics.jsonl: 3 val losses (got $n)"

# top-1 routing with 3 experts, and --aux_coef
out=$("$LUTRA" recipes/custom_arch.lua "${TINY[@]}" --moe.n_experts=3 --moe.top_k=1 --aux_coef=0.1 --steps=4 \
  --warmup=1 --eval_every=0 --run_dir="" 2>&1)
expect_grep "top-1: trains" "$out" 'trained 4 steps in'
expect_grep "top-1: 3 shares" "$out" '^layer 1 routing share: [0-9.]+ [0-9.]+ [0-9.]+$'

out=$("$LUTRA" recipes/custom_arch.lua --data="$T/missing.txt" 2>&1)
expect_grep "a missing corpus is a clear error" "$out" 'missing.txt'

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
