#!/usr/bin/env bash
# test_convert.sh — `lutra convert`: a run dir (trainer checkpoints under ckpt/, `latest`) to a
# Hugging Face dir and back to a lutra checkpoint, for gpt2 and llama (GQA); the model's logits
# are bitwise the same at every stage; --dtype, --max-shard-size, --tokenizer; --help, usage
# errors (exit 2) and clear failures (exit 1).
# usage: test_convert.sh LUTRA LIBLUTRA
LUTRA=$(realpath "${1:?usage: test_convert.sh path/to/lutra path/to/liblutra.so}")
cd "$(dirname "$0")/../.." || exit 2
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A run dir as the trainer leaves it: ckpt/step_N (model, optimizer, step, the recipe's config
# with config.model) and ckpt/latest; a tokenizer; the reference logits of each model.
TMPD="$tmp" "$LUTRA" -e '
local lt = require "lutra"
local models = require "lutra.models"
local ckpt = require "lutra.ckpt"
local tokenizer = require "lutra.tokenizer"
local st = require "lutra.ckpt.safetensors"
local root = os.getenv("TMPD")
local tok = tokenizer.char(("hello world, the quick brown fox\n"):rep(3))
tok:save(root .. "/tok.json")
for arch, m in pairs {gpt2 = {arch = "gpt2", n_layer = 2, n_head = 2, d_model = 16, block_size = 32},
                      llama = {arch = "llama", n_layer = 2, n_head = 4, n_kv_head = 2, d_model = 16, block_size = 32}} do
  lt.manual_seed(3)
  m.vocab_size = tok.vocab_size
  local model = models.build(m)
  local recipe_model = {arch = m.arch, n_layer = m.n_layer, n_head = m.n_head, n_kv_head = m.n_kv_head or 0,
                        d_model = m.d_model, block_size = m.block_size, dropout = 0}
  for step = 1, 2 do
    ckpt.save_weights(string.format("%s/run_%s/ckpt/step_%06d", root, arch, step), model:state_dict(),
      {lr = 1e-3, model = recipe_model}, {step = step, extra = {optim = {step = step}}})
  end
  local idx = lt.tensor({tok:encode("hello fox")}, "i64")
  st.save(root .. "/ref_" .. arch .. ".safetensors", {logits = model(idx), idx = idx})
end
' 2>&1 | sed 's/^/setup: /'
if [ ! -f "$tmp/ref_llama.safetensors" ]; then
  echo "FAIL: setup did not write the run dirs"
  exit 1
fi

# logits of a model dir (HF) or checkpoint, compared bitwise with the reference
check_logits() { # what arch dir kind
  TMPD="$tmp" ARCH="$2" DIR="$3" KIND="$4" "$LUTRA" -e '
local lt = require "lutra"
local st = require "lutra.ckpt.safetensors"
local models = require "lutra.models"
local ref = st.load(os.getenv("TMPD") .. "/ref_" .. os.getenv("ARCH") .. ".safetensors")
local model
if os.getenv("KIND") == "hf" then
  model = require("lutra.hf").load_pretrained(os.getenv("DIR"))
else
  local s = require("lutra.ckpt").load_weights(os.getenv("DIR"))
  model = models.build(s.config.model)
  model:load_state_dict(s.model)
end
local got = model(ref.idx)
local same = true
local a, b = got:tolist(), ref.logits:tolist()
for i = 1, #a[1] do for j = 1, #a[1][i] do if a[1][i][j] ~= b[1][i][j] then same = false end end end
print(same and "same" or "different")
' 2>&1
}

for arch in gpt2 llama; do
  out=$("$LUTRA" convert "$tmp/run_$arch" "$tmp/hf_$arch" --tokenizer="$tmp/tok.json" 2>&1)
  expect_eq "$arch run dir -> hf: exit" "$?" "0"
  expect_contains "$arch run dir -> hf: summary" "$out" "step_000002 (step 2, $arch, 2 layers) -> $tmp/hf_$arch (Hugging Face $arch, with tokenizer.json)"
  for f in config.json model.safetensors tokenizer.json; do
    if [ -f "$tmp/hf_$arch/$f" ]; then ok; else bad "$arch: hf dir lacks $f"; fi
  done
  expect_eq "$arch hf logits" "$(check_logits "$arch" "$arch" "$tmp/hf_$arch" hf)" "same"

  out=$("$LUTRA" convert "$tmp/hf_$arch" "$tmp/ckpt_$arch" 2>&1)
  expect_eq "$arch hf -> lutra: exit" "$?" "0"
  expect_contains "$arch hf -> lutra: summary" "$out" "-> $tmp/ckpt_$arch (lutra checkpoint, model weights only, with tokenizer.json)"
  if [ -f "$tmp/ckpt_$arch/manifest.json" ] && [ -f "$tmp/ckpt_$arch/tokenizer.json" ]; then ok; else bad "$arch: checkpoint files"; fi
  expect_eq "$arch checkpoint logits" "$(check_logits "$arch" "$arch" "$tmp/ckpt_$arch" ckpt)" "same"

  # and the converted checkpoint converts back (its tokenizer found next to manifest.json)
  out=$("$LUTRA" convert "$tmp/ckpt_$arch" "$tmp/hf2_$arch" --max-shard-size=4K 2>&1)
  expect_eq "$arch ckpt -> hf sharded: exit" "$?" "0"
  expect_contains "$arch ckpt -> hf sharded: tokenizer" "$out" "with tokenizer.json"
  if [ -f "$tmp/hf2_$arch/model.safetensors.index.json" ]; then ok; else bad "$arch: no shard index"; fi
  expect_eq "$arch sharded hf logits" "$(check_logits "$arch" "$arch" "$tmp/hf2_$arch" hf)" "same"
done

# one checkpoint (not the latest), bf16 export
out=$("$LUTRA" convert "$tmp/run_gpt2/ckpt/step_000001" "$tmp/hf_bf16" --dtype=bf16 2>&1)
expect_eq "step dir -> hf bf16: exit" "$?" "0"
expect_contains "step dir -> hf bf16: no tokenizer" "$out" "(step 1, gpt2, 2 layers)"
expect_contains "bf16 config" "$(cat "$tmp/hf_bf16/config.json")" '"torch_dtype": "bfloat16"'

# help and usage errors
out=$("$LUTRA" convert --help 2>&1)
expect_eq "--help exit" "$?" "0"
expect_contains "--help text" "$out" "usage: lutra convert SRC DST"
out=$("$LUTRA" convert 2>&1)
expect_eq "no args exit" "$?" "2"
expect_contains "no args message" "$out" "expected SRC and DST, got 0 arguments"
out=$("$LUTRA" convert a b --frobnicate 2>&1)
expect_eq "unknown option exit" "$?" "2"
expect_contains "unknown option message" "$out" "unknown option '--frobnicate'"
out=$("$LUTRA" convert a b --dtype=i8 2>&1)
expect_eq "bad dtype exit" "$?" "2"
out=$("$LUTRA" convert a b --max-shard-size=lots 2>&1)
expect_eq "bad size exit" "$?" "2"

# failures: exit 1, one clear line
out=$("$LUTRA" convert "$tmp/nope" "$tmp/x" 2>&1)
expect_eq "missing src exit" "$?" "1"
expect_eq "missing src message" "$out" "lutra convert: convert: $tmp/nope is not a directory"
mkdir -p "$tmp/empty"
out=$("$LUTRA" convert "$tmp/empty" "$tmp/x" 2>&1)
expect_eq "not a checkpoint exit" "$?" "1"
expect_contains "not a checkpoint message" "$out" "is neither a Hugging Face dir (config.json) nor a lutra checkpoint"
mkdir -p "$tmp/old/ckpt/step_000001"
echo 'return {format = "lutra-train-checkpoint", version = 1, state = {}}' > "$tmp/old/ckpt/step_000001/manifest.lua"
out=$("$LUTRA" convert "$tmp/old/ckpt/step_000001" "$tmp/x" 2>&1)
expect_eq "single-process checkpoint exit" "$?" "1"
expect_contains "single-process checkpoint message" "$out" "step_000001/manifest.lua: the single-process checkpoint format (manifest.lua) is no longer read"
out=$("$LUTRA" convert "$tmp/run_gpt2" "$tmp/hf_gpt2" 2>&1)
expect_eq "dst exists exit" "$?" "1"
expect_contains "dst exists message" "$out" "hf_gpt2 exists and is not empty (pass --force to write into it)"
out=$("$LUTRA" convert "$tmp/run_gpt2" "$tmp/hf_gpt2" --force 2>&1)
expect_eq "--force exit" "$?" "0"
# DST the source itself (also through a symlink), inside it, or holding it: refused, even with
# --force, and the source is left as it was.
ln -s hf_gpt2 "$tmp/hf_link"
before=$(cd "$tmp/hf_gpt2" && ls -lR --time-style=full-iso . | sha256sum)
for case in "same:$tmp/hf_gpt2:is the source" "symlink:$tmp/hf_link:is the source" \
            "inside:$tmp/hf_gpt2/sub:is inside the source" "holds:$tmp:contains the source"; do
  IFS=: read -r name dst want <<< "$case"
  out=$("$LUTRA" convert "$tmp/hf_gpt2" "$dst" --force 2>&1)
  expect_eq "dst $name exit" "$?" "1"
  expect_contains "dst $name message" "$out" "$want $tmp/hf_gpt2: choose a directory outside it"
done
expect_eq "source untouched" "$(cd "$tmp/hf_gpt2" && ls -lR --time-style=full-iso . | sha256sum)" "$before"
if [ ! -e "$tmp/hf_gpt2/sub" ]; then ok; else bad "a refused convert created $tmp/hf_gpt2/sub"; fi
sed -i 's/"rope_theta"/"rope_scaling": {"type": "proportional", "factor": 2}, "rope_theta"/' "$tmp/hf_llama/config.json"
out=$("$LUTRA" convert "$tmp/hf_llama" "$tmp/ckpt_bad" 2>&1)
expect_eq "unsupported key exit" "$?" "1"
expect_contains "unsupported key message" "$out" "config.json: rope_scaling.type = \"proportional\": lutra needs \"default\", \"linear\""
if [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ]; then ok; else bad "failure message is one line: [$out]"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
