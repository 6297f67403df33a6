#!/usr/bin/env bash
# Prove that serving needs neither torch nor transformers:
#   1. with a training Python (torch installed) export a tiny model + PyTorch reference vectors;
#   2. make a fresh venv with only `pip install -e ".[serve]"` (+ pytest);
#   3. run tests/serving/test_torch_free.py there against the export.
# Usage: scripts/check_serving.sh [TRAIN_PYTHON]   (default: .venv-test/bin/python, else /work/venv)
set -euo pipefail
cd "$(dirname "$0")/.."
TRAIN_PY="${1:-${MAGRETRIEVE_TRAIN_PYTHON:-}}"
if [ -z "$TRAIN_PY" ]; then
    if [ -x .venv-test/bin/python ]; then TRAIN_PY=.venv-test/bin/python; else TRAIN_PY=/work/venv/bin/python; fi
fi
SERVE_VENV="${MAGRETRIEVE_SERVE_VENV:-.venv-serve}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

"$TRAIN_PY" tests/serving/produce_export.py "$WORK" >/dev/null

rm -rf "$SERVE_VENV"
"${PYTHON:-python3}" -m venv "$SERVE_VENV"
"$SERVE_VENV/bin/pip" install -q --upgrade pip
"$SERVE_VENV/bin/pip" install -q -e ".[serve]" pytest
if "$SERVE_VENV/bin/python" -c "import torch" 2>/dev/null \
   || "$SERVE_VENV/bin/python" -c "import transformers" 2>/dev/null; then
    echo "check_serving: the serve extra pulled in torch or transformers" >&2
    exit 1
fi
MAGRETRIEVE_SERVING_EXPORT="$WORK/export" MAGRETRIEVE_SERVING_REQUIRE_NO_TORCH=1 \
    "$SERVE_VENV/bin/python" -m pytest -q -p no:cacheprovider tests/serving/test_torch_free.py
