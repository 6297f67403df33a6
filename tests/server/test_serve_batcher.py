"""The dynamic batcher on its own, with a counting fake encoder: merging, budgets, the bounded
queue, draining on close, and errors handed to every waiting request."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from magretrieve.serving.batcher import DynamicBatcher
from magretrieve.serving.errors import Draining, QueueFull
from magretrieve.serving.settings import EngineSettings


def enc(n_tokens: int, value: float) -> SimpleNamespace:
    """A fake tokenizer encoding: ``n_tokens`` ids, all equal to ``value``."""
    return SimpleNamespace(ids=[value] * n_tokens)


class FakeEncoder:
    """Returns each text's first id as a 2-d vector [id, rows of its batch]; records batches
    (side and rows) and their order (side and smallest first id)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.batches: list[tuple[str, int]] = []
        self.order: list[tuple[str, float]] = []
        self.delay = delay
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, encodings, side):
        self.gate.wait(5)
        time.sleep(self.delay)
        self.batches.append((side, len(encodings)))
        self.order.append((side, min(e.ids[0] for e in encodings)))
        return np.array([[e.ids[0], len(encodings)] for e in encodings], dtype=np.float32)


def run(coro):
    return asyncio.run(coro)


async def held_at_the_gate(b: DynamicBatcher, jobs_left: int = 0) -> None:
    """Once the request just submitted is queued and the worker took its first batch (held at
    the encoder's gate), with ``jobs_left`` of its jobs still queued."""
    await asyncio.sleep(0)
    while b._waiting > jobs_left:
        await asyncio.sleep(0.01)


def test_concurrent_requests_merge_into_one_batch_in_order() -> None:
    fake = FakeEncoder()
    fake.gate.clear()  # the worker holds a document batch while the queries queue up
    b = DynamicBatcher(fake, EngineSettings(graph_workers=1, max_wait_ms=200))
    b.start()

    async def go():
        busy = asyncio.ensure_future(b.submit("document", [enc(5, -1)]))
        await held_at_the_gate(b)
        queries = [
            asyncio.ensure_future(b.submit("query", [enc(5, 10 * i + j) for j in range(2)]))
            for i in range(4)
        ]
        await asyncio.sleep(0.05)
        fake.gate.set()
        await busy
        return await asyncio.gather(*queries)

    try:
        out = run(go())
    finally:
        b.close()
    # four requests of two texts: one graph run of 8 rows, each request gets its own rows back
    assert fake.batches == [("document", 1), ("query", 8)]
    for i, vecs in enumerate(out):
        assert vecs[:, 0].tolist() == [10 * i, 10 * i + 1]
        assert vecs[:, 1].tolist() == [8, 8]


def test_token_budget_and_row_cap_close_a_batch() -> None:
    fake = FakeEncoder()
    fake.gate.clear()  # hold the worker so that every request is queued before merging
    b = DynamicBatcher(
        fake,
        EngineSettings(graph_workers=1, max_wait_ms=0, max_batch_tokens=100, max_batch_rows=64),
    )
    b.start()

    async def go():
        tasks = [asyncio.ensure_future(b.submit("document", [enc(30, i)])) for i in range(7)]
        await asyncio.sleep(0.2)
        fake.gate.set()
        return await asyncio.gather(*tasks)

    try:
        out = run(go())
    finally:
        b.close()
    # rows × longest ≤ 100 with 30-token texts: 3 rows per batch (90); 7 requests -> 1 + 3 + 3
    # (the first was taken alone while the worker was held, with nothing queued yet)
    assert sum(n for _, n in fake.batches) == 7
    assert max(n for _, n in fake.batches) == 3
    assert [v[0, 0] for v in out] == list(range(7))


def test_no_batching_runs_each_request_alone() -> None:
    fake = FakeEncoder()
    b = DynamicBatcher(fake, EngineSettings(graph_workers=1, batching=False, max_wait_ms=50))
    b.start()

    async def go():
        return await asyncio.gather(*(b.submit("query", [enc(3, i)]) for i in range(5)))

    try:
        run(go())
    finally:
        b.close()
    assert fake.batches == [("query", 1)] * 5


