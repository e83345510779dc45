#!/usr/bin/env bash
# On a machine with network: download the pure-Python wheels that scripts/gpu_check.sh installs on a CUDA machine
# without one (scripts/gpu_check.py's GPU_WHEELS, at pyproject.toml's versions), for that machine's Python.
#   bash scripts/gpu_wheels.sh [DIR]      DIR defaults to .whl (git-ignored); PYTHON_VERSION defaults to 3.12
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
PY=${PYTHON:-python3}
mkdir -p "$DIR"
specs=()
while IFS= read -r spec; do specs+=("$spec"); done < <("$PY" -c 'from scripts.gpu_check import wheel_specs
print("\n".join(wheel_specs()))')
for spec in "${specs[@]}"; do  # one version of each: pip refuses two of one package
  name=$(printf '%s' "$spec" | sed -E 's/[<>=!~ ;].*//; s/-/_/g')
  rm -f "$DIR/$name"-*.whl
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "${PYTHON_VERSION:-3.12}" \
  --implementation cp -d "$DIR" "${specs[@]}"
ls -1 "$DIR"/*.whl
