#!/usr/bin/env bash
# Install what the browser test (tests/test_inspector_browser.py) needs: Debian's `chromium` package and
# Playwright's Python package, which drives that binary. Never `playwright install`: no browser downloads.
# Exits non-zero when Chromium cannot be installed (not root, no passwordless sudo, no apt); the test then skips.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
  else
    echo "browser_setup: need root or passwordless sudo to apt-get install chromium" >&2
    exit 1
  fi
  command -v apt-get >/dev/null 2>&1 || { echo "browser_setup: no apt-get on this system" >&2; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get install -y -qq chromium >/dev/null 2>&1 \
    || { "${SUDO[@]}" apt-get update -qq >/dev/null && "${SUDO[@]}" apt-get install -y -qq chromium >/dev/null; }
fi
"$PY" -c "import playwright.sync_api" 2>/dev/null || "$PY" -m pip install -q "playwright>=1.40"
echo "browser_setup: $(chromium --version 2>/dev/null || echo chromium), playwright $("$PY" -c 'import importlib.metadata as m; print(m.version("playwright"))')"
