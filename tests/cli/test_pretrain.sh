#!/usr/bin/env bash
# recipes/pretrain.lua end to end, tiny: char and BPE tokens, gpt2 and llama, resume,
# Ctrl-C (SIGINT) stopping after the current step with a checkpoint, and the lutra host.
set -u
LUTRA=$(realpath "${1:?usage: test_pretrain.sh path/to/lutra path/to/liblutra.so}")
cd "$(dirname "$0")/../.." || exit 1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() {
  fail=$((fail + 1))
  echo "FAIL: $1"
}
expect_grep() { if printf '%s\n' "$2" | grep -qE -- "$3"; then ok; else bad "$1: [$2] does not match /$3/"; fi; }

# a corpus: 40 KB of varied lines
for i in $(seq 1 800); do echo "line $i: the quick brown fox $((i * 7 % 13)) jumps over the lazy dog."; done >"$T/c.txt"
TINY=(--data="$T/c.txt" --model.n_layer=1 --model.d_model=32 --model.n_head=2 --model.block_size=16 --batch=4
      --eval_iters=2 --sample_tokens=20 --threads=1)

out=$("$LUTRA" recipes/pretrain.lua "${TINY[@]}" --steps=6 --warmup=2 --eval_every=3 --run_dir="$T/r1" 2>&1)
expect_grep "char gpt2: trains" "$out" 'trained 6 steps in'
expect_grep "char gpt2: val loss at the end" "$out" '^final_val=[0-9.]+ seconds'
expect_grep "char gpt2: a sample" "$out" '^---- sample ----'
expect_grep "plain progress lines (not a terminal)" "$out" '^step 6/6 \| loss'
[ -s "$T/r1/metrics.jsonl" ] && ok || bad "metrics.jsonl written"
[ -s "$T/r1/config.lua" ] && ok || bad "config.lua written"

out=$("$LUTRA" recipes/pretrain.lua "${TINY[@]}" --tokenizer=bpe --vocab=300 --model.arch=llama --model.n_kv_head=1 \
  --steps=4 --warmup=1 --eval_every=2 --run_dir="$T/r2" --ckpt_every=2 2>&1 | tr -d "\000")
expect_grep "bpe llama: trains" "$out" 'trained 4 steps in'
expect_grep "bpe llama: the BPE vocabulary" "$out" 'bpe tokenizer \(300 tokens\)'
[ -f "$T/r2/ckpt/step_000004/manifest.json" ] && ok || bad "bpe llama: checkpoint at step 4"
out=$("$LUTRA" recipes/pretrain.lua "${TINY[@]}" --tokenizer=bpe --vocab=300 --model.arch=llama --model.n_kv_head=1 \
  --steps=6 --warmup=1 --eval_every=2 --run_dir="$T/r2" --ckpt_every=2 --resume=auto 2>&1 | tr -d "\000")
expect_grep "resume=auto continues" "$out" 'resumed from .*step_000004 at step 4'
expect_grep "resume=auto: to the end" "$out" 'step 6/6'

# Ctrl-C: SIGINT while training stops after the step, saves, and the recipe ends normally
"$LUTRA" recipes/pretrain.lua "${TINY[@]}" --steps=100000 --warmup=1 --eval_every=0 --run_dir="$T/r3" >"$T/int.out" 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q '^step ' "$T/int.out" 2>/dev/null && break; sleep 0.1; done
kill -INT "$pid"
wait "$pid"
st=$?
out=$(cat "$T/int.out")
expect_grep "Ctrl-C: stops after the step" "$out" 'interrupted: stopped after step [0-9]+'
expect_grep "Ctrl-C: the recipe finishes (sample)" "$out" '^---- sample ----'
[ "$st" -eq 0 ] && ok || bad "Ctrl-C: exit status $st"
ls "$T/r3/ckpt"/step_* >/dev/null 2>&1 && ok || bad "Ctrl-C: a checkpoint was saved"

out=$("$LUTRA" recipes/pretrain.lua --data="$T/missing.txt" 2>&1)
expect_grep "a missing corpus is a clear error" "$out" 'missing.txt'

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