def test_sides_never_share_a_batch() -> None:
    fake = FakeEncoder()
    b = DynamicBatcher(fake, EngineSettings(graph_workers=1, max_wait_ms=100))
    b.start()

    async def go():
        return await asyncio.gather(
            b.submit("query", [enc(3, 1)]),
            b.submit("document", [enc(3, 2)]),
            b.submit("query", [enc(3, 3)]),
        )

    try:
        q1, d, q2 = run(go())
    finally:
        b.close()
    assert sorted(fake.batches) == [("document", 1), ("query", 2)]
    assert (q1[0, 0], d[0, 0], q2[0, 0]) == (1, 2, 3)


def test_full_queue_refuses_and_close_drains_the_rest() -> None:
    fake = FakeEncoder()
    fake.gate.clear()
    b = DynamicBatcher(fake, EngineSettings(graph_workers=1, max_queue=2, max_wait_ms=0))
    b.start()

    async def go():
        first = asyncio.ensure_future(b.submit("query", [enc(3, 0)]))
        await asyncio.sleep(0.1)  # the worker holds it (held at the gate)
        queued = [asyncio.ensure_future(b.submit("query", [enc(3, i)])) for i in (1, 2)]
        await asyncio.sleep(0.05)
        with pytest.raises(QueueFull):
            await b.submit("query", [enc(3, 9)])
        closer = threading.Thread(target=b.close)
        closer.start()  # close while two requests wait: they must still be answered
        await asyncio.sleep(0.05)
        with pytest.raises(Draining):
            await b.submit("query", [enc(3, 9)])
        fake.gate.set()
        out = await asyncio.gather(first, *queued)
        closer.join(5)
        return out

    out = run(go())
    assert [v[0, 0] for v in out] == [0, 1, 2]
    assert not b.running


def test_an_encoder_error_reaches_every_request_of_the_batch() -> None:
    def broken(encodings, side):
        raise RuntimeError("graph failed")

    b = DynamicBatcher(broken, EngineSettings(graph_workers=1, max_wait_ms=100))
    b.start()

    async def go():
        return await asyncio.gather(
            *(b.submit("query", [enc(3, i)]) for i in range(3)), return_exceptions=True
        )

    try:
        out = run(go())
    finally:
        b.close()
    assert all(isinstance(e, RuntimeError) and str(e) == "graph failed" for e in out)


def _held_batches(fake: FakeEncoder, settings: EngineSettings, requests: list[list]) -> list:
    """Submit ``requests`` while the worker is held on a first request, then release it."""
    fake.gate.clear()
    b = DynamicBatcher(fake, settings)
    b.start()

    async def go():
        first = asyncio.ensure_future(b.submit("query", [enc(4, -1)]))
        await asyncio.sleep(0.1)  # the worker took it and waits at the gate
        tasks = [asyncio.ensure_future(b.submit("query", r)) for r in requests]
        await asyncio.sleep(0.1)
        fake.gate.set()
        return await asyncio.gather(first, *tasks)

    try:
        return run(go())[1:]
    finally:
        b.close()


def test_requests_of_very_different_lengths_are_not_merged() -> None:
    fake = FakeEncoder()
    # queued: 10, 60, 12, 58, 11 tokens. 10+12+11 merge (fill 33/36); 60+58 merge (fill
    # 118/120); merging a 60 with the 10s would pad 5 rows to 60 tokens (fill 151/300 < 0.75)
    lengths = [10, 60, 12, 58, 11]
    out = _held_batches(
        fake,
        EngineSettings(graph_workers=1, max_wait_ms=0),
        [[enc(n, i)] for i, n in enumerate(lengths)],
    )
    # the held lone request, then the oldest (10 tokens) with its two neighbours in length,
    # then the two long ones
    assert fake.batches == [("query", 1), ("query", 3), ("query", 2)]
    assert [v[0, 0] for v in out] == [0, 1, 2, 3, 4]  # each request its own vector
    assert [v[0, 1] for v in out] == [3, 2, 3, 2, 3]  # and the size of the batch it ran in


