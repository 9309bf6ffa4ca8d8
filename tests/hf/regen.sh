#!/bin/bash
# tests/hf/regen.sh — writes tests/hf/fixtures again with the real Hugging Face libraries.
#
#   bash tests/hf/regen.sh [AREA...]      AREA: models tokenizers chat peft attn flow (default: all)
#
# Makes (or reuses) the venv $LUTRA_HF_VENV (default tests/hf/.venv, git-ignored) holding
# tests/hf/requirements.txt from PyPI, then runs tests/hf/gen_<area>.py for each area; each
# rewrites tests/hf/fixtures/<area>/ from fixed seeds. CI never runs this: it checks the
# committed fixtures (tests/lua/test_hf_*.lua) without torch 2 or transformers.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${LUTRA_HF_VENV:-$here/.venv}"
areas=("$@")
[[ ${#areas[@]} -gt 0 ]] || areas=(models tokenizers chat peft attn flow)
if ! "$venv/bin/python" -c "import torch, transformers, tokenizers, peft" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r "$here/requirements.txt"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
for area in "${areas[@]}"; do
  [[ -f "$here/gen_$area.py" ]] || { echo "regen: no $here/gen_$area.py" >&2; exit 2; }
  echo "regen: $area"
  "$venv/bin/python" "$here/gen_$area.py" "$here/fixtures/$area"
done
