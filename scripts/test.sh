#!/usr/bin/env bash
# Build the wheel, install it (not editable) into a fresh virtual environment, and run lint,
# the torch-free serving check and the whole test suite against the INSTALLED package.
# This is the README's test command; .ci/run runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
VENV="$(realpath -m "${MAGRETRIEVE_TEST_VENV:-.venv-test}")"
PYTHON="${PYTHON:-python3}"
# Every optional integration is tested, so the test venv takes every extra.
EXTRAS="all,peer,dev,pgvector,milvus,chroma,lancedb,langchain,llama-index,haystack,ray,openvino-int8"
if [ "${MAGRETRIEVE_REUSE_VENV:-0}" != "1" ] || [ ! -x "$VENV/bin/python" ]; then
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
fi
WHEEL="$(bash scripts/build_wheel.sh "$VENV/bin/python")"
# torch==2.13.0 (CPU) is pinned in the 'train' extra; it installs from local disk here.
"$VENV/bin/pip" install -q "${WHEEL}[${EXTRAS}]"
"$VENV/bin/pip" install -q --no-deps --force-reinstall "$WHEEL"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
# Serving must work without torch/transformers: a second venv with only the serving extras.
bash scripts/check_serving.sh "$VENV/bin/python" "$WHEEL"
# The whole suite last, so its summary is the closing line. It runs from outside the source
# tree so that neither pytest nor any subprocess a test starts can import magretrieve from the
# checkout: the installed wheel is what is tested (tests/test_wheel.py checks that too).
# Arguments that name files of the checkout (tests/test_x.py::name) are made absolute.
ARGS=()
for arg in "$@"; do
    if [ -e "${arg%%::*}" ]; then ARGS+=("$REPO/$arg"); else ARGS+=("$arg"); fi
done
[ ${#ARGS[@]} -eq 0 ] && ARGS=("$REPO/tests")
RUN_DIR="$(mktemp -d)"
trap 'rm -rf "$RUN_DIR"' EXIT
cd "$RUN_DIR"
MAGRETRIEVE_TEST_INSTALLED=1 MAGRETRIEVE_REPO="$REPO" \
    MAGRETRIEVE_WHEEL="$WHEEL" "$VENV/bin/pytest" -q -p no:cacheprovider -c "$REPO/pyproject.toml" --rootdir "$REPO" \
    "${ARGS[@]}"
