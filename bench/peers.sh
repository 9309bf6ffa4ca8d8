#!/usr/bin/env bash
# bench/peers.sh — makes the venv of today's PyTorch, the peer that bench/compare_torch.sh
# measures next to Debian's PyTorch 1.13 (python3-torch, system python).
#   bench/peers.sh [--check]
# Creates $LUTRA_PEER_VENV (default bench/.venv-peers, git-ignored) with torch $TORCH_VERSION
# (default 2.15.0) from PyPI and prints what it holds. Idempotent: a venv that already holds
# that version is left as it is. --check only reports (exit 1 if the venv is not ready).
# The PyPI wheel of torch is its CUDA build (it pulls the nvidia-*/cuda-* wheels, ~4 GB in
# all); it runs on CPU without a GPU. The CPU-only wheels live on download.pytorch.org, which
# this project's machines cannot reach. torch.compile needs a C++ compiler at run time (g++).
# Environment: LUTRA_PEER_VENV, TORCH_VERSION, PEER_PYTHON (the interpreter of the venv,
# default /usr/bin/python3: Debian's, the one whose python3-torch is the 1.13 peer).
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${LUTRA_PEER_VENV:-bench/.venv-peers}"
version="${TORCH_VERSION:-2.15.0}"
base="${PEER_PYTHON:-/usr/bin/python3}"

report() {
  "$venv/bin/python" - <<'EOF'
import sys, torch
print(f"peers: {sys.prefix}: python {sys.version.split()[0]}, torch {torch.__version__}, "
      f"threads {torch.get_num_threads()}, mkldnn {torch.backends.mkldnn.is_available()}, "
      f"cpu capability {torch.backends.cpu.get_cpu_capability()}")
EOF
}
have() { [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$version')" 2>/dev/null; }

if [[ "${1:-}" == "--check" ]]; then
  if have; then report; exit 0; fi
  echo "peers: $venv has no torch $version (run bench/peers.sh)"
  exit 1
fi

if have; then
  echo "peers: $venv already holds torch $version; nothing to do"
  report
  exit 0
fi

if ! "$base" -c "import ensurepip, venv" 2>/dev/null; then
  echo "peers: $base has no venv/ensurepip module: installing Debian's python3-venv"
  if [[ $(id -u) -eq 0 ]]; then
    apt-get install -y python3-venv
  else
    sudo apt-get install -y python3-venv
  fi
fi
if ! command -v g++ >/dev/null && ! command -v c++ >/dev/null; then
  echo "peers: warning: no C++ compiler; torch.compile (the compiled peer) needs one (apt-get install g++)"
fi

[[ -x "$venv/bin/python" ]] || { echo "peers: creating $venv with $base"; "$base" -m venv "$venv"; }
echo "peers: installing torch==$version from PyPI into $venv"
"$venv/bin/python" -m pip install --disable-pip-version-check -q "torch==$version" numpy
echo "peers: installed:"
"$venv/bin/python" -m pip list --disable-pip-version-check 2>/dev/null | grep -Ei '^(torch|numpy|sympy|triton) '
report
