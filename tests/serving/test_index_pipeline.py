"""index_documents as a pipeline: read+tokenize, encode and write overlap through bounded
queues, yet the result equals encoding every text on its own, errors in any stage stop the
others and keep what was written, and a re-run resumes."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from magretrieve.core.errors import DataError, StoreError
from magretrieve.data.readers import Document
from magretrieve.serving.indexing import index_documents
from magretrieve.serving.retriever import Retriever
from magretrieve.stores import open_store
from tests.support.fake_encoder import FakeEncoder

WORDS = "statins heart cancer cell brain protein wing flow lung smoking vitamin dose".split()


def docs(n: int, seed: int = 0) -> list[Document]:
    rng = np.random.default_rng(seed)
    return [
        Document(f"d{i}", " ".join(rng.choice(WORDS, size=int(rng.integers(1, 30)))), f"T{i}")
        for i in range(n)
    ]


def pipeline_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("magretrieve-index")]


def test_onnx_pipeline_equals_encoding_each_text(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The real split path: tokens from the reader thread, graph in the encoder thread."""
    from magretrieve.export import export_model
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    folder = export_model(tiny_model_dir, tmp_path / "exp", mode="qnorm")
    encoder = OnnxEncoder.load(folder)
    corpus = docs(70)
    r = Retriever(encoder, open_store("memory:", dimension=encoder.dim))
    assert r.tokenize_batch(corpus[:2]) is not None  # the split path is the one under test
    report = index_documents(r, corpus, batch_size=16, progress=False)
    assert (report.seen, report.added, report.skipped, report.count) == (70, 70, 0, 70)
    want = OnnxEncoder.load(folder).encode_documents([d.full_text for d in corpus], batch_size=1)
    got = np.stack([r.store.get_vectors([d.id])[0] for d in corpus])
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert pipeline_threads() == []


def test_reader_stays_within_the_bounded_queues() -> None:
    """While the encoder is held, the reader may run only a few batches ahead."""
    release = threading.Event()

    class Held(FakeEncoder):
        def encode_documents(self, texts, batch_size: int = 32):
            release.wait(timeout=30)
            return super().encode_documents(texts, batch_size)

    pulled = 0

    def source():
        nonlocal pulled
        for d in docs(400):
            pulled += 1
            yield d

    r = Retriever(Held(), open_store("memory:", dimension=24))
    result: dict = {}
    worker = threading.Thread(
        target=lambda: result.setdefault(
            "report", index_documents(r, source(), batch_size=10, queue_size=2, progress=False)
        )
    )
    worker.start()
    deadline = threading.Event()
    deadline.wait(1.0)  # give the reader every chance to run ahead
    # one batch in the encoder, two in the read queue, one being built, one blocked on put
    assert pulled <= 10 * 5
    assert r.store.count() == 0
    release.set()
    worker.join(timeout=60)
    assert result["report"].added == 400 and r.store.count() == 400


def test_write_error_stops_every_stage_and_keeps_what_was_written(tmp_path: Path) -> None:
    spec = f"faiss:{tmp_path / 'ix'}"
    r = Retriever(FakeEncoder(), open_store(spec, dimension=24))
    real_add = r.store.add
    calls = {"n": 0}

    def add(ids, vectors, payloads):
        calls["n"] += 1
        if calls["n"] == 3:
            raise StoreError("simulated disk full")
        return real_add(ids, vectors, payloads)

    r.store.add = add  # type: ignore[method-assign]
    corpus = docs(100)
    with pytest.raises(StoreError, match="simulated disk full"):
        index_documents(r, corpus, batch_size=10, checkpoint_every=1000, progress=False)
    assert pipeline_threads() == []
    r.close()

    again = Retriever(FakeEncoder(), open_store(spec, dimension=24))
    assert again.store.count() == 20  # the two batches written before the error persisted
    report = index_documents(again, corpus, batch_size=10, progress=False)
    assert (report.added, report.skipped, report.count) == (80, 20, 100)
    again.close()


def test_reader_error_arrives_after_the_batches_before_it(tmp_path: Path) -> None:
    corpus = docs(35) + [Document("d3", "statins again")]
    r = Retriever(FakeEncoder(), open_store("memory:", dimension=24))
    with pytest.raises(DataError, match="duplicate document id 'd3'"):
        index_documents(r, list(enumerate(corpus, 1)), batch_size=10, progress=False)
    assert r.store.count() == 30  # three full batches were written, the fourth never was
    assert pipeline_threads() == []


def test_encoder_error_stops_the_reader() -> None:
    class Broken(FakeEncoder):
        def encode_documents(self, texts, batch_size: int = 32):
            raise RuntimeError("simulated onnxruntime failure")

    pulled = 0

    def endless():
        nonlocal pulled
        i = 0
        while True:  # only a stopped reader lets this test end
            pulled += 1
            i += 1
            yield Document(f"x{i}", "statins heart")

    r = Retriever(Broken(), open_store("memory:", dimension=24))
    with pytest.raises(RuntimeError, match="simulated onnxruntime failure"):
        index_documents(r, endless(), batch_size=5, progress=False)
    assert pipeline_threads() == []
    assert pulled < 100 and r.store.count() == 0
