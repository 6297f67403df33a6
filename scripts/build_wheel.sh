#!/usr/bin/env bash
# Build the magretrieve wheel (what users install) into wheelhouse/ and print its path.
# Usage: scripts/build_wheel.sh [PYTHON]   (the Python whose pip builds it; default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-python3}"
rm -rf wheelhouse build
"$PY" -m pip wheel -q --no-deps -w wheelhouse . >/dev/null
rm -rf build ./*.egg-info
ls "$PWD"/wheelhouse/magretrieve-*.whl
