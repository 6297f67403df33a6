"""``magretrieve rescale``: stored unit vectors times a head / corpus-prior magnitude, no re-encoding."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from magretrieve.cli import main
from magretrieve.core.errors import ConfigError, StoreError
from magretrieve.data.readers import Document
from magretrieve.priors.base import unit
from magretrieve.priors.hub import HubPrior, hub_scores
from magretrieve.priors.rescale import META_KEY, apply_recorded_magnitude, read_all, rescale_store
from magretrieve.serving.retriever import Retriever
from magretrieve.stores import open_store
from magretrieve.train.encoder import Encoder

DOCS = [
    Document(f"doc{i}", text, title, {"n": i, "tags": ["x", str(i)]})
    for i, (title, text) in enumerate(
        [
            ("statins", "statins reduce heart risk"),
            ("cancer", "cancer cell protein gene"),
            ("wing", "wing flow over the plane"),
            ("vitamin", "vitamin dose and blood pressure"),
            ("lung", "smoking and lung cancer in patients"),
            ("brain", "the brain of the mouse"),
            ("liver", "liver and kidney drug trial"),
            ("engine", "engine heat at high speed"),
        ]
    )
]
COSINE_META = {
    "model_fingerprint": "f" * 64,
    "mode": "cosine",
    "gamma_q": 1.0,
    "gamma_d": 1.0,
    "dimension": 32,
    "metric": "inner_product",
    "document_contract": "unit_norm",
}


@pytest.fixture(scope="module")
def head_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A frozen-encoder linear head with non-zero weights, saved as a run folder."""
    enc = Encoder.load(tiny_model_dir, "qnorm", norm_head="linear", device="cpu")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in enc.norm_head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    enc.config.head = replace(enc.config.head, frozen_encoder=True)
    return enc.save(tmp_path_factory.mktemp("head") / "run")


@pytest.fixture(scope="module")
def cosine_vectors(tiny_model_dir: Path) -> np.ndarray:
    return Encoder.load(tiny_model_dir, "cosine", device="cpu").encode_documents(
        [d.full_text for d in DOCS]
    )


def payloads() -> list[dict]:
    return [dict(d.payload, title=d.title, text=d.text) for d in DOCS]


def build_source(spec_or_store, vectors: np.ndarray, meta=COSINE_META):
    store = open_store(spec_or_store, dimension=vectors.shape[1])
    store.add([d.id for d in DOCS], vectors, payloads())
    if meta is not None:
        store.write_metadata(meta)
    store.persist()
    return store


def test_faiss_head_rescale_keeps_ids_payloads_and_matches_reencoding(
    head_run: Path, cosine_vectors: np.ndarray, tmp_path: Path
) -> None:
    src = build_source(f"faiss:{tmp_path / 'src'}", cosine_vectors)
    src.close()
    report = rescale_store(
        f"faiss:{tmp_path / 'src'}", f"faiss:{tmp_path / 'dst'}", head=head_run, progress=False
    )
    assert report.count == len(DOCS) and report.kind == "norm_head"
    assert "re-encoded" in report.encoder_check
    dst = open_store(f"faiss:{tmp_path / 'dst'}")
    ids, vecs, pays = read_all(dst)
    assert ids == sorted(d.id for d in DOCS)
    by_id = {d.id: p for d, p in zip(DOCS, payloads(), strict=True)}
    assert pays == [by_id[i] for i in ids]
    # equals re-encoding the texts with the head (the "index with the head's export" result)
    headed = Encoder.load(head_run, device="cpu")
    order = [next(j for j, d in enumerate(DOCS) if d.id == i) for i in ids]
    expected = headed.encode_documents([DOCS[j].full_text for j in order])
    np.testing.assert_allclose(vecs, expected, rtol=1e-5, atol=1e-6)
    assert np.linalg.norm(vecs, axis=1).std() > 1e-3
    meta = dst.read_metadata()
    assert (
        meta[META_KEY]["kind"] == "norm_head" and meta["document_contract"] == "magnitude_keeping"
    )
    assert meta["model_fingerprint"] == COSINE_META["model_fingerprint"]
    dst.close()
    # the source is untouched
    src = open_store(f"faiss:{tmp_path / 'src'}")
    np.testing.assert_array_equal(read_all(src)[1], cosine_vectors[order])
    src.close()


