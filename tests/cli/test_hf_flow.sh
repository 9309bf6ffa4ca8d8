#!/usr/bin/env bash
# test_hf_flow.sh — the workflow a user runs on a Hugging Face model directory, per family (gpt2,
# llama with llama3 RoPE scaling, qwen2, qwen3, mistral with a sliding window, smollm2): tiny
# models with a tokenizer and the family's own chat template as transformers saved them
# (tests/hf/fixtures/flow, tests/hf/gen_flow.py), each taken through
#   lutra convert HF -> lutra checkpoint -> HF: weights and logits bitwise equal, the tokenizer's
#     files and the chat template carried;
#   recipes/sft.lua 3 steps with the model's own template: the held-out loss falls; the tokens
#     carrying loss are those the documented rule picks on transformers' rendering and offsets
#     (gen_flow.py span_mask), and transformers' assistant mask (return_assistant_tokens_mask)
#     where the template marks them with {% generation %};
#   recipes/dpo.lua 2 steps: the chosen and rejected responses' log-probabilities before
#     training are transformers' (f64, printed to 3 decimals), the held-out loss falls below log 2;
#   lutra generate --prompt with the template, greedy: the ids transformers' greedy generate
#     chose for the same prompt (rendered by apply_chat_template), from the fixture and from the
#     converted directory; lutra chat with two turns from a pipe: both turns' prompt ids (the
#     second holding the first reply) and greedy ids are transformers'.
# What transformers makes of the SFT output is checked by `gen_flow.py --check-lutra` (torch).
set -u
LUTRA=$(realpath "${1:?usage: test_hf_flow.sh path/to/lutra path/to/liblutra.so}")
cd "$(dirname "$0")/../.." || exit 1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"
F=tests/hf/fixtures/flow
FLOAT='[0-9]+\.[0-9]+'

