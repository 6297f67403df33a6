#!/usr/bin/env bash
# Install magretrieve into a fresh virtual environment and run lint + the whole test suite.
# This is the README's test command; .ci/run runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${MAGRETRIEVE_TEST_VENV:-.venv-test}"
PYTHON="${PYTHON:-python3}"
if [ "${MAGRETRIEVE_REUSE_VENV:-0}" != "1" ] || [ ! -x "$VENV/bin/python" ]; then
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    # torch==2.13.0 (CPU) is pinned in the 'train' extra; it installs from local disk here.
    "$VENV/bin/pip" install -q -e ".[all,peer,dev]"
fi
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
# Serving must work without torch/transformers: a second venv with only the serve extra.
bash scripts/check_serving.sh "$VENV/bin/python"
# The whole suite last, so its summary is the closing line.
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