def test_qdrant_head_rescale_writes_a_dot_collection(
    head_run: Path, cosine_vectors: np.ndarray
) -> None:
    src = build_source("qdrant-memory:src", cosine_vectors)
    dst = open_store("qdrant-memory:dst", dimension=cosine_vectors.shape[1])
    rescale_store(src, dst, head=head_run, progress=False)
    from qdrant_client import models

    info = dst.client.get_collection(dst.collection)
    assert info.config.params.vectors.distance == models.Distance.DOT
    ids, vecs, pays = read_all(dst)
    assert ids == sorted(d.id for d in DOCS)
    assert pays == [
        next(p for d, p in zip(DOCS, payloads(), strict=True) if d.id == i) for i in ids
    ]
    # search: score = cos(q, d) · m(d)
    q = unit(cosine_vectors[:1] + 0.1)
    hits = dst.search(q, 3)[0]
    mags = dict(zip(ids, np.linalg.norm(vecs, axis=1), strict=True))
    cos = dict(zip([d.id for d in DOCS], (q @ cosine_vectors.T)[0], strict=True))
    for h in hits:
        assert h.score == pytest.approx(cos[h.id] * mags[h.id], rel=1e-4)
    src.close()
    dst.close()


def test_corpus_prior_rescale_and_beta_zero(cosine_vectors: np.ndarray, tmp_path: Path) -> None:
    src = build_source("memory:", cosine_vectors)
    dst = open_store("memory:", dimension=32)
    report = rescale_store(src, dst, prior=HubPrior(beta=0.2, k=3), progress=False)
    assert report.encoder_check.startswith("not needed")
    ids, vecs, _ = read_all(dst)
    order = [next(j for j, d in enumerate(DOCS) if d.id == i) for i in ids]
    u = cosine_vectors[order]
    h = hub_scores(u, 3)
    np.testing.assert_allclose(
        vecs, u * np.exp(-0.2 * (h - h.mean()) / h.std())[:, None], rtol=1e-5
    )
    recipe = dst.read_metadata()[META_KEY]
    assert recipe["beta"] == 0.2 and recipe["mean"] == pytest.approx(h.mean())
    zero = open_store("memory:", dimension=32)
    rescale_store(src, zero, prior=HubPrior(beta=0.0), progress=False)
    np.testing.assert_allclose(read_all(zero)[1], u, atol=1e-6)


