#!/bin/bash
# tests/py/tb_venv.sh VENV — makes (or reuses) a venv at VENV holding TensorBoard from PyPI, whose
# readers tests/py/tb_read.py runs; prints the venv's python. Exits 77 (ctest's skip) when it
# cannot be made: no python3 with venv (python3-venv), or pip cannot install tensorboard here.
set -uo pipefail
venv=${1:?usage: tb_venv.sh VENV}
py="$venv/bin/python"
check() { "$py" -c "import tensorboard.backend.event_processing.plugin_event_accumulator" 2>/dev/null; }
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9 # one maker at a time; the others wait, then reuse it
if ! check; then
  base=${LUTRA_PYTHON:-/usr/bin/python3}
  [[ -x $base ]] || base=python3
  rm -rf "$venv"
  if ! "$base" -m venv "$venv" >&2; then
    echo "tb_venv: $base -m venv failed (apt-get install python3-venv)" >&2
    exit 77
  fi
  if ! "$venv/bin/pip" install -q --disable-pip-version-check tensorboard >&2; then
    echo "tb_venv: pip cannot install tensorboard here (no PyPI?)" >&2
    rm -rf "$venv"
    exit 77
  fi
  check || { echo "tb_venv: tensorboard installed but its event reader does not import" >&2; exit 1; }
fi
echo "$py"
