"""The whole serving path in an environment without torch and transformers.

Runs in the serve-only venv of ``scripts/check_serving.sh`` (the wheel with
``[serve,faiss,qdrant-edge]``) against fixtures made by ``tests/serving/torch_free/produce_export.py``.
Skipped unless ``MAGRETRIEVE_SERVING_EXPORT`` names those fixtures. ``torch`` and
``transformers`` are blocked in ``sys.modules`` (here and in every CLI subprocess), so an import of
either anywhere on the path fails loudly instead of being satisfied by a stray install.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

EXPORT = os.environ.get("MAGRETRIEVE_SERVING_EXPORT")
pytestmark = pytest.mark.skipif(
    not EXPORT, reason="set MAGRETRIEVE_SERVING_EXPORT (scripts/check_serving.sh)"
)
BLOCKED = ("torch", "transformers")
#: Runs the CLI with torch and transformers blocked.
CLI = (
    "import sys\n"
    f"for name in {BLOCKED!r}: sys.modules[name] = None\n"
    "from magretrieve.cli import main\n"
    "sys.exit(main())\n"
)


@pytest.fixture(autouse=True)
def _block_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in BLOCKED:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture(scope="module")
def fixtures() -> Path:
    return Path(EXPORT).parent


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-c", CLI, *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return proc


def store_backends() -> list[str]:
    kinds = ["memory", "faiss", "qdrant-edge"]
    if importlib.util.find_spec("qdrant_client") is not None:
        kinds.append("qdrant-local")
    return kinds


def spec_for(kind: str, folder: Path) -> str:
    return {
        "memory": f"memory:{folder / 'mem'}",
        "faiss": f"faiss:{folder / 'faiss'}",
        "qdrant-edge": f"qdrant-edge:{folder / 'edge'}",
        "qdrant-local": f"qdrant-local:{folder / 'qdrant'}/docs",
    }[kind]


def read_vectors(spec: str) -> dict[str, np.ndarray]:
    from magretrieve import open_store
    from magretrieve.priors.rescale import read_all

    store = open_store(spec)
    try:
        ids, vectors, _ = read_all(store)
        return dict(zip(ids, vectors, strict=True))
    finally:
        store.close()


def test_environment_has_no_torch_or_transformers() -> None:
    if os.environ.get("MAGRETRIEVE_SERVING_REQUIRE_NO_TORCH") != "1":
        pytest.skip("not running in the serve-only venv")
    for name in BLOCKED:
        sys.modules.pop(name, None)
        assert importlib.util.find_spec(name) is None, f"{name} is installed in the serve venv"


def test_onnx_encoder_matches_pytorch_reference(fixtures: Path) -> None:
    import magretrieve
    from magretrieve import OnnxEncoder

    texts = json.loads((fixtures / "texts.json").read_text())
    expected = np.load(fixtures / "expected.npz")
    enc = OnnxEncoder.load(fixtures / "export", threads=1)
    assert enc.similarity.mode == "qnorm"
    assert enc.similarity.mode in magretrieve.MODES  # the package's top level imports torch-free
    np.testing.assert_allclose(enc.encode_queries(texts), expected["queries"], atol=1e-5)
    np.testing.assert_allclose(enc.encode_documents(texts), expected["documents"], atol=1e-5)


def test_tampered_export_refused(tmp_path: Path) -> None:
    from magretrieve import ManifestError, OnnxEncoder

    copy = shutil.copytree(EXPORT, tmp_path / "copy")
    (copy / "tokenizer.json").write_text((copy / "tokenizer.json").read_text() + " ")
    with pytest.raises(ManifestError, match="tokenizer.json"):
        OnnxEncoder.load(copy)


@pytest.mark.parametrize("kind", store_backends())
def test_retriever_add_search_batch_on_every_embedded_store(
    fixtures: Path, tmp_path: Path, kind: str
) -> None:
    from magretrieve import OnnxEncoder, Retriever
    from magretrieve.data.readers import load_corpus

    docs = list(load_corpus(fixtures / "beir" / "corpus.jsonl").values())
    encoder = OnnxEncoder.load(fixtures / "export", threads=1)
    spec = spec_for(kind, tmp_path)
    with Retriever.load(fixtures / "export", store=spec) as retriever:
        assert retriever.add_documents(docs) == len(docs)
        retriever.persist()
        query = "statins heart risk"
        hits = retriever.search(query)
        batch = retriever.search_batch([query, "wing flow"])
    # exact reference: the inner product of the ONNX query vector with every document vector
    q = encoder.encode_queries([query])[0]
    d = encoder.encode_documents([doc.full_text for doc in docs])
    scores = d @ q
    order = np.argsort(-scores, kind="stable")[: len(hits)]
    assert [h.id for h in hits] == [docs[i].id for i in order]
    np.testing.assert_allclose([h.score for h in hits], scores[order], rtol=1e-4, atol=1e-5)
    assert [h.id for h in batch[0]] == [h.id for h in hits]
    assert len(batch) == 2 and len(batch[1]) == len(hits)


def test_cli_index_search_rescale_and_fit_prior(fixtures: Path, tmp_path: Path) -> None:
    corpus = fixtures / "beir" / "corpus.jsonl"
    cosine = fixtures / "export-cosine"
    source = f"faiss:{tmp_path / 'src'}"
    cli("index", str(cosine), str(corpus), "--store", source, "--no-progress")
    out = json.loads(
        cli("search", str(cosine), "statins heart", "--store", source, "--json").stdout
    )
    assert out["query"] == "statins heart" and {"id", "score", "doc_norm"} <= set(out["hits"][0])

    # rescale --head: m(d) = exp(g(d̂)) from the head's safetensors, compared with PyTorch's
    head_target = f"faiss:{tmp_path / 'head'}"
    cli(
        "rescale", "--source", source, "--target", head_target,
        "--head", str(fixtures / "head-run"), "--skip-encoder-check", "--json",
    )  # fmt: skip
    expected = np.load(fixtures / "head_expected.npz")
    src, dst = read_vectors(source), read_vectors(head_target)
    for doc_id, magnitude in zip(expected["ids"].tolist(), expected["magnitude"], strict=True):
        np.testing.assert_allclose(np.linalg.norm(dst[doc_id]), magnitude, rtol=1e-4)
        np.testing.assert_allclose(dst[doc_id], src[doc_id] * magnitude, rtol=1e-4, atol=1e-6)

    # fit-prior on the ONNX export, then rescale --prior-file with what it wrote
    prior_file = tmp_path / "prior.json"
    report = json.loads(
        cli(
            "fit-prior", "--model", str(cosine), "--data", f"{fixtures / 'beir'}:train",
            "--out", str(prior_file), "--eval", f"{fixtures / 'beir'}:test", "--json",
        ).stdout
    )  # fmt: skip
    assert set(report) >= {"prior", "evaluations"} and prior_file.is_file()
    assert report["evaluations"][0]["data"].endswith(":test")
    prior_target = f"faiss:{tmp_path / 'prior'}"
    cli(
        "rescale", "--source", source, "--target", prior_target,
        "--prior-file", str(prior_file), "--json",
    )  # fmt: skip
    rescaled = read_vectors(prior_target)
    assert set(rescaled) == set(src)
    dim = len(next(iter(src.values())))
    for doc_id, vector in rescaled.items():  # same directions, magnitudes m(d) > 0
        direction = vector[:dim]  # [m(d)·d̂ ; b(d)] when the prior has an additive offset
        cos = direction @ src[doc_id] / (np.linalg.norm(direction) * np.linalg.norm(src[doc_id]))
        assert cos == pytest.approx(1.0, abs=1e-5)
        assert len(vector) in (dim, dim + 1)  # one extra coordinate at most


def test_rescale_head_encoder_check_names_the_missing_torch(fixtures: Path, tmp_path: Path) -> None:
    source = f"faiss:{tmp_path / 'src'}"
    cli("index", str(fixtures / "export-cosine"), str(fixtures / "beir" / "corpus.jsonl"),
        "--store", source, "--no-progress")  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", CLI, "rescale", "--source", source, "--target",
         f"faiss:{tmp_path / 'dst'}", "--head", str(fixtures / "head-run")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    message = proc.stderr.strip().splitlines()[-1]
    assert "torch" in message and "--skip-encoder-check" in message
    assert not (tmp_path / "dst").exists()