def test_a_request_joins_only_if_the_batch_pays_less_per_real_token() -> None:
    fake = FakeEncoder()
    # queued 20, 14, 20, 20, 20, 14 tokens (RUN_OVERHEAD_TOKENS = 8). The four 20s: 80 real
    # of 8 + 80 paid (0.909); a 14 would make it 94 of 8 + 5 × 20 (0.870), so both 14s wait
    # and run together: 28 of 8 + 28 (0.778, against 14 of 8 + 14 alone). The fill floor
    # alone (0.75) would have let every request into one batch (108 of 120 padded).
    lengths = [20, 14, 20, 20, 20, 14]
    out = _held_batches(
        fake,
        EngineSettings(graph_workers=1, max_wait_ms=0),
        [[enc(n, i)] for i, n in enumerate(lengths)],
    )
    assert fake.batches == [("query", 1), ("query", 4), ("query", 2)]
    assert [v[0, 0] for v in out] == list(range(6))
    assert [v[0, 1] for v in out] == [4, 2, 4, 4, 4, 2]


def test_the_nearest_lengths_join_first_when_the_row_cap_leaves_room() -> None:
    fake = FakeEncoder()
    # queued 20, 12, 19, 20, 26 with 3 rows a batch: the 20 takes the other 20 and the 19 (the
    # nearest), not the 12 queued before them. The 12 then runs alone: with the 26 it would pay
    # 12 + 26 real of 8 + 52 (0.633 > 0.6 alone) but fill only 38 of 52 padded (< 0.75).
    lengths = [20, 12, 19, 20, 26]
    out = _held_batches(
        fake,
        EngineSettings(graph_workers=1, max_wait_ms=0, max_batch_rows=3),
        [[enc(n, i)] for i, n in enumerate(lengths)],
    )
    assert fake.batches == [("query", 1), ("query", 3), ("query", 1), ("query", 1)]
    assert [v[0, 0] for v in out] == list(range(5))
    assert [v[0, 1] for v in out] == [3, 1, 3, 3, 1]


def test_fill_floor_zero_lets_padding_that_pays_for_itself_in() -> None:
    # a 4-token request alone pays 4 of 8 + 4; with a 10-token one, 14 of 8 + 20: worth it,
    # though 6 of its 20 padded tokens are padding (fill 0.70 < the default floor 0.75)
    runs = {}
    for fill in (0.75, 0.0):
        fake = FakeEncoder()
        _held_batches(
            fake,
            EngineSettings(graph_workers=1, max_wait_ms=0, min_batch_fill=fill),
            [[enc(4, 0)], [enc(10, 1)]],
        )
        runs[fill] = fake.batches
    assert runs[0.75] == [("query", 1), ("query", 1), ("query", 1)]
    assert runs[0.0] == [("query", 1), ("query", 2)]


def test_a_lone_request_does_not_wait_for_max_wait() -> None:
    fake = FakeEncoder()
    b = DynamicBatcher(fake, EngineSettings(graph_workers=1, max_wait_ms=2000))
    b.start()

    async def go():
        started = time.monotonic()
        vec = await b.submit("query", [enc(5, 7)])
        return vec, time.monotonic() - started

    try:
        vec, took = run(go())
    finally:
        b.close()
    assert vec[0, 0] == 7
    assert took < 1.0  # alone in the queue: run at once, not held 2 s


def test_fill_floor_is_validated() -> None:
    from magretrieve.core.errors import ConfigError

    with pytest.raises(ConfigError, match="min_batch_fill must be <= 1, got 1.5"):
        EngineSettings(min_batch_fill=1.5)


def test_graph_workers_run_batches_at_once_and_drain() -> None:
    """With two workers, two batches run at the same time (each waits for the other inside the
    encoder: one worker alone would time out there); close still finishes every request."""
    meet = threading.Barrier(2, timeout=5)
    seen: list[int] = []

    def encode(encodings, side):
        meet.wait()  # raises BrokenBarrierError unless another batch is running now
        seen.append(threading.get_ident())
        return np.array([[e.ids[0]] for e in encodings], dtype=np.float32)

    b = DynamicBatcher(encode, EngineSettings(graph_workers=2, batching=False))
    b.start()

    async def go():
        return await asyncio.gather(*(b.submit("query", [enc(3, i)]) for i in range(4)))

    try:
        out = run(go())
    finally:
        b.close()
    assert [v[0, 0] for v in out] == [0, 1, 2, 3]
    assert len(set(seen)) == 2  # two threads ran the graph
    assert not b.running


