"""``fit-prior --method field:NAME`` end to end on a tiny BEIR set whose documents carry a field.

The set has one judged split (so fit-prior must cross-fit over query folds and report the
held-out score), the prior file is rescaled into a FAISS store with the field's offset, a
document added later gets its offset from its own field, and bad fields are refused in one
line naming the field and the documents, with nothing written.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from magretrieve.cli import main
from magretrieve.stores import open_store
from tests.support.exports import tiny_export_dir
from tests.support.tiny_models import write_tiny_beir


@pytest.fixture(scope="module")
def cosine_export(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    return tiny_export_dir(tmp_path_factory, tiny_model_dir, mode="cosine")


def views_of(doc_id: str) -> int:
    """The judged document of each topic (``d{i}0``) is the much-viewed one."""
    return 50 if doc_id.endswith("0") else 2


def field_beir(folder: Path, change: dict[str, object] | None = None) -> Path:
    """The tiny BEIR set with a ``views`` field, only its train split judged; ``change``
    sets (or, with None, removes) fields of document d31."""
    write_tiny_beir(folder)
    (folder / "qrels" / "test.tsv").unlink()
    docs = [json.loads(line) for line in (folder / "corpus.jsonl").read_text().splitlines()]
    for doc in docs:
        doc["views"] = views_of(doc["_id"])
        doc["flat"] = 3
        if int(doc["_id"][1]) % 2:  # lengths differ between topics
            doc["text"] += " in young mice"
        if doc["_id"] == "d31" and change:
            for key, value in change.items():
                if value is None:
                    doc.pop(key, None)
                else:
                    doc[key] = value
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    return folder


def fit(export: Path, beir: Path, out: Path, method: str) -> tuple[int, str]:
    res = CliRunner().invoke(
        main,
        ["fit-prior", "--model", str(export), "--data", f"{beir}:train", "--out", str(out)]
        + ["--method", method],
    )
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, res.output


def test_fit_prior_field_cross_fits_and_rescales(cosine_export: Path, tmp_path: Path) -> None:
    from magretrieve.serving.indexing import index_corpus
    from magretrieve.serving.retriever import Retriever

    beir = field_beir(tmp_path / "beir")
    out = tmp_path / "prior.json"
    code, output = fit(cosine_export, beir, out, "field:views")
    assert code == 0, output
    assert "held out (5 query folds" in output
    written = json.loads(out.read_text())
    assert written["method"] == "field", written["label"]
    assert written["field"] == "views" and written["missing"] == "median"
    assert written["transform"] in ("raw", "log1p", "rank") and written["beta"] > 0
    assert written["training_ndcg"] == pytest.approx(1.0)
    assert written["grid"]["none (cosine)"] < 1.0
    held = written["held_out"]
    assert held["folds"] == 5 and len(held["chosen"]) == 5
    assert held["cosine"] == pytest.approx(written["grid"]["none (cosine)"])
    assert held["prior"] >= held["cosine"]

    # index the corpus with the cosine export, rescale it with the prior file
    src = tmp_path / "src"
    with Retriever.load(cosine_export, store=f"faiss:{src}") as r:
        index_corpus(r, beir / "corpus.jsonl", progress=False)
    res = CliRunner().invoke(
        main,
        ["rescale", "--source", f"faiss:{src}", "--target", f"faiss:{tmp_path / 'dst'}"]
        + ["--prior-file", str(out), "--json"],
    )
    assert res.exit_code == 0, res.output
    dst = open_store(f"faiss:{tmp_path / 'dst'}")
    ids = sorted(dst.iter_ids())
    stored = dst.get_vectors(ids)
    # two values, six documents each: z = ±1 whatever the transform
    z = np.array([1.0 if views_of(i) == 50 else -1.0 for i in ids])
    if written["form"] == "offset":
        np.testing.assert_allclose(stored[:, -1], written["beta"] * z, rtol=1e-5)
    else:
        norms = np.linalg.norm(stored, axis=1)
        np.testing.assert_allclose(norms, np.exp(written["beta"] * z), rtol=1e-5)
    dst.close()

    # a document added later gets its prior from its own field
    with Retriever.load(cosine_export, store=f"faiss:{tmp_path / 'dst'}") as r:
        r.add_documents(
            [
                {"_id": "new-hi", "title": "wing flow", "text": "wing flow x", "views": 50},
                {"_id": "new-lo", "title": "wing flow", "text": "wing flow x", "views": 2},
            ]
        )
        hi, lo = r.store.get_vectors(["new-hi", "new-lo"])
    if written["form"] == "offset":
        assert hi[-1] == pytest.approx(written["beta"], rel=1e-5)
        assert lo[-1] == pytest.approx(-written["beta"], rel=1e-5)
    else:
        assert np.linalg.norm(hi) == pytest.approx(math.exp(written["beta"]), rel=1e-5)
        assert np.linalg.norm(lo) == pytest.approx(math.exp(-written["beta"]), rel=1e-5)


def test_auto_and_hub_plus_field_try_the_field(cosine_export: Path, tmp_path: Path) -> None:
    beir = field_beir(tmp_path / "beir")
    code, output = fit(cosine_export, beir, tmp_path / "auto.json", "auto")
    assert code == 0, output
    grid = json.loads((tmp_path / "auto.json").read_text())["grid"]
    assert any(k.startswith("field(views,") for k in grid)
    assert any(k.startswith("field(_length,") for k in grid)
    assert not any(k.startswith("field(flat,") for k in grid)  # constant: not a candidate
    code, output = fit(cosine_export, beir, tmp_path / "both.json", "hub+field:views")
    assert code == 0, output
    grid = json.loads((tmp_path / "both.json").read_text())["grid"]
    assert any(k.startswith("hub(") and "+field(views," in k for k in grid)


@pytest.mark.parametrize(
    ("change", "method", "words"),
    [
        ({}, "field:clicks", ["'clicks'", "missing from all 12 documents"]),
        ({"views": "many"}, "field:views", ["'views'", "not a number", "'d31'"]),
        ({"views": float("nan")}, "field:views", ["'views'", "NaN or infinite", "'d31'"]),
        ({"views": -4}, "field:views:log1p", ["'views'", "negative in 1", "'d31'"]),
        ({}, "field:flat", ["'flat'", "constant", "'d00'"]),
        ({}, "hub+field:flat", ["'flat'", "constant"]),
    ],
)
def test_bad_field_is_one_line_and_writes_nothing(
    cosine_export: Path, tmp_path: Path, change: dict, method: str, words: list[str]
) -> None:
    beir = field_beir(tmp_path / "beir", change)
    out = tmp_path / "prior.json"
    code, output = fit(cosine_export, beir, out, method)
    assert code == 1, output
    assert "Traceback" not in output
    error = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1, output
    for w in words:
        assert w in error[0], error[0]
    assert not out.exists()


def test_rescale_with_a_bad_field_changes_nothing(cosine_export: Path, tmp_path: Path) -> None:
    from magretrieve.serving.indexing import index_corpus
    from magretrieve.serving.retriever import Retriever

    good = field_beir(tmp_path / "good")
    out = tmp_path / "prior.json"
    assert fit(cosine_export, good, out, "field:views")[0] == 0
    bad = field_beir(tmp_path / "bad", {"views": "lots"})
    src = tmp_path / "src"
    with Retriever.load(cosine_export, store=f"faiss:{src}") as r:
        index_corpus(r, bad / "corpus.jsonl", progress=False)
    before = {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()}
    res = CliRunner().invoke(
        main,
        ["rescale", "--source", f"faiss:{src}", "--target", f"faiss:{tmp_path / 'dst'}"]
        + ["--prior-file", str(out)],
    )
    assert res.exit_code == 1, res.output
    assert "'views'" in res.output and "'d31'" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "dst").exists()
    assert {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()} == before
