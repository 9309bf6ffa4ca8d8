#!/usr/bin/env bash
# recipes/dpo.lua end to end, tiny: a 1-layer model from recipes/pretrain.lua (a trainer
# checkpoint), then DPO with LoRA (reference: the base, adapters off) and full fine-tuning
# (a frozen copy, ipo, precomputed log-probs): it runs, the metrics are finite numbers, LoRA's
# held-out reward accuracy and margin rise by measured margins, the trainable count equals
# the analytic one, and the adapters are saved in PEFT's layout.
set -u
LUTRA=$(realpath "${1:?usage: test_dpo_recipe.sh path/to/lutra path/to/liblutra.so}")
cd "$(dirname "$0")/../.." || exit 1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"
NUM='-?[0-9]+\.[0-9]+' # a finite number as %.4f prints it (nan and inf do not match)

# a corpus with every character of the DPO data, and a tiny pretrained model
{
  sed -n '1,400p' recipes/data/dpo_train.jsonl
  for i in $(seq 1 200); do echo "line $i: the quick brown fox jumps over the lazy dog. ABCDEFGHIJKLMNOPQRSTUVWXYZ"; done
} >"$T/c.txt"
out=$("$LUTRA" recipes/pretrain.lua --data="$T/c.txt" --model.n_layer=1 --model.d_model=32 --model.n_head=2 \
  --model.block_size=48 --batch=4 --steps=4 --warmup=1 --eval_every=0 --sample_tokens=5 --threads=1 \
  --run_dir="$T/pre" --ckpt_every=4 2>&1)
expect_grep "pretrain: a checkpoint" "$out" 'trained 4 steps'
CKPT="$T/pre/ckpt/step_000004"
TOK="$T/pre/tokenizer.json"
[ -f "$CKPT/manifest.json" ] && [ -f "$TOK" ] && ok || bad "pretrain: checkpoint and tokenizer written ($CKPT, $TOK)"
[ -z "$(ls "$T" | grep -v '^c\.txt$' | grep -v '^pre$')" ] && ok || bad "pretrain: nothing written beside the corpus"

COMMON=(--model="$CKPT" --tokenizer="$TOK" --batch=4 --val_limit=16 --log_every=2 --eval_every=0 --threads=1)
out=$("$LUTRA" recipes/dpo.lua "${COMMON[@]}" --steps=12 --out="$T/lora" 2>&1)
expect_grep "lora: plain text for a checkpoint" "$out" 'template: none'
expect_grep "lora: the reference is the base" "$out" 'reference: the base model \(adapters off\)'
expect_grep "lora: trainable = analytic" "$out" 'analytic sum r\*\(in\+out\) = [0-9]+: equal'
expect_grep "lora: held-out before, finite" "$out" "^held-out before: reward_accuracy=$NUM margin=$NUM loss=$NUM"
expect_grep "lora: held-out after, finite" "$out" "^held-out after: reward_accuracy=$NUM margin=$NUM loss=$NUM chosen_reward=$NUM rejected_reward=$NUM chosen_logp=$NUM rejected_logp=$NUM"
expect_grep "lora: steps logged" "$out" "^step 12/12 \| loss $NUM \| acc $NUM"
expect_grep "lora: at h = 0 the loss is log 2" "$out" 'held-out before: reward_accuracy=0.0000 margin=0.0000 loss=0.6931'
expect_grep "lora: the summary line" "$out" 'reward_accuracy before=[0-9.]+ after=[0-9.]+'
# Measured on the 16 held-out pairs (1 and 2 threads, the same to 4 digits): from 0 (policy =
# reference) to reward accuracy 0.9375, margin 0.0280, loss 0.6795 after 12 steps. The bounds
# leave room for other CPUs' rounding (3 pairs may flip); a run that does not learn
# (--lr=1e-12: accuracy 0, margin 0) or trains towards the rejected response (chosen and
# rejected swapped in the step: accuracy 0.125, margin -0.025) fails them.
after=$(printf '%s\n' "$out" | grep '^held-out after:')
field() { printf '%s\n' "$after" | sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
expect_num "lora: held-out reward accuracy after (measured 0.9375)" "$(field reward_accuracy)" ">=" 0.75
expect_num "lora: held-out margin after (measured 0.0280)" "$(field margin)" ">" 0.015
expect_num "lora: held-out loss below log 2 by 0.007 (measured 0.6795)" "$(field loss)" "<" 0.6861
[ -s "$T/lora/adapter/adapter_model.safetensors" ] && ok || bad "lora: adapter_model.safetensors written"
grep -q '"peft_type": "LORA"' "$T/lora/adapter/adapter_config.json" 2>/dev/null && ok || bad "lora: adapter_config.json"

out=$("$LUTRA" recipes/dpo.lua "${COMMON[@]}" --steps=2 --mode=full --loss=ipo --beta=0.5 --reference=precomputed \
  --out="$T/full" 2>&1)
expect_grep "full: precomputed reference" "$out" 'reference: log-probs of [0-9]+ pairs precomputed'
expect_grep "full: held-out after, finite" "$out" "^held-out after: reward_accuracy=$NUM margin=$NUM loss=$NUM"
[ -d "$T/full/model" ] && ok || bad "full: the model directory written"
[ -d "$T/lora/model" ] && ok || bad "lora: the merged model directory written"

out=$("$LUTRA" recipes/dpo.lua "${COMMON[@]}" --steps=1 --mode=full --reference=lora 2>&1)
expect_grep "a bad combination is an error" "$out" 'needs --mode=lora'

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