def test_graph_workers_is_validated() -> None:
    from magretrieve.core.errors import ConfigError

    with pytest.raises(ConfigError, match="--graph-workers must be >= 1, got 0"):
        EngineSettings(graph_workers=0)


def test_a_lone_batch_runs_on_every_thread_and_nothing_beside_it() -> None:
    """With two workers and ``encode_all_threads``: a request with nothing else queued or running
    goes to ``encode_all_threads``; while it runs no other batch starts; requests that queue up
    behind it then run two at a time through ``encode``."""
    alone_started, release = threading.Event(), threading.Event()
    meet = threading.Barrier(2, timeout=5)
    calls: list[tuple[str, int]] = []
    lock = threading.Lock()
    inside = {"n": 0, "most": 0}

    def track(kind: str, encodings) -> np.ndarray:
        with lock:
            calls.append((kind, int(encodings[0].ids[0])))
            inside["n"] += 1
            inside["most"] = max(inside["most"], inside["n"])
        try:
            if kind == "alone":
                alone_started.set()
                assert release.wait(5)
            else:
                meet.wait()  # two narrow batches meet: both run at once
            return np.array([[e.ids[0]] for e in encodings], dtype=np.float32)
        finally:
            with lock:
                inside["n"] -= 1

    b = DynamicBatcher(
        lambda encodings, side: track("narrow", encodings),
        EngineSettings(graph_workers=2, batching=False),
        encode_all_threads=lambda encodings, side: track("alone", encodings),
    )
    b.start()

    async def go():
        first = asyncio.ensure_future(b.submit("query", [enc(3, 0)]))
        await asyncio.get_running_loop().run_in_executor(None, alone_started.wait, 5)
        rest = [asyncio.ensure_future(b.submit("query", [enc(3, i)])) for i in (1, 2)]
        await asyncio.sleep(0.2)  # the two queued requests must not start beside the lone one
        with lock:
            assert calls == [("alone", 0)] and inside["n"] == 1
        release.set()
        return await asyncio.gather(first, *rest)

    try:
        out = run(go())
    finally:
        b.close()
    assert [v[0, 0] for v in out] == [0, 1, 2]
    assert calls[0] == ("alone", 0)
    assert sorted(calls[1:]) == [("narrow", 1), ("narrow", 2)]
    assert inside["most"] == 2


def test_one_worker_never_uses_encode_all_threads() -> None:
    used: list[str] = []

    def narrow(encodings, side):
        used.append("narrow")
        return np.zeros((len(encodings), 1), dtype=np.float32)

    def alone(encodings, side):
        used.append("alone")
        return np.zeros((len(encodings), 1), dtype=np.float32)

    b = DynamicBatcher(narrow, EngineSettings(graph_workers=1), encode_all_threads=alone)
    b.start()
    try:
        run(b.submit("query", [enc(3, 0)]))
    finally:
        b.close()
    assert used == ["narrow"]


#: Documents 0-3 queued before queries 10 and 11 (document 0 already running): each query runs
#: after one document batch.
QUERIES_BETWEEN_DOCUMENT_BATCHES = [
    ("document", 0),
    ("query", 10),
    ("document", 1),
    ("query", 11),
    ("document", 2),
    ("document", 3),
]


def test_queries_waiting_behind_documents_go_first_once_per_document_batch() -> None:
    """Documents queued before queries: after each document batch the waiting queries run, so
    a search waits for one document batch, not for every one queued before it."""
    fake = FakeEncoder()
    fake.gate.clear()
    b = DynamicBatcher(fake, EngineSettings(graph_workers=1, max_wait_ms=0, max_batch_rows=1))
    b.start()

    async def go():
        first = asyncio.ensure_future(b.submit("document", [enc(3, 0)]))
        await held_at_the_gate(b)
        rest = [asyncio.ensure_future(b.submit("document", [enc(3, v)])) for v in (1, 2, 3)]
        rest += [asyncio.ensure_future(b.submit("query", [enc(3, v)])) for v in (10, 11)]
        await asyncio.sleep(0.05)
        fake.gate.set()
        await asyncio.gather(first, *rest)

    try:
        run(go())
    finally:
        b.close()
    assert fake.order == QUERIES_BETWEEN_DOCUMENT_BATCHES


