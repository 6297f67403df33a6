"""What one server holds: the embedding engine, the optional store, the metrics.

The request handlers share one :class:`ServerState`. Texts become vectors only through its
:attr:`ServerState.engine` (:class:`~magretrieve.serving.engine.EmbeddingEngine`: input limits,
tokenizing, truncation per item, the dynamic batcher), so ``/v1/embeddings``, ``/embed``,
``/search`` and ``/documents`` apply the same rules as an in-process caller of the engine.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from magretrieve.server.errors import scrub
from magretrieve.server.metrics import Metrics
from magretrieve.server.recall_watch import RecallWatch
from magretrieve.server.settings import ServerSettings
from magretrieve.server.store_holder import StoreHolder
from magretrieve.serving.engine import EmbeddingEngine
from magretrieve.serving.retriever import Hit, Retriever
from magretrieve.serving.search_batcher import SearchBatcher, search_workers


class ServerState:
    """Shared by every handler of one app."""

    def __init__(
        self,
        engine: EmbeddingEngine,
        settings: ServerSettings,
        retriever: Retriever | None = None,
        store_spec: str | None = None,
        reopen: Callable[[], Retriever] | None = None,
    ) -> None:
        self.engine = engine
        self.encoder = engine.encoder
        self.manifest = engine.manifest
        self.settings = settings
        #: Every store call goes through it (reload on a newer generation, shutdown gate).
        self.holder = StoreHolder(retriever, reopen) if retriever is not None else None
        #: Counts what the engine reports (it is the engine's observer).
        self.metrics = engine.observer if isinstance(engine.observer, Metrics) else Metrics()
        engine.set_observer(self.metrics)
        self.ready = False
        #: Concurrent /search requests merged into one store call (None: no store).
        self.searcher: SearchBatcher | None = None
        if self.holder is not None:
            self.searcher = SearchBatcher(
                self._search,
                workers=search_workers(retriever.store),  # type: ignore[union-attr]
                observer=self.metrics.on_search_batch,
            )
        self.recall_watch: RecallWatch | None = None
        if retriever is not None and settings.recall_sample > 0:
            self.recall_watch = RecallWatch(
                retriever,
                self.metrics,
                settings.recall_sample,
                cpu_share=settings.recall_cpu_share,
                current=lambda: self.retriever,
            )
        folder = str(self.manifest.folder or "")
        known = [(folder, "the export")]
        if retriever is not None:
            known.insert(0, (str(retriever.store.location), "the store"))
        if store_spec:
            known.insert(0, (store_spec, "the store"))
        self._known_paths = known
        #: The answering Retriever (weakly) and the prior its store records (:meth:`info`).
        self._prior: tuple[weakref.ref[Any], dict[str, Any] | None] | None = None

    def _search(
        self, vectors: np.ndarray, k: int, where: Mapping[str, Any] | None
    ) -> list[list[Hit]]:
        """One store call of the search batcher, through the holder (reload, shutdown)."""
        assert self.holder is not None
        with self.holder.use() as retriever:
            return retriever.search_vectors(vectors, k=k, where=where)

    @property
    def retriever(self) -> Any | None:
        """The Retriever answering now (replaced when the store is reloaded)."""
        return self.holder.retriever if self.holder is not None else None

    @property
    def model_id(self) -> str:
        """The served model id (``ID:query`` / ``ID:document`` name a side): the settings'
        ``model_id``, else the export folder's name (never a server path)."""
        from magretrieve.server.sides import default_model_id

        folder = self.manifest.folder
        return self.settings.model_id or default_model_id(folder.name if folder else None)

    def info(self) -> dict[str, Any]:
        """The manifest's serving facts and this server's limits (``GET /info``)."""
        m, s = self.manifest, self.settings
        store = None
        if self.retriever is not None:
            vs = self.retriever.store
            store = {
                "kind": vs.kind,
                "count": int(vs.count()),
                "generation": vs.generation,
                "prior": self._store_prior(),
            }
        return {
            "model_id": self.model_id,
            "model_fingerprint": m.model_fingerprint,
            "mode": m.mode,
            "gamma_q": m.gamma_q,
            "gamma_d": m.gamma_d,
            "dimension": m.dimension,
            "pooling": m.pooling,
            "max_query_length": m.max_query_length,
            "max_document_length": m.max_document_length,
            "query_prefix": m.query_prefix,
            "document_prefix": m.document_prefix,
            "query_contract": m.query_contract,
            "document_contract": m.document_contract,
            "index_metric": m.index_metric,
            "quantization": m.quantization,
            "runtime": getattr(self.encoder, "runtime", None),
            "threads": getattr(self.encoder, "threads", None),
            # text-embeddings-inference's names for two of the limits
            "max_input_length": m.max_document_length,
            "max_client_batch_size": s.max_inputs,
            "limits": {
                "max_inputs": s.max_inputs,
                "max_text_chars": s.max_text_chars,
                "max_body_bytes": s.max_body_bytes,
                "max_k": s.max_k,
                "max_queue": s.max_queue,
            },
            "batching": {
                "enabled": s.batching,
                "max_batch_tokens": s.max_batch_tokens,
                "max_batch_rows": s.max_batch_rows,
                "max_wait_ms": s.max_wait_ms,
                "min_batch_fill": s.min_batch_fill,
            },
            "store": store,
            "writes_enabled": s.writes_enabled and self.retriever is not None,
            "recall_watch": self.recall_watch.info() if self.recall_watch is not None else None,
        }

    def _store_prior(self) -> dict[str, Any] | None:
        """The document prior the answering store carries (None: none), read from its
        metadata once per opened store (a database's metadata is a round trip)."""
        from magretrieve.priors.rescale import recorded_prior

        retriever = self.retriever
        if retriever is None:
            return None
        known = self._prior
        if known is None or known[0]() is not retriever:
            # a weak reference: a store replaced on reload is not kept alive for /info
            known = (weakref.ref(retriever), recorded_prior(retriever.store.read_metadata()))
            self._prior = known
        return known[1]

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        for side in ("query", "document"):  # open and probe both graphs before answering
            self.engine.session(side)
        self.engine.start()
        if self.searcher is not None:
            self.searcher.start()
        self.ready = True

    def stop(self) -> None:
        """Finish queued encodes, then write and close the store."""
        self.ready = False
        self.engine.close()
        if self.searcher is not None:
            self.searcher.close()
        if self.recall_watch is not None:
            self.recall_watch.close()
        if self.holder is not None:  # waits for store calls still running on worker threads
            self.holder.close(persist=self.settings.writes_enabled)

    def scrub_paths(self, message: str) -> str:
        """``message`` fit to send: store locations and server paths replaced by names."""
        return scrub(message, self._known_paths)
