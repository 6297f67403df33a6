"""On a serving install, every console command whose extra is missing refuses in one line.

Runs in the serve-only venv of ``scripts/check_serving.sh`` (``[serve,faiss,qdrant-edge]``),
where the extras of these cases (the server, PyTorch, the other stores, Ray, OpenVINO, scipy)
are really not installed; ``tests/support/missing_extras.py`` holds the cases and the check
(one ``Error:`` line naming ``pip install 'magretrieve[EXTRA]'``, exit 1, nothing written).
Skipped unless ``MAGRETRIEVE_SERVING_EXPORT`` names the fixtures of ``produce_export.py``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.missing_extras import CASES, Case, run_case

EXPORT = os.environ.get("MAGRETRIEVE_SERVING_EXPORT")
pytestmark = pytest.mark.skipif(
    not EXPORT, reason="set MAGRETRIEVE_SERVING_EXPORT (scripts/check_serving.sh)"
)
#: blocked as in the other torch-free tests, so a stray install cannot answer instead
BLOCKED = ("torch", "transformers")
SERVING_CASES = [c for c in CASES if not c.with_torch]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    fixtures = Path(str(EXPORT)).parent
    folder = tmp_path_factory.mktemp("missing-extras")
    source = folder / "source"
    corpus = fixtures / "beir" / "corpus.jsonl"
    subprocess.run(
        [sys.executable, "-m", "magretrieve", "index", str(fixtures / "export-cosine"),
         str(corpus), "--store", f"faiss:{source}", "--no-progress"],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    sts = folder / "sts.jsonl"
    sts.write_text(
        '{"sentence1": "a cat sits", "sentence2": "a cat sat", "score": 4.0}\n'
        '{"sentence1": "wing flow", "sentence2": "a cat sat", "score": 0.5}\n'
    )
    queries = folder / "queries.txt"
    queries.write_text("statins heart\nwing flow\n")
    return {
        "export": fixtures / "export",
        "cosine": fixtures / "export-cosine",
        "source": source,
        "model": fixtures / "model",
        "beir": fixtures / "beir",
        "corpus": corpus,
        "sts": sts,
        "queries": queries,
    }


@pytest.mark.parametrize("case", SERVING_CASES, ids=[c.id for c in SERVING_CASES])
def test_a_missing_extra_is_one_line_naming_its_pip_install(
    case: Case, inputs: dict[str, Path], tmp_path: Path
) -> None:
    # in the serve-only venv none is installed; elsewhere an installed extra is not missing
    installed = [m for m in case.modules if m not in BLOCKED and importlib.util.find_spec(m)]
    if installed and os.environ.get("MAGRETRIEVE_SERVING_REQUIRE_NO_TORCH") != "1":
        pytest.skip(f"{', '.join(installed)} installed here: the extra is not missing")
    run_case(case, {**inputs, "out": tmp_path / "out"}, BLOCKED)
