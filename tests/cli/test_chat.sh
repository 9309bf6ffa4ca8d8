#!/usr/bin/env bash
# `lutra chat` and `lutra generate` on a tiny model directory made here: a llama whose greedy
# next token depends only on the current one ("\n" -> "o" -> "k" -> <|im_end|>, "z" -> "z",
# anything else -> <|im_end|>), so every chat reply is "ok" and stops at the end-of-turn token.
set -u
LUTRA=$(realpath "${1:?usage: test_chat.sh path/to/lutra path/to/liblutra.so}")
cd "$(dirname "$0")/../.." || exit 1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"

cat >"$T/make.lua" <<'EOF'
local lt = require "lutra"
local models = require "lutra.models"
local modeldir = require "lutra.sft.modeldir"
local tok = lt.tokenizer.char("abcdefghijklmnopqrstuvwxyz \n+?:", {special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}})
local V, C = tok.vocab_size, 48
local model = models.build {arch = "llama", n_layer = 1, n_head = 2, d_model = C, vocab_size = V, block_size = 64}
local id = function(s) return tok:encode(s)[1] end
local nxt = {}
for v = 0, V - 1 do nxt[v] = id("<|im_end|>") end
nxt[id("\n")], nxt[id("o")], nxt[id("k")], nxt[id("z")] = id("o"), id("k"), id("<|im_end|>"), id("z")
-- one-hot embeddings; RMSNorm keeps them one-hot; the blocks add nothing (zero output
-- projections); lm_head row u sums the embeddings of the tokens whose successor is u
local wte, head = {}, {}
for v = 1, V do
  wte[v], head[v] = {}, {}
  for c = 1, C do wte[v][c], head[v][c] = (c == v) and 1 or 0, 0 end
end
for w = 0, V - 1 do head[nxt[w] + 1][w + 1] = 1 end
lt.no_grad(function()
  model.wte.weight:copy_(lt.tensor(wte))
  model.lm_head.weight:copy_(lt.tensor(head))
  for _, b in ipairs(model.blocks) do
    b.attn.proj.weight:zero_()
    b.mlp.proj.weight:zero_()
  end
end)
modeldir.save(arg[1], model, tok)
EOF
"$LUTRA" "$T/make.lua" "$T/m" >"$T/make.out" 2>&1 || { cat "$T/make.out"; bad "making the model directory"; }
[ -f "$T/m/tokenizer.json" ] && [ -f "$T/m/chat_template.json" ] && ok || bad "model dir: tokenizer.json, chat_template.json"

# generate: the prompt as a user turn of the template, greedy, stops at <|im_end|>
out=$("$LUTRA" generate "$T/m" --prompt "hi there" --temperature=0 2>&1)
expect_eq "generate: greedy reply, stopped at the end-of-turn token" "$out" "ok"
out=$("$LUTRA" generate "$T/m" --prompt "hi" --temperature 1 --top_k 1 2>&1)
expect_eq "generate: top_k = 1 samples the argmax" "$out" "ok"
# --raw continues the text itself: "o" -> "k" -> stop; "z" -> "z"... until max_new_tokens
out=$("$LUTRA" generate "$T/m" --prompt "o" --raw --temperature=0 2>&1)
expect_eq "generate --raw: stops at <|im_end|>" "$out" "k"
out=$("$LUTRA" generate "$T/m" --prompt "z" --raw --temperature=0 --max_new_tokens=5 2>&1)
expect_eq "generate --raw: max_new_tokens" "$out" "zzzzz"
# sampling with a seed is reproducible (temperature high enough to leave the argmax sometimes)
a=$("$LUTRA" generate "$T/m" --prompt "abc" --raw --temperature=8 --max_new_tokens=12 --seed=5 2>&1)
b=$("$LUTRA" generate "$T/m" --prompt "abc" --raw --temperature=8 --max_new_tokens=12 --seed=5 2>&1)
expect_eq "generate --seed: the same sample twice" "$a" "$b"

# chat on a pipe: replies streamed one per turn, history kept (the context grows), /reset
# forgets it, /exit ends (the line after it is never answered)
printf 'hello\nhow are you\n\n/reset\nhello\n/exit\nnever\n' | "$LUTRA" chat "$T/m" --temperature=0 --verbose \
  >"$T/chat.out" 2>"$T/chat.err"
st=$?
expect_eq "chat: exit status" "$st" "0"
expect_eq "chat: the replies" "$(cat "$T/chat.out")" "$(printf 'ok\nok\n(conversation reset)\nok')"
ctx=$(grep -oE '[0-9]+ tokens' "$T/chat.err" | grep -oE '[0-9]+' | tr '\n' ' ')
read -r c1 c2 c3 <<<"$ctx"
# ChatML: "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n" is 6 + 5 + 2 + 11 = 24 tokens
expect_eq "chat: first context" "${c1:-}" "24"
[ "${c2:-0}" -gt "${c1:-0}" ] && ok || bad "chat: the second turn sees the first ($ctx)"
expect_eq "chat: after /reset the context starts again" "${c3:-}" "24"
out=$(printf 'hi\nWHO\nhi\n' | "$LUTRA" chat "$T/m" --temperature=0 2>"$T/err.txt")
expect_eq "chat: a turn that cannot be encoded is an error, and the chat goes on" "$out" "$(printf 'ok\n\nok')"
expect_grep "chat: the error is said" "$(cat "$T/err.txt")" "^error: .*not in the char vocab"
out=$(printf 'hi\n' | "$LUTRA" chat "$T/m" --temperature=0 --system="be brief" 2>&1)
expect_eq "chat: end of input ends it; a system message" "$out" "ok"

# errors
out=$("$LUTRA" generate "$T/missing" --prompt x 2>&1)
st=$?
[ "$st" -ne 0 ] && ok || bad "a missing model directory fails"
expect_grep "a missing model directory: the message" "$out" 'not a model directory'
out=$("$LUTRA" generate "$T/m" 2>&1)
expect_grep "generate without --prompt" "$out" '--prompt is required'
out=$("$LUTRA" chat "$T/m" --tempreature=1 2>&1 </dev/null)
st=$?
expect_grep "an unknown option" "$out" 'unknown option --tempreature'
expect_eq "an unknown option: exit status" "$st" "2"
out=$("$LUTRA" chat "$T/m" --template=mistral 2>&1 </dev/null)
expect_grep "an unknown template" "$out" "unknown template 'mistral'"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
