#!/usr/bin/env bash
# Rewrite the screenshots in docs/img/ from the browser tests (tests/server/test_pages.py): the search
# page, its 400 px view, the key flow, /docs and diagnose.html, as headless Chromium shows them.
# Usage: scripts/screenshots.sh [PYTHON]   (a Python with magretrieve[all,dev]; default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-python3}"
MAGRETRIEVE_SCREENSHOTS="$PWD/docs/img" "$PY" -m pytest -q -p no:cacheprovider -n0 \
    tests/server/test_pages.py -k chromium
ls docs/img
