"""Every console command whose extra is missing refuses in one line naming the pip install.

Where every extra is installed (this lane), the extra's modules are blocked in a fresh CLI
process (``tests/support/missing_extras.py`` holds the cases); the serve-only venv of
``scripts/check_serving.sh`` runs the same cases with the modules really absent
(``tests/serving/torch_free/test_cli_extras.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.exports import tiny_export_dir
from tests.support.missing_extras import CASES, Case, run_case


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_model_dir, tiny_beir_dir) -> dict[str, Path]:
    """Everything a case reads (exports, a store, data); never written by a case."""
    from magretrieve.serving.indexing import index_corpus
    from magretrieve.serving.retriever import Retriever

    cosine = tiny_export_dir(tmp_path_factory, tiny_model_dir, mode="cosine")
    folder = tmp_path_factory.mktemp("missing-extras")
    source = folder / "source"
    with Retriever.load(cosine, store=f"faiss:{source}") as retriever:
        index_corpus(retriever, tiny_beir_dir / "corpus.jsonl", progress=False)
    sts = folder / "sts.jsonl"
    sts.write_text(
        '{"sentence1": "a cat sits", "sentence2": "a cat sat", "score": 4.0}\n'
        '{"sentence1": "wing flow", "sentence2": "a cat sat", "score": 0.5}\n'
        '{"sentence1": "lung cancer", "sentence2": "cancer of the lung", "score": 4.5}\n'
    )
    queries = folder / "queries.txt"
    queries.write_text("statins heart\nwing flow\n")
    return {
        "export": tiny_export_dir(tmp_path_factory, tiny_model_dir),
        "cosine": cosine,
        "source": source,
        "model": tiny_model_dir,
        "beir": tiny_beir_dir,
        "corpus": tiny_beir_dir / "corpus.jsonl",
        "sts": sts,
        "queries": queries,
    }


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_missing_extra_is_one_line_naming_its_pip_install(
    case: Case, inputs: dict[str, Path], tmp_path: Path
) -> None:
    run_case(case, {**inputs, "out": tmp_path / "out"}, case.modules)


def test_every_command_has_a_case() -> None:
    from magretrieve.cli import main

    assert {c.command for c in CASES} == set(main.commands)