def test_a_request_over_the_budget_runs_as_its_token_budget_parts() -> None:
    """Seven texts under a 100-token budget: the encoder's own cut (longest first, as many rows
    as the longest allows) as two parts, the request's rows back in its order."""
    fake = FakeEncoder()
    b = DynamicBatcher(fake, EngineSettings(graph_workers=1, max_wait_ms=0, max_batch_tokens=100))
    b.start()
    lengths = [30, 10, 30, 25, 30, 10, 20]
    try:
        out = run(b.submit("document", [enc(n, i) for i, n in enumerate(lengths)]))
    finally:
        b.close()
    # longest first: [0, 2, 4] (3 × 30 = 90), then [3, 6, 1, 5] (4 × 25 = 100)
    assert fake.batches == [("document", 3), ("document", 4)]
    assert out[:, 0].tolist() == list(range(7))
    assert out[:, 1].tolist() == [3, 4, 3, 4, 3, 4, 4]


def test_queries_wait_for_one_part_of_a_long_document_request() -> None:
    """A document request of four budget-sized parts is queued before two queries: each query
    runs after one part, not after the whole request."""
    fake = FakeEncoder()
    fake.gate.clear()
    # one row a batch: the two queries run apart (they would merge otherwise)
    settings = EngineSettings(graph_workers=1, max_wait_ms=0, max_batch_tokens=10, max_batch_rows=1)
    b = DynamicBatcher(fake, settings)
    b.start()

    async def go():
        docs = asyncio.ensure_future(b.submit("document", [enc(10, v) for v in range(4)]))
        await held_at_the_gate(b, jobs_left=3)  # its first part taken
        queries = [asyncio.ensure_future(b.submit("query", [enc(3, v)])) for v in (10, 11)]
        await asyncio.sleep(0.05)
        assert b.depth == 3  # the document request (three parts left) and two queries
        fake.gate.set()
        await asyncio.gather(docs, *queries)

    try:
        run(go())
    finally:
        b.close()
    assert fake.order == QUERIES_BETWEEN_DOCUMENT_BATCHES


def test_a_failing_part_fails_its_request_once_and_spares_the_others() -> None:
    calls: list[float] = []

    def encode(encodings, side):
        calls.append(encodings[0].ids[0])
        if any(e.ids[0] == 2 for e in encodings):
            raise RuntimeError("graph failed on part 2")
        return np.array([[e.ids[0], 0] for e in encodings], dtype=np.float32)

    b = DynamicBatcher(encode, EngineSettings(graph_workers=2, max_wait_ms=0, max_batch_tokens=5))
    b.start()

    async def go():
        return await asyncio.gather(
            b.submit("document", [enc(5, v) for v in range(4)]),
            b.submit("document", [enc(5, 7)]),
            return_exceptions=True,
        )

    try:
        failed, fine = run(go())
    finally:
        b.close()
    assert isinstance(failed, RuntimeError) and str(failed) == "graph failed on part 2"
    assert fine[:, 0].tolist() == [7]
    assert sorted(calls) == [0, 1, 2, 3, 7]  # every part ran; the error was handed over once
    assert b.depth == 0


def test_the_queue_bound_counts_a_split_request_once() -> None:
    fake = FakeEncoder()
    fake.gate.clear()
    b = DynamicBatcher(
        fake,
        EngineSettings(
            graph_workers=1, max_queue=2, max_wait_ms=0, max_batch_tokens=4, max_batch_rows=1
        ),
    )
    b.start()

    async def go():
        first = asyncio.ensure_future(b.submit("query", [enc(3, 0)]))
        await held_at_the_gate(b)
        split = asyncio.ensure_future(b.submit("document", [enc(4, v) for v in range(5)]))
        other = asyncio.ensure_future(b.submit("query", [enc(3, 9)]))
        await asyncio.sleep(0.05)
        assert b.depth == 2 and b._waiting == 6  # five parts and a query: two requests
        with pytest.raises(QueueFull):
            await b.submit("query", [enc(3, 8)])
        fake.gate.set()
        return await asyncio.gather(first, split, other)

    try:
        _, docs, _ = run(go())
    finally:
        b.close()
    assert docs[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert b.depth == 0 and b._waiting == 0
