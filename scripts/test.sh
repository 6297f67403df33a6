#!/usr/bin/env bash
# Build the wheel, install it (not editable) into a fresh virtual environment, and run lint,
# the type check, the torch-free serving check and the whole test suite against the INSTALLED
# package, in two lanes: the unit lane (`-m "not integration and not slow"`, minutes, one
# pytest-xdist worker per core) and then
# the integration lane (`-m "integration or slow"`: PostgreSQL, Milvus, Ray, the wheel, the
# benchmarks' smoke runs, the real encoder). Each test module declares its lane with
# `pytestmark`; tests/conftest.py fails a test that needs the integration lane but is unmarked.
# The -m given here overrides the unit-lane default of pyproject's addopts.
# This is the README's test command; .ci/run runs exactly this.
#   MAGRETRIEVE_TEST_LANE=unit|integration|all (default all) runs one lane only;
#   arguments (tests/<layer>/test_x.py::name, -k ...) run those tests, of either lane, as one
#   pytest call instead (add -m to filter them by lane).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
VENV="$(realpath -m "${MAGRETRIEVE_TEST_VENV:-.venv-test}")"
PYTHON="${PYTHON:-python3}"
# Every optional integration is tested, so the test venv takes every extra.
EXTRAS="all,peer,dev,pgvector,milvus,chroma,lancedb,scann,langchain,llama-index,haystack,ray,openvino-int8,clients"
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
# Type-check lane: files and strictness per layer are configured in pyproject.toml ([tool.mypy]).
"$VENV/bin/mypy"
# Serving must work without torch/transformers: a second venv with only the serving extras.
bash scripts/check_serving.sh "$VENV/bin/python" "$WHEEL"
# The test lanes last, so the closing line is a pytest summary. They run from outside the source
# tree so that neither pytest nor any subprocess a test starts can import magretrieve from the
# checkout: the installed wheel is what is tested (tests/package/test_wheel.py checks that too).
# Arguments that name files of the checkout (tests/<layer>/test_x.py::name) are made absolute.
ARGS=()
for arg in "$@"; do
    if [ -e "${arg%%::*}" ]; then ARGS+=("$REPO/$arg"); else ARGS+=("$arg"); fi
done
RUN_DIR="$(mktemp -d)"
trap 'rm -rf "$RUN_DIR"' EXIT
cd "$RUN_DIR"
run_pytest() {
    MAGRETRIEVE_TEST_INSTALLED=1 MAGRETRIEVE_REPO="$REPO" MAGRETRIEVE_WHEEL="$WHEEL" \
        "$VENV/bin/pytest" -q -p no:cacheprovider -c "$REPO/pyproject.toml" --rootdir "$REPO" "$@"
}
if [ ${#ARGS[@]} -gt 0 ]; then
    # -m "" lifts the unit-lane default of addopts: named tests run whatever their lane
    run_pytest -m "" "${ARGS[@]}"
    exit
fi
LANE="${MAGRETRIEVE_TEST_LANE:-all}"
case "$LANE" in
    unit | integration | all) ;;
    *) echo "MAGRETRIEVE_TEST_LANE must be unit, integration or all, got '$LANE'" >&2; exit 2 ;;
esac
if [ "$LANE" != integration ]; then
    echo "== unit lane"
    # pytest-xdist: one worker per core (at most 4), each on one thread (tests/conftest.py)
    run_pytest -n auto --maxprocesses 4 -m "not integration and not slow" "$REPO/tests"
fi
if [ "$LANE" != unit ]; then
    echo "== integration lane"
    run_pytest -m "integration or slow" "$REPO/tests"
fi
