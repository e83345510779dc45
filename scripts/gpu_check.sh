#!/usr/bin/env bash
# The GPU check in one call, on a CUDA machine that may have no network (README, "GPU check"):
#   bash scripts/gpu_check.sh [--wheels DIR] [options of python -m scripts.gpu_check]
# DIR (default .whl) holds the pure-Python wheels a bare CUDA image lacks, made on a machine with network by
# `bash scripts/gpu_wheels.sh`. They are installed with --no-index into a temporary folder, removed at the end.
# PYBIN picks the Python (default python3, the one that holds the CUDA torch).
set -uo pipefail
cd "$(dirname "$0")/.."
PYBIN=${PYBIN:-python3}
WHEELS=.whl
if [ "${1:-}" = "--wheels" ]; then
  [ $# -ge 2 ] || { echo "error: --wheels needs a folder" >&2; exit 2; }
  WHEELS=$2
  shift 2
fi
missing=$("$PYBIN" -c 'import importlib.util
from scripts.gpu_check import GPU_WHEELS
print(" ".join(n for n in GPU_WHEELS if importlib.util.find_spec(n.replace("-", "_")) is None))') || exit 2
if [ -n "$missing" ]; then
  shopt -s nullglob
  wheels=("$WHEELS"/*.whl)
  if [ ${#wheels[@]} -eq 0 ]; then
    echo "error: $PYBIN lacks $missing and $WHEELS holds no wheels; make them with 'bash scripts/gpu_wheels.sh'" \
         "on a machine with network and pass --wheels DIR" >&2
    exit 2
  fi
  site=$(mktemp -d)
  trap 'rm -rf "$site"' EXIT
  if ! "$PYBIN" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "${wheels[@]}"; then
    echo "error: the wheels in $WHEELS did not install (pip's message above)" >&2
    exit 2
  fi
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PYBIN" -m scripts.gpu_check "$@"
