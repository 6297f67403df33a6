"""Prometheus metrics of one server, in a registry of its own (several apps per process in tests).

Requests and their latency per route template (never the raw URL, whose cardinality a client
controls), the batches the dynamic batcher runs (texts and requests per batch), the searches
merged into one store call, the queue depth, and tokens and truncations per side.

A gauge reads NaN until it has been measured, never a 0 that looks like a measurement:
``magretrieve_queue_depth`` is measured from the start (no request is waiting before the
first arrives), ``magretrieve_recall_at_10`` only once a sampled ``/search`` query has been
checked (:mod:`magretrieve.server.recall_watch`).
"""

from __future__ import annotations

import math

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Metrics:
    """The server's counters, gauges and histograms."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "magretrieve_requests",
            "HTTP requests answered",
            ["route", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "magretrieve_request_seconds",
            "Time from request to response",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_texts = Histogram(
            "magretrieve_batch_texts",
            "Texts per merged batch",
            ["side"],
            buckets=_SIZE_BUCKETS,
            registry=r,
        )
        self.batch_requests = Histogram(
            "magretrieve_batch_requests",
            "Requests merged into one batch",
            ["side"],
            buckets=_SIZE_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "magretrieve_queue_depth", "Requests waiting for the encoder", registry=r
        )
        self.tokens = Counter("magretrieve_tokens", "Tokens encoded", ["side"], registry=r)
        self.truncated = Counter(
            "magretrieve_truncated_texts",
            "Texts cut at the side's max length",
            ["side"],
            registry=r,
        )
        self.rejected = Counter(
            "magretrieve_rejected", "Requests refused because the queue was full", registry=r
        )
        self.search_requests = Histogram(
            "magretrieve_search_batch_requests",
            "/search requests merged into one store call",
            buckets=_SIZE_BUCKETS,
            registry=r,
        )
        # see magretrieve.server.recall_watch
        self.recall_at_10 = Gauge(
            "magretrieve_recall_at_10",
            "recall@10 of sampled live /search queries against exact inner product",
            registry=r,
        )
        # not measured until a sampled query has been checked (no store, no query yet, or the
        # check turned off): NaN, which no comparison holds for, so an alert on
        # ``recall < target`` does not fire on a replica that has measured nothing
        self.recall_at_10.set(math.nan)
        self.recall_checked = Counter(
            "magretrieve_recall_checked_queries",
            "Live /search queries re-run exactly for the recall gauge",
            registry=r,
        )

    # ------------------------------------------------------------------ the engine's reports
    # (magretrieve.serving.engine.EngineObserver)

    def on_batch(self, side: str, texts: int, requests: int) -> None:
        self.batch_texts.labels(side).observe(texts)
        self.batch_requests.labels(side).observe(requests)

    def on_queue_depth(self, waiting: int) -> None:
        self.queue_depth.set(waiting)

    def on_rejected(self) -> None:
        self.rejected.inc()

    def on_encoded(self, side: str, tokens: int, truncated: int) -> None:
        self.tokens.labels(side).inc(tokens)
        if truncated:
            self.truncated.labels(side).inc(truncated)

    def on_search_batch(self, queries: int, requests: int) -> None:
        """A store call answered ``requests`` searches (``queries`` query rows) at once."""
        self.search_requests.observe(requests)

    def render(self) -> bytes:
        return generate_latest(self.registry)
