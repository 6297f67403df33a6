"""What one server holds: the export's encoder, the optional store, the batcher, the metrics.

The request handlers share one :class:`ServerState`; its :meth:`ServerState.embed` is the single
path from texts to vectors (input limits, tokenizing, truncation per item, the batcher), so
``/v1/embeddings``, ``/embed``, ``/search`` and ``/documents`` apply the same rules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.concurrency import run_in_threadpool

from magretrieve.core.errors import MagRetrieveError
from magretrieve.core.text import blank
from magretrieve.server.batcher import Draining, DynamicBatcher, EncodeFn, QueueFull
from magretrieve.server.errors import ApiError, scrub
from magretrieve.server.metrics import Metrics
from magretrieve.server.recall_watch import RecallWatch
from magretrieve.server.settings import ServerSettings
from magretrieve.server.store_holder import StoreHolder

#: Requests whose texts add up to more characters than this are tokenized on a worker
#: thread instead of the event loop (a batch-1 query tokenizes in microseconds).
INLINE_TOKENIZE_CHARS = 4096


@dataclass
class Encoded:
    """One request's vectors with, per item, whether it was cut and how many tokens it had."""

    vectors: np.ndarray
    truncated: list[bool]
    tokens: list[int]


class ServerState:
    """Shared by every handler of one app."""

    def __init__(
        self,
        encoder: Any,
        settings: ServerSettings,
        retriever: Any | None = None,
        store_spec: str | None = None,
        alone_encoder: Any | None = None,
        reopen: Callable[[], Any] | None = None,
    ) -> None:
        self.encoder = encoder
        #: The same graphs on every thread, for a batch that runs alone (``graph_workers`` > 1).
        self.alone_encoder = alone_encoder
        self.manifest = encoder.manifest
        self.settings = settings
        #: Every store call goes through it (reload on a newer generation, shutdown gate).
        self.holder = (
            StoreHolder(retriever, reopen, retry_after_s=settings.retry_after_s)
            if retriever is not None
            else None
        )
        self.metrics = Metrics()
        self.batcher = DynamicBatcher(
            self._batch_encoder(encoder),
            settings,
            self.metrics,
            encode_alone=self._batch_encoder(alone_encoder) if alone_encoder is not None else None,
        )
        self.ready = False
        self.recall_watch: RecallWatch | None = None
        if retriever is not None and settings.recall_sample > 0:
            self.recall_watch = RecallWatch(
                retriever,
                self.metrics,
                settings.recall_sample,
                current=lambda: self.retriever,
            )
        folder = str(self.manifest.folder or "")
        known = [(folder, "the export")]
        if retriever is not None:
            known.insert(0, (str(retriever.store.location), "the store"))
        if store_spec:
            known.insert(0, (store_spec, "the store"))
        self._known_paths = known

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
            store = {"kind": vs.kind, "count": int(vs.count()), "generation": vs.generation}
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

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        for side in ("query", "document"):  # open and probe both graphs before answering
            self.encoder.session(side)
            if self.alone_encoder is not None:
                self.alone_encoder.session(side)
        self.batcher.start()
        self.ready = True

    def stop(self) -> None:
        """Finish queued encodes, then write and close the store."""
        self.ready = False
        self.batcher.close()
        if self.recall_watch is not None:
            self.recall_watch.close()
        if self.holder is not None:  # waits for store calls still running on worker threads
            self.holder.close(persist=self.settings.writes_enabled)

    def public(self, message: str) -> str:
        """``message`` fit to send: store locations and server paths replaced."""
        return scrub(message, self._known_paths)

    # ------------------------------------------------------------------ encoding

    def _batch_encoder(self, encoder: Any) -> EncodeFn:
        """The graph run of one merged batch on ``encoder``, within the batch limits."""
        s = self.settings

        def encode(encodings: Sequence[Any], side: str) -> np.ndarray:
            return encoder.encode_tokenized(  # type: ignore[no-any-return]
                encodings, side, batch_size=s.max_batch_rows, max_batch_tokens=s.max_batch_tokens
            )

        return encode

    def check_texts(self, texts: Sequence[str], what: str = "input") -> None:
        """Refuse an empty request, too many texts, an empty or too long text (413/422)."""
        s = self.settings
        if not texts:
            raise ApiError(422, f"{what} is empty: send at least one text")
        if len(texts) > s.max_inputs:
            raise ApiError(
                413,
                f"{what} holds {len(texts)} texts; this server takes at most {s.max_inputs} per request",
            )
        for n, text in enumerate(texts):
            if blank(text):
                raise ApiError(
                    422, f"{what} #{n} is empty or only whitespace and invisible characters"
                )
            if len(text) > s.max_text_chars:
                raise ApiError(
                    413,
                    f"{what} #{n} has {len(text)} characters; this server takes at most "
                    f"{s.max_text_chars} per text",
                )

    def _tokenize(self, texts: Sequence[str], side: str) -> list[Any]:
        try:
            return self.encoder.tokenize(list(texts), side)
        except MagRetrieveError as exc:
            raise ApiError(422, self.public(str(exc))) from None

    async def embed(
        self, texts: Sequence[str], side: str, *, truncate: bool = True, what: str = "input"
    ) -> Encoded:
        """Vectors of ``texts`` on ``side`` through the batcher; limits checked first."""
        self.check_texts(texts, what)
        if sum(len(t) for t in texts) > INLINE_TOKENIZE_CHARS:
            encodings = await run_in_threadpool(self._tokenize, texts, side)
        else:
            encodings = self._tokenize(texts, side)
        cut = [bool(e.overflowing) for e in encodings]
        if any(cut) and not truncate:
            first = cut.index(True)
            m = self.manifest
            limit = m.max_query_length if side == "query" else m.max_document_length
            raise ApiError(
                413,
                f"{what} #{first} is longer than max_{side}_length={limit} tokens; send "
                '"truncate": true to cut it (the cut is reported per item)',
            )
        tokens = [len(e.ids) for e in encodings]
        try:
            vectors = await self.batcher.submit(side, encodings)
        except QueueFull:
            raise ApiError(
                503,
                f"the encoder queue is full ({self.settings.max_queue} requests waiting); retry later",
                {"Retry-After": str(self.settings.retry_after_s)},
            ) from None
        except Draining:
            raise ApiError(
                503,
                "the server is shutting down",
                {"Retry-After": str(self.settings.retry_after_s)},
            ) from None
        self.metrics.tokens.labels(side).inc(sum(tokens))
        if any(cut):
            self.metrics.truncated.labels(side).inc(sum(cut))
        return Encoded(vectors, cut, tokens)