# expected.json's field (a number, or a list of numbers joined by spaces)
field() { FILE="$1" KEY="$2" "$LUTRA" -e '
local v = require("lutra.json").read_file(os.getenv("FILE"))[os.getenv("KEY")]
if type(v) == "table" then
  local s = {}
  for i, x in ipairs(v) do s[i] = tostring(x) end
  v = table.concat(s, " ")
end
print(v == nil and "" or tostring(v))'; }

# two Hugging Face directories: every weight (name, dtype, shape, value) and the logits of ids equal
same_model() { A="$1" B="$2" IDS="$3" "$LUTRA" -e '
local st = require "lutra.ckpt.safetensors"
local hf = require "lutra.hf"
local lt = require "lutra"
local a, b = st.load(os.getenv("A") .. "/model.safetensors"), st.load(os.getenv("B") .. "/model.safetensors")
local function flat(t, out)
  if type(t) ~= "table" then out[#out + 1] = t return out end
  for _, x in ipairs(t) do flat(x, out) end
  return out
end
local function equal(x, y)
  if x.dtype ~= y.dtype or table.concat(x.shape, ",") ~= table.concat(y.shape, ",") then return false end
  local p, q = flat(x:tolist(), {}), flat(y:tolist(), {})
  for i = 1, #p do if p[i] ~= q[i] then return false end end
  return #p == #q
end
local n, diff = 0, {}
for k, v in pairs(a) do
  n = n + 1
  if not (b[k] and equal(v, b[k])) then diff[#diff + 1] = k end
end
for k in pairs(b) do if not a[k] then diff[#diff + 1] = k end end
local ids = {}
for w in os.getenv("IDS"):gmatch("%d+") do ids[#ids + 1] = tonumber(w) end
local x = lt.tensor({ids}, "i64")
local la, lb = hf.load_pretrained(os.getenv("A"))(x), hf.load_pretrained(os.getenv("B"))(x)
print(#diff == 0 and equal(la, lb) and ("same " .. n) or ("different: " .. table.concat(diff, " ")))' 2>&1; }

for fam in gpt2 llama qwen2 qwen3 mistral smollm2; do
  D=$F/$fam
  prompt=$(field "$D/expected.json" prompt)
  prompt_ids=$(field "$D/expected.json" prompt_ids)
  greedy=$(field "$D/expected.json" greedy_ids)
  n=$(printf '%s\n' "$greedy" | wc -w)

  # convert both ways
  out=$("$LUTRA" convert "$D" "$T/$fam-ckpt" 2>&1)
  expect_grep "$fam: convert HF -> lutra" "$out" "\(Hugging Face (llama|$fam), 2 layers\) -> .*lutra checkpoint"
  out=$("$LUTRA" convert "$T/$fam-ckpt" "$T/$fam-back" 2>&1)
  expect_contains "$fam: convert lutra -> HF" "$out" "-> $T/$fam-back (Hugging Face"
  expect_grep "$fam: convert x2: weights and logits bitwise equal" \
    "$(same_model "$D" "$T/$fam-back" "$prompt_ids $greedy")" "^same [0-9]+$"
  for f in chat_template.jinja tokenizer_config.json; do
    cmp -s "$D/$f" "$T/$fam-back/$f" && ok || bad "$fam: convert x2 carries $f"
  done

  # greedy generation with the model's own template: transformers' ids
  for dir in "$D" "$T/$fam-back"; do
    out=$("$LUTRA" generate "$dir" --prompt "$prompt" --temperature=0 --max_new_tokens="$n" --ids 2>&1 >/dev/null)
    expect_eq "$fam: generate ($dir): the prompt's ids are apply_chat_template's" \
      "$(printf '%s\n' "$out" | sed -n 's/^prompt ids: //p')" "$prompt_ids"
    expect_eq "$fam: generate ($dir): greedy ids are transformers'" \
      "$(printf '%s\n' "$out" | sed -n 's/^reply ids: //p')" "$greedy"
  done

  # lutra chat from a pipe, two turns: the second prompt holds the first reply as text
  out=$(printf '%s\n%s\n' "$prompt" "$(field "$D/expected.json" prompt2)" |
    "$LUTRA" chat "$D" --temperature=0 --max_new_tokens="$n" --ids 2>&1 >/dev/null)
  expect_eq "$fam: chat: prompt ids of both turns are apply_chat_template's" \
    "$(printf '%s\n' "$out" | sed -n 's/^prompt ids: //p')" "$(printf '%s\n%s' "$prompt_ids" "$(field "$D/expected.json" prompt2_ids)")"
  expect_eq "$fam: chat: greedy ids of both turns are transformers'" \
    "$(printf '%s\n' "$out" | sed -n 's/^reply ids: //p')" "$(printf '%s\n%s' "$greedy" "$(field "$D/expected.json" greedy2_ids)")"

  # SFT, 3 steps, on the chats it is then measured on (its sample replies may hold any byte)
  out=$("$LUTRA" recipes/sft.lua --model="$D" --train_data=$F/data/sft.jsonl --val_data=$F/data/sft.jsonl --steps=3 \
    --batch=2 --warmup=1 --lr=1e-2 --eval_answers=0 --threads=1 --run_dir="$T/$fam-sft" 2>&1 | tr -d '\000')
  expect_grep "$fam: sft uses the model's template" "$out" "sft.jsonl: 4 examples \($D/chat_template.jinja template\)"
  before=$(printf '%s\n' "$out" | sed -n 's/^sft_val_before=\([^ ]*\) .*/\1/p')
  after=$(printf '%s\n' "$out" | sed -n 's/^sft_val_before=[^ ]* sft_val_after=\([^ ]*\) .*/\1/p')
  expect_num "$fam: sft loss before is finite" "$before" ">" 0
  expect_num "$fam: sft loss falls in 3 steps ($before -> $after)" \
    "$(awk -v a="$before" -v b="$after" 'BEGIN { print (b > 0) ? a - b : -1 }')" ">" 0.1
  span=$(field "$D/expected.json" span_tokens)
  expect_grep "$fam: tokens carrying loss = the documented spans on transformers' offsets ($span)" "$out" \
    "sft.jsonl: 4 examples \([^)]*\), [0-9]+ tokens, $span carry loss"
  mask=$(field "$D/expected.json" assistant_tokens)
  if [ -n "$mask" ]; then
    expect_grep "$fam: tokens carrying loss = transformers' assistant mask ($mask)" "$out" \
      "sft.jsonl: 4 examples \([^)]*\), [0-9]+ tokens, $mask carry loss"
  fi
  expect_contains "$fam: sft saves the model" "$out" "model: saved to $T/$fam-sft/model"
  cmp -s "$D/chat_template.jinja" "$T/$fam-sft/model/chat_template.jinja" && ok || bad "$fam: sft saves the template"

  # DPO, 2 steps
  out=$("$LUTRA" recipes/dpo.lua --model="$D" --train_data=$F/data/dpo.jsonl --val_data=$F/data/dpo.jsonl --steps=2 \
    --batch=2 --warmup=1 --eval_every=0 --log_every=1 --threads=1 --out="$T/$fam-dpo" 2>&1 | tr -d '\000')
  for side in chosen rejected; do
    got=$(printf '%s\n' "$out" | sed -n "s/^held-out before: .* ${side}_logp=\([^ ]*\) .*/\1/p")
    want=$(field "$D/expected.json" "dpo_${side}_logp")
    expect_num "$fam: dpo $side log-prob before ($got) is transformers' ($want, f64)" \
      "$(awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; if (a == "") print "x"; else printf "%.6f\n", (d < 0 ? -d : d) }')" "<" 0.0015
  done
  dloss=$(printf '%s\n' "$out" | sed -n 's/^held-out after: .* loss=\([^ ]*\) .*/\1/p')
  expect_num "$fam: dpo held-out loss after 2 steps below log 2" "$dloss" "<" 0.6931
  expect_contains "$fam: dpo saves the model" "$out" "saved the model to $T/$fam-dpo/model"
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
