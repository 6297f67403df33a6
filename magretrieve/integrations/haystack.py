"""Haystack 2.x components that embed with an export and search by the model's inner product.

    from haystack import Pipeline
    from magretrieve.integrations.haystack import MagRetrieveRetriever

    p = Pipeline()
    p.add_component("retriever", MagRetrieveRetriever(export_dir="exported/qnorm",
                                                      store="faiss:idx", top_k=5))
    docs = p.run({"retriever": {"query": "statins reduce mortality"}})["retriever"]["documents"]
    docs[0].score, docs[0].meta["doc_norm"], docs[0].meta["cosine"], docs[0].meta["query_norm"]

- :class:`MagRetrieveTextEmbedder`: a query's vector from the export's query graph
  (``{"embedding": [...]}``), for a Haystack embedding retriever;
- :class:`MagRetrieveDocumentEmbedder`: documents' vectors from the document graph, with
  each vector's norm under ``meta["doc_norm"]`` (the magnitude the model kept);
- :class:`MagRetrieveRetriever`: a magretrieve :class:`~magretrieve.serving.retriever.Retriever`
  (export + store spec) as a component; each ``Document`` carries ``score`` and, in ``meta``,
  the payload's fields plus ``id``, ``score``, ``doc_norm``, ``cosine``, ``query_norm``,
  ``rank`` and ``payload``.

Each component is described by plain values (an export folder, a store spec), so
``to_dict``/``from_dict`` and Pipeline YAML round-trip; the ONNX sessions and the store open
in ``warm_up`` (which a Pipeline calls) or on the first run. A Haystack document store keeps
the magnitude only if it ranks by dot product (``InMemoryDocumentStore`` does by default;
``QdrantDocumentStore`` defaults to cosine, which discards it): see docs/stores.md.
Needs ``pip install 'magretrieve[haystack]'``.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from magretrieve.stores.base import require

require("haystack", "haystack-ai", "haystack")

from haystack import Document, component, default_from_dict, default_to_dict  # noqa: E402

from magretrieve.core.errors import ConfigError  # noqa: E402
from magretrieve.integrations._common import check_top_k, hit_metadata, hit_text  # noqa: E402

__all__ = ["MagRetrieveDocumentEmbedder", "MagRetrieveRetriever", "MagRetrieveTextEmbedder"]


def _check_export_dir(value: Any) -> str:
    if not isinstance(value, (str, Path)) or not str(value):
        raise ConfigError(f"export_dir must be an export folder path, got {value!r}")
    return str(value)


def _check_threads(value: Any) -> int | None:
    return None if value is None else check_top_k(value, "threads")


class _LazyEncoder:
    """The export's :class:`~magretrieve.serving.runtime.OnnxEncoder`, opened once on first use."""

    def __init__(self, export_dir: str, threads: int | None, runtime: str | None) -> None:
        self.export_dir, self.threads, self.runtime = export_dir, threads, runtime
        self._encoder: Any = None
        self._lock = threading.Lock()

    def get(self, side: str) -> Any:
        with self._lock:
            if self._encoder is None:
                from magretrieve.serving.runtime import OnnxEncoder

                self._encoder = OnnxEncoder.load(
                    self.export_dir, threads=self.threads, runtime=self.runtime
                )
            self._encoder.session(side)  # checks the graph against the manifest once
            return self._encoder