def test_refusals_leave_everything_as_it_was(
    head_run: Path, cosine_vectors: np.ndarray, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # not unit-norm
    scaled = cosine_vectors.copy()
    scaled[3] *= 1.5
    src = build_source("memory:", scaled)
    dst = open_store("memory:", dimension=32)
    with pytest.raises(StoreError, match="doc3.*not 1"):
        rescale_store(src, dst, head=head_run, progress=False)
    assert dst.count() == 0
    # a store built in a magnitude-keeping mode
    src = build_source("memory:", cosine_vectors, meta=dict(COSINE_META, mode="qnorm", gamma_d=0.0))
    with pytest.raises(StoreError, match="unit-norm"):
        rescale_store(src, dst, head=head_run, progress=False)
    # no metadata unless forced
    src = build_source("memory:", cosine_vectors, meta=None)
    with pytest.raises(StoreError, match="no model metadata"):
        rescale_store(src, dst, head=head_run, progress=False)
    # vectors of another encoder (unit-norm, but not the head's encoder)
    from tests.support.tiny_models import build_tiny_bert

    other = Encoder.load(build_tiny_bert(tmp_path / "other", seed=5), "cosine", device="cpu")
    src = build_source("memory:", other.encode_documents([d.full_text for d in DOCS]))
    with pytest.raises(StoreError, match="another encoder"):
        rescale_store(src, dst, head=head_run, progress=False)
    assert dst.count() == 0
    # a head trained jointly with its encoder cannot rescale the old encoder's vectors
    enc = Encoder.load(head_run, device="cpu")
    enc.config.head = replace(enc.config.head, frozen_encoder=False)
    joint = enc.save(tmp_path / "joint")
    src = build_source("memory:", cosine_vectors)
    with pytest.raises(ConfigError, match="trained together"):
        rescale_store(src, dst, head=joint, progress=False)
    # target not empty; already rescaled source; same spec
    full = build_source("memory:", cosine_vectors)
    with pytest.raises(StoreError, match="not empty"):
        rescale_store(src, full, head=head_run, progress=False)
    rescale_store(src, dst, head=head_run, progress=False)
    with pytest.raises(StoreError, match="already rescaled"):
        rescale_store(dst, open_store("memory:", dimension=32), head=head_run, progress=False)
    with pytest.raises(ConfigError, match="is the source"):
        rescale_store("faiss:x", "faiss:x", head=head_run)
    with pytest.raises(ConfigError, match="exactly one"):
        rescale_store(src, dst)


def test_documents_added_later_get_the_same_magnitude(
    head_run: Path, cosine_vectors: np.ndarray, tiny_model_dir: Path
) -> None:
    src = build_source("memory:", cosine_vectors)
    dst = open_store("memory:", dimension=32)
    rescale_store(src, dst, head=head_run, progress=False)
    new_text = "heart risk of statins in mice"
    expected = Encoder.load(head_run, device="cpu").encode_documents([new_text])
    base = Encoder.load(tiny_model_dir, "cosine", device="cpu")

    class CosineFake:  # stands in for the cosine export's OnnxEncoder
        manifest = SimpleNamespace(**COSINE_META, index_metric="inner_product", folder="")

        def encode_documents(self, texts, batch_size=32):
            return base.encode_documents(texts)

        def encode_queries(self, texts, batch_size=32):
            return base.encode_queries(texts)

    retriever = Retriever(CosineFake(), dst)
    retriever.add_documents([{"_id": "new", "title": "", "text": new_text}])
    np.testing.assert_allclose(dst.get_vectors(["new"]), expected, rtol=1e-5, atol=1e-6)
    # a store without a recipe is left alone
    vec = np.ones((1, 32), dtype=np.float32)
    assert apply_recorded_magnitude({"mode": "cosine"}, vec, dst) is vec


def test_cli_rescale_and_one_line_errors(
    head_run: Path, cosine_vectors: np.ndarray, tmp_path: Path
) -> None:
    build_source(f"faiss:{tmp_path / 'src'}", cosine_vectors).close()
    runner = CliRunner()
    res = runner.invoke(
        main,
        [
            "rescale",
            "--source",
            f"faiss:{tmp_path / 'src'}",
            "--target",
            f"faiss:{tmp_path / 'dst'}",
            "--head",
            str(head_run),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.output[res.output.index("{") :])["count"] == len(DOCS)
    prior = tmp_path / "prior.json"
    hub = {"beta": 0.02, "k": 3, "mean": 0.0, "std": 1.0, "method": "hub"}
    prior.write_text(json.dumps({**hub, "kind": "document_prior"}))
    res = runner.invoke(
        main,
        [
            "rescale",
            "--source",
            f"faiss:{tmp_path / 'src'}",
            "--target",
            f"faiss:{tmp_path / 'p'}",
            "--prior-file",
            str(prior),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "hub" in res.output
    assert f"rescaled {len(DOCS)} documents" in res.output
    lines = res.output.split("\n")
    header = lines[next(n for n, line in enumerate(lines) if "rescaled " in line) + 1]
    assert header.split() == ["magnitude", "min", "mean", "max", "encoder", "check"]
    res = runner.invoke(
        main,
        [
            "rescale",
            "--source",
            f"faiss:{tmp_path / 'dst'}",
            "--target",
            f"faiss:{tmp_path / 'x'}",
            "--corpus-prior",
            "0.1",
        ],
    )
    assert res.exit_code == 1
    assert "already rescaled" in res.output and "Traceback" not in res.output


def test_corpus_prior_applies_to_documents_added_later(cosine_vectors: np.ndarray) -> None:
    src = build_source("memory:", cosine_vectors)
    dst = open_store("memory:", dimension=32)
    rescale_store(src, dst, prior=HubPrior(beta=0.5, k=3), progress=False)
    meta = dst.read_metadata()
    rng = np.random.default_rng(0)
    new = unit(cosine_vectors[:2] + 0.05 * rng.normal(size=(2, 32)).astype(np.float32))
    out = apply_recorded_magnitude(meta, new * 3.0, dst)  # any input scale: only d̂ counts
    cos = new @ cosine_vectors.T
    hub = np.sort(cos, axis=1)[:, ::-1][:, :3].mean(axis=1)
    recipe = meta[META_KEY]
    m = np.exp(-0.5 * (hub - recipe["mean"]) / recipe["std"])
    np.testing.assert_allclose(out, new * m[:, None], rtol=1e-5)
