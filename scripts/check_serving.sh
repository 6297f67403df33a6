#!/usr/bin/env bash
# Prove that serving needs neither torch nor transformers:
#   1. with a training Python (torch installed) export a tiny model + PyTorch reference vectors;
#   2. make a fresh venv with only the wheel's serving extras `[serve,faiss,qdrant-edge]` (+ pytest);
#   3. run tests/serving/torch_free/ there against the export, with torch/transformers blocked in sys.modules
#      (the serving path, and each console command refusing in one line an extra that is missing);
#   4. report the size of that venv (README states it).
# Usage: scripts/check_serving.sh [TRAIN_PYTHON] [WHEEL]
#   (defaults: .venv-test/bin/python; a wheel freshly built by scripts/build_wheel.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
TRAIN_PY="${1:-${MAGRETRIEVE_TRAIN_PYTHON:-.venv-test/bin/python}}"
WHEEL="${2:-}"
[ -n "$WHEEL" ] || WHEEL="$(bash scripts/build_wheel.sh "$TRAIN_PY")"
SERVE_VENV="$(realpath -m "${MAGRETRIEVE_SERVE_VENV:-.venv-serve}")"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

(cd "$WORK" && "$TRAIN_PY" "$REPO/tests/serving/torch_free/produce_export.py" "$WORK" >/dev/null)

rm -rf "$SERVE_VENV"
"${PYTHON:-python3}" -m venv "$SERVE_VENV"
"$SERVE_VENV/bin/pip" install -q --upgrade pip
"$SERVE_VENV/bin/pip" install -q "${WHEEL}[serve,faiss,qdrant-edge]"
SIZE_MB=$(du -sm "$SERVE_VENV" | cut -f1)
SITE="$("$SERVE_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
TOOLS_MB=$(cd "$SITE" && du -smc pip pip-* setuptools setuptools-* pkg_resources _distutils_hack 2>/dev/null | tail -1 | cut -f1)
"$SERVE_VENV/bin/pip" install -q pytest
for mod in torch transformers; do
    if "$SERVE_VENV/bin/python" -c "import $mod" 2>/dev/null; then
        echo "check_serving: the serving extras pulled in $mod" >&2
        exit 1
    fi
done
echo "check_serving: serve-only venv [serve,faiss,qdrant-edge] is ${SIZE_MB} MB; $((SIZE_MB - TOOLS_MB)) MB without pip/setuptools (measured before pytest is added)"
cd "$WORK"
MAGRETRIEVE_SERVING_EXPORT="$WORK/export" MAGRETRIEVE_SERVING_REQUIRE_NO_TORCH=1 \
    "$SERVE_VENV/bin/pytest" -q -p no:cacheprovider -c "$REPO/pyproject.toml" --rootdir "$REPO" \
    "$REPO/tests/serving/torch_free"