@component
class MagRetrieveTextEmbedder:
    """Embeds one query with the export's query graph: ``{"embedding": list[float]}``.

    The vector is ``q / ‖q‖^γq`` exactly as :class:`~magretrieve.serving.retriever.Retriever`
    searches with it (the manifest's query prefix and max length applied).
    """

    def __init__(
        self, export_dir: str, threads: int | None = None, runtime: str | None = None
    ) -> None:
        self.export_dir = _check_export_dir(export_dir)
        self.threads = _check_threads(threads)
        self.runtime = runtime
        self._encoder = _LazyEncoder(self.export_dir, self.threads, runtime)

    def warm_up(self) -> None:
        """Open the export and its query graph (a Pipeline calls this before running)."""
        self._encoder.get("query")

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(
            self, export_dir=self.export_dir, threads=self.threads, runtime=self.runtime
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MagRetrieveTextEmbedder:
        return default_from_dict(cls, data)

    @component.output_types(embedding=list[float])
    def run(self, text: str) -> dict[str, Any]:
        if not isinstance(text, str):
            raise ConfigError(
                f"MagRetrieveTextEmbedder takes one string; got {type(text).__name__} "
                "(use MagRetrieveDocumentEmbedder for documents)"
            )
        vector = self._encoder.get("query").encode_queries([text])[0]
        return {"embedding": [float(x) for x in vector]}


@component
class MagRetrieveDocumentEmbedder:
    """Embeds Haystack documents with the export's document graph.

    The embedded text is ``meta[title_field] + " " + content`` when the document has that
    field (as :class:`~magretrieve.serving.retriever.Retriever` joins title and text), else the
    content. Each returned document is a copy with ``embedding`` set and ``meta["doc_norm"]``
    = the vector's norm, so the magnitude stays visible after a cosine store drops it.
    """

    def __init__(
        self,
        export_dir: str,
        title_field: str | None = "title",
        batch_size: int = 32,
        threads: int | None = None,
        runtime: str | None = None,
    ) -> None:
        self.export_dir = _check_export_dir(export_dir)
        self.title_field = title_field
        self.batch_size = check_top_k(batch_size, "batch_size")
        self.threads = _check_threads(threads)
        self.runtime = runtime
        self._encoder = _LazyEncoder(self.export_dir, self.threads, runtime)

    def warm_up(self) -> None:
        """Open the export and its document graph (a Pipeline calls this before running)."""
        self._encoder.get("document")

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(
            self,
            export_dir=self.export_dir,
            title_field=self.title_field,
            batch_size=self.batch_size,
            threads=self.threads,
            runtime=self.runtime,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MagRetrieveDocumentEmbedder:
        return default_from_dict(cls, data)

    def _text(self, doc: Document, position: int) -> str:
        if not isinstance(doc, Document):
            raise ConfigError(
                f"MagRetrieveDocumentEmbedder takes a list of haystack Documents; "
                f"item #{position} is a {type(doc).__name__}"
            )
        content = doc.content or ""
        title = doc.meta.get(self.title_field) if self.title_field else None
        text = f"{title} {content}".strip() if isinstance(title, str) and title else content
        if not text.strip():
            raise ConfigError(f"document {doc.id!r}: no text to embed (empty content and title)")
        return text

    @component.output_types(documents=list[Document])
    def run(self, documents: list[Document]) -> dict[str, Any]:
        if isinstance(documents, (str, Document)):
            raise ConfigError("MagRetrieveDocumentEmbedder takes a list of Documents")
        import numpy as np

        texts = [self._text(d, n) for n, d in enumerate(documents)]
        if not texts:
            return {"documents": []}
        vectors = self._encoder.get("document").encode_documents(texts, batch_size=self.batch_size)
        norms = np.linalg.norm(vectors, axis=1)
        out = [
            replace(
                doc,
                embedding=[float(x) for x in vec],
                meta={**doc.meta, "doc_norm": float(norm)},
            )
            for doc, vec, norm in zip(documents, vectors, norms, strict=True)
        ]
        return {"documents": out}


@component
class MagRetrieveRetriever:
    """Top-``top_k`` documents of a magretrieve store by the model's inner product.

    ``export_dir`` and ``store`` (a spec such as ``faiss:PATH`` or ``qdrant:URL/COLLECTION``)
    are what :meth:`Retriever.load <magretrieve.serving.retriever.Retriever.load>` takes;
    ``store_options`` go to the store (e.g. ``{"ef_search": 128}``). The store must exist:
    this component searches, it never creates one.
    """

    def __init__(
        self,
        export_dir: str,
        store: str,
        top_k: int = 10,
        threads: int | None = None,
        runtime: str | None = None,
        store_options: dict[str, Any] | None = None,
    ) -> None:
        self.export_dir = _check_export_dir(export_dir)
        if not isinstance(store, str) or ":" not in store:
            raise ConfigError(f"store must be a store spec such as 'faiss:PATH', got {store!r}")
        self.store = store
        self.top_k = check_top_k(top_k, "top_k")
        self.threads = _check_threads(threads)
        self.runtime = runtime
        if store_options is not None and not isinstance(store_options, dict):
            raise ConfigError(f"store_options must be a dict, got {type(store_options).__name__}")
        self.store_options = dict(store_options or {})
        self._retriever: Any = None
        self._lock = threading.Lock()

    def warm_up(self) -> None:
        """Open the export and the store (a Pipeline calls this before running)."""
        self._open()

    def _open(self) -> Any:
        with self._lock:
            if self._retriever is None:
                from magretrieve.serving.retriever import Retriever

                self._retriever = Retriever.load(
                    self.export_dir,
                    store=self.store,
                    threads=self.threads,
                    runtime=self.runtime,
                    create=False,
                    **self.store_options,
                )
            return self._retriever

    def close(self) -> None:
        """Close the store (the component reopens it on its next run)."""
        with self._lock:
            if self._retriever is not None:
                self._retriever.close()
                self._retriever = None

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(
            self,
            export_dir=self.export_dir,
            store=self.store,
            top_k=self.top_k,
            threads=self.threads,
            runtime=self.runtime,
            store_options=self.store_options or None,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MagRetrieveRetriever:
        return default_from_dict(cls, data)

    @component.output_types(documents=list[Document])
    def run(self, query: str, top_k: int | None = None) -> dict[str, Any]:
        if not isinstance(query, str):
            raise ConfigError(f"query must be a string, got {type(query).__name__}")
        k = self.top_k if top_k is None else check_top_k(top_k, "top_k")
        hits = self._open().search(query, k=k)
        docs = [
            Document(id=h.id, content=hit_text(h), meta=hit_metadata(h), score=float(h.score))
            for h in hits
        ]
        return {"documents": docs}
