"""The embedding engine in-process, without HTTP: concurrent calls (asyncio tasks and threads)
share graph runs, each call gets its own rows back in order, limits and sides refuse with typed
errors, and a Retriever searches through it."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from magretrieve.serving.engine import EmbeddingEngine
from magretrieve.serving.errors import Draining, InputTooLarge, InvalidInput, QueueFull
from magretrieve.serving.settings import EngineSettings

DIM = 3


class CountingEncoder:
    """Tokenizes a text into one token per word (ids are the words' lengths), at most 4 per
    text; a graph run returns per text [first id, number of tokens, rows of its batch] and is
    counted per side."""

    def __init__(self) -> None:
        self.manifest = SimpleNamespace(
            dimension=DIM, max_query_length=4, max_document_length=4, folder=None
        )
        self.runs: list[tuple[str, int]] = []
        self.gate = threading.Event()  # a graph run waits here while it is clear
        self.gate.set()
        self.entered = threading.Event()  # set once a graph run has started
        self.opened: list[str] = []

    def session(self, side: str) -> str:
        self.opened.append(side)
        return side

    def tokenize(self, texts: list[str], side: str) -> list[SimpleNamespace]:
        out = []
        for t in texts:
            ids = [len(w) for w in t.split()]
            out.append(SimpleNamespace(ids=ids[:4], overflowing=ids[4:]))
        return out

    def encode_tokenized(self, encodings, side, batch_size=None, max_batch_tokens=None):
        self.entered.set()
        self.gate.wait(5)
        self.runs.append((side, len(encodings)))
        return np.array(
            [[e.ids[0], len(e.ids), len(encodings)] for e in encodings], dtype=np.float32
        )


def engine_of(encoder: CountingEncoder, **settings) -> EmbeddingEngine:
    return EmbeddingEngine(encoder, EngineSettings(graph_workers=1, **settings))


def test_concurrent_async_calls_share_one_graph_run() -> None:
    enc = CountingEncoder()
    enc.gate.clear()  # hold the first run: the other calls queue up behind it

    async def go(engine: EmbeddingEngine) -> list:
        first = asyncio.ensure_future(engine.embed(["a"], "query"))
        # the worker takes the first call alone and is held in the graph
        assert await asyncio.get_running_loop().run_in_executor(None, enc.entered.wait, 5)
        rest = [
            asyncio.ensure_future(engine.embed([f"{'x' * (i + 1)} y", "zz"], "query"))
            for i in range(5)
        ]
        while engine.depth < 5:  # the five others wait behind it
            await asyncio.sleep(0.005)
        enc.gate.set()
        return [await first, *await asyncio.gather(*rest)]

    with engine_of(enc, max_wait_ms=200) as engine:
        out = asyncio.run(go(engine))
    # 6 calls, 2 graph runs: the first alone, the 5 queued behind it merged into one of 10 rows
    assert enc.runs == [("query", 1), ("query", 10)]
    assert out[0].vectors.tolist() == [[1, 1, 1]]
    for i, call in enumerate(out[1:]):
        assert call.vectors[:, 0].tolist() == [i + 1, 2]  # its own rows, in its order
        assert call.vectors[:, 2].tolist() == [10, 10]
        assert call.tokens == [2, 1] and call.truncated == [False, False]


def wait_until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_threads_share_graph_runs_through_the_sync_path() -> None:
    enc = CountingEncoder()
    enc.gate.clear()
    engine = engine_of(enc, max_wait_ms=200)
    results: dict[int, np.ndarray] = {}

    def call(i: int) -> None:
        results[i] = engine.encode_queries(["w" * (i + 1)])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    with engine:
        threads[0].start()
        assert enc.entered.wait(5)  # the first call runs alone and is held in the graph
        for t in threads[1:]:
            t.start()
        wait_until(lambda: engine.depth == 7)  # the seven others wait behind it
        enc.gate.set()
        for t in threads:
            t.join(5)
    assert enc.runs == [("query", 1), ("query", 7)]  # 8 calls, 2 model calls
    assert sorted(results) == list(range(8))
    for i, vec in results.items():
        assert vec.dtype == np.float32 and vec[0, 0] == i + 1


def test_async_and_thread_callers_merge_into_the_same_batch() -> None:
    enc = CountingEncoder()
    enc.gate.clear()
    with engine_of(enc, max_wait_ms=300) as engine:
        holder = threading.Thread(target=engine.encode_documents, args=(["held"],))
        holder.start()
        assert enc.entered.wait(5)
        waiter = threading.Thread(target=engine.encode_documents, args=(["aa", "cc"],))
        waiter.start()

        async def go() -> None:
            task = asyncio.ensure_future(engine.embed(["ddd"], "document"))
            while engine.depth < 2:
                await asyncio.sleep(0.01)
            enc.gate.set()
            await task

        asyncio.run(go())
        holder.join(5)
        waiter.join(5)
    assert enc.runs == [("document", 1), ("document", 3)]


def test_limits_and_sides_refuse_with_typed_errors() -> None:
    enc = CountingEncoder()
    with engine_of(enc, max_inputs=2, max_text_chars=10) as engine:
        with pytest.raises(InvalidInput, match="input is empty"):
            engine.embed_sync([], "query")
        with pytest.raises(InvalidInput, match="#1 is empty or only whitespace"):
            engine.embed_sync(["a", " \u200b"], "query")
        with pytest.raises(
            InputTooLarge, match=r"holds 3 texts; at most 2 per request are taken \(max_inputs\)"
        ):
            engine.embed_sync(["a", "b", "c"], "query")
        with pytest.raises(InputTooLarge, match="#0 has 11 characters; at most 10 per text"):
            engine.embed_sync(["x" * 11], "query")
        with pytest.raises(InvalidInput, match="side must be 'query' or 'document'"):
            engine.embed_sync(["a"], "passage")
        with pytest.raises(InputTooLarge, match="longer than max_query_length=4 tokens"):
            engine.embed_sync(["a b c d e"], "query", truncate=False)
        cut = engine.embed_sync(["a b c d e", "a"], "query")
        assert cut.truncated == [True, False] and cut.tokens == [4, 1]
        # the encoder protocol's path has no per-request limits: 5 texts in calls of 2
        vectors = engine.encode_queries(["y" * 20, "a", "b", "c", "d"])
        assert vectors.shape == (5, DIM) and vectors[0, 0] == 20
        assert [n for _, n in enc.runs][-3:] == [2, 2, 1]
        # batch_size caps the texts per call below max_inputs
        engine.encode_documents(["a", "b", "c"], batch_size=1)
        assert enc.runs[-3:] == [("document", 1)] * 3
        with pytest.raises(InvalidInput, match="batch_size must be at least 1, got 0"):
            engine.encode_documents(["a"], batch_size=0)
        # no text: an empty (0, dim) matrix and no graph run, in both forms; a lone string refused
        runs = len(enc.runs)
        assert engine.encode([], "query").shape == (0, DIM)
        assert asyncio.run(engine.aencode([], "document")).shape == (0, DIM)
        assert len(enc.runs) == runs
        with pytest.raises(InvalidInput, match="pass a list of texts, not a single string"):
            engine.encode("abc", "query")
    with pytest.raises(Draining):  # closed: no new calls
        engine.embed_sync(["a"], "query")


def test_a_full_queue_refuses_at_once() -> None:
    enc = CountingEncoder()
    enc.gate.clear()
    with engine_of(enc, max_queue=1, max_wait_ms=0) as engine:
        first = threading.Thread(target=engine.encode_queries, args=(["a"],))
        first.start()
        assert enc.entered.wait(5)
        second = threading.Thread(target=engine.encode_queries, args=(["b"],))
        second.start()
        wait_until(lambda: engine.depth == 1)
        with pytest.raises(QueueFull, match=r"queue is full \(1 requests waiting\)"):
            engine.encode_queries(["c"])
        enc.gate.set()
        first.join(5)
        second.join(5)
    assert [n for _, n in enc.runs] == [1, 1]


def test_a_retriever_encodes_through_the_engine(tmp_path) -> None:
    from magretrieve.serving.retriever import Retriever
    from magretrieve.stores import open_store

    enc = CountingEncoder()
    enc.manifest = SimpleNamespace(
        dimension=DIM,
        max_query_length=4,
        max_document_length=4,
        folder=None,
        model_fingerprint="f" * 64,
        mode="qnorm",
        gamma_q=1.0,
        gamma_d=0.0,
        index_metric="inner_product",
        document_contract="magnitude_keeping",
    )
    with engine_of(enc) as engine:
        retriever = Retriever(engine, open_store("memory:", dimension=DIM))
        retriever.add_documents(
            [{"_id": "long", "text": "aaaa"}, {"_id": "short", "text": "b"}], batch_size=8
        )
        hits = retriever.search("ccc", k=2)
    # document vectors [4, 1, 2] and [1, 1, 2]; query [3, 1, 1]: scores 15 and 6
    assert [(h.id, h.score) for h in hits] == [("long", 15.0), ("short", 6.0)]
    assert ("document", 2) in enc.runs and ("query", 1) in enc.runs
