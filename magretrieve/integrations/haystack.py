r"""Haystack components that embed with an export (or a ``magretrieve serve``) and search by the
model's inner product.

    from haystack import Pipeline
    from magretrieve.integrations.haystack import MagRetrieveRetriever

    p = Pipeline()
    p.add_component("retriever", MagRetrieveRetriever(export_dir="exported/qnorm",
                                                      store="faiss:idx", top_k=5))
    docs = p.run({"retriever": {"query": "statins reduce mortality"}})["retriever"]["documents"]
    docs[0].score, docs[0].meta["doc_norm"], docs[0].meta["cosine"], docs[0].meta["query_norm"]

- :class:`MagRetrieveTextEmbedder`: a query's vector from the query graph
  (``{"embedding": [...]}``), for a Haystack embedding retriever;
- :class:`MagRetrieveDocumentEmbedder`: documents' vectors from the document graph, with
  each vector's norm under ``meta["doc_norm"]`` (the magnitude the model kept);
- :class:`MagRetrieveRetriever`: a magretrieve :class:`~magretrieve.serving.retriever.Retriever`
  (export + store spec) as a component; each ``Document`` carries ``score`` and, in ``meta``,
  the payload's fields plus ``id``, ``score``, ``doc_norm``, ``cosine``, ``query_norm``,
  ``rank`` and ``payload``.

The embedders encode in this process (``export_dir``) or call a running server (``url``, with
``api_key`` a Haystack ``Secret``, by default ``$MAGRETRIEVE_API_KEY``). Every component is
described by plain values and ``Secret``\ s, so ``to_dict``/``from_dict`` and Pipeline YAML
round-trip and never hold a credential: a store spec or store option given as a plain string
is written with its credentials masked (a pipeline loaded from it refuses to start and says how
to pass them), one given as ``Secret.from_env_var(...)`` is written as the variable's name. A
pickled embedder holds no key either: a ``Secret.from_token`` becomes
``$MAGRETRIEVE_API_KEY``, read where it is unpickled.
The ONNX sessions, the server's ``/info`` and the store open in ``warm_up`` (which a Pipeline
calls) or on the first run. A Haystack document store keeps the magnitude only if it ranks by
dot product (docs/integrations.md). Haystack 2.x and 3.x; 3.x loads a pipeline of these
components only with ``allowed_modules=["magretrieve.integrations.haystack"]``.
Needs ``pip install 'magretrieve[haystack]'``.
"""

from __future__ import annotations

import copy
import logging
import threading
from dataclasses import replace
from typing import Any, TypeVar

from magretrieve.core.extras import require

require("haystack")

from haystack import Document, component, default_from_dict, default_to_dict  # noqa: E402
from haystack.utils import Secret, deserialize_secrets_inplace  # noqa: E402
from haystack.utils.auth import SecretType  # noqa: E402

from magretrieve.core.env import API_KEY_ENV  # noqa: E402
from magretrieve.core.errors import ConfigError  # noqa: E402
from magretrieve.core.redact import MASK, is_secret_name, redact, redact_value  # noqa: E402
from magretrieve.integrations import _common as common  # noqa: E402
from magretrieve.integrations._encoder import (  # noqa: E402
    DEFAULT_TIMEOUT,
    LazyEncoder,
    check_source,
    check_threads,
    check_timeout,
)
from magretrieve.serving.remote import check_text  # noqa: E402

logger = logging.getLogger(__name__)

__all__ = ["MagRetrieveDocumentEmbedder", "MagRetrieveRetriever", "MagRetrieveTextEmbedder"]


def _check_export_dir(value: Any) -> str:
    if value is None:
        raise ConfigError("export_dir must be an export folder path, got None")
    export_dir, _ = check_source(value, None)
    return str(export_dir)


def _check_secret(value: Any, name: str) -> Secret:
    if not isinstance(value, Secret):
        raise ConfigError(
            f"{name} must be a haystack Secret, e.g. Secret.from_env_var({API_KEY_ENV!r}), "
            f"got {type(value).__name__} (a plain string would be written into the pipeline YAML)"
        )
    return value


_E = TypeVar("_E", bound="_Embedder")


class _Embedder:
    """What both embedders share: the source (export or server), its key, to_dict fields."""

    _side: str  # the graph the embedder runs: "query" or "document"

    def _init_source(
        self,
        export_dir: str | None,
        threads: int | None,
        runtime: str | None,
        url: str | None,
        api_key: Secret,
        timeout: float,
    ) -> None:
        self.export_dir, self.url = check_source(export_dir, url)
        self.threads = check_threads(threads)
        self.runtime = runtime
        self.api_key = _check_secret(api_key, "api_key")
        self.timeout = check_timeout(timeout)
        self._open_source()

    def _open_source(self) -> None:
        """The lazily opened encoder (the ``Secret`` resolved when it opens)."""
        self._encoder = LazyEncoder(
            self.export_dir,
            self.url,
            api_key=self.api_key.resolve_value,
            threads=self.threads,
            runtime=self.runtime,
            timeout=self.timeout,
        )

    def __getstate__(self) -> dict[str, Any]:
        """The embedder without its opened encoder, and without a key held as a value: a
        ``Secret.from_token`` is pickled as ``Secret.from_env_var("MAGRETRIEVE_API_KEY")``,
        read in the process that unpickles it (an env-var ``Secret`` is kept: its name)."""
        state = {k: v for k, v in self.__dict__.items() if k != "_encoder"}
        if self.api_key.type is not SecretType.ENV_VAR:
            state["api_key"] = Secret.from_env_var(API_KEY_ENV, strict=False)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open_source()

    def __deepcopy__(self: _E, memo: dict[int, Any]) -> _E:
        """A copy in this process keeps the key (``Secret`` and all), its encoder unopened."""
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        clone.__dict__.update(
            {k: copy.deepcopy(v, memo) for k, v in self.__dict__.items() if k != "_encoder"}
        )
        clone._open_source()
        return clone

    def warm_up(self) -> None:
        """Open the export's graph of this embedder's side, or read the server's ``/info`` (a
        Pipeline calls this before running)."""
        self._encoder.warm_up(self._side)

    @classmethod
    def from_dict(cls: type[_E], data: dict[str, Any]) -> _E:
        data = copy.deepcopy(data)
        deserialize_secrets_inplace(data.get("init_parameters", {}), keys=["api_key"])
        return default_from_dict(cls, data)

    def _source_dict(self) -> dict[str, Any]:
        return {
            "export_dir": self.export_dir,
            "threads": self.threads,
            "runtime": self.runtime,
            "url": self.url,
            "api_key": self.api_key.to_dict(),
            "timeout": self.timeout,
        }


@component
class MagRetrieveTextEmbedder(_Embedder):
    """Embeds one query with the query graph: ``{"embedding": list[float]}``.

    The vector is ``q / ‖q‖^γq`` exactly as :class:`~magretrieve.serving.retriever.Retriever`
    searches with it (the manifest's query prefix and max length applied), computed from
    ``export_dir`` in this process or by the server at ``url``.
    """

    _side = "query"

    def __init__(
        self,
        export_dir: str | None = None,
        threads: int | None = None,
        runtime: str | None = None,
        url: str | None = None,
        api_key: Secret = Secret.from_env_var(API_KEY_ENV, strict=False),  # noqa: B008
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self._init_source(export_dir, threads, runtime, url, api_key, timeout)

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, **self._source_dict())

    @component.output_types(embedding=list[float])
    def run(self, text: str) -> dict[str, Any]:
        if not isinstance(text, str):
            raise ConfigError(
                f"MagRetrieveTextEmbedder takes one string; got {type(text).__name__} "
                "(use MagRetrieveDocumentEmbedder for documents)"
            )
        check_text(text, 0)
        vector = self._encoder.encode([text], "query")[0]
        return {"embedding": [float(x) for x in vector]}


@component
class MagRetrieveDocumentEmbedder(_Embedder):
    """Embeds Haystack documents with the document graph.

    The embedded text is ``meta[title_field] + " " + content`` when the document has that
    field (as :class:`~magretrieve.serving.retriever.Retriever` joins title and text), else the
    content. Each returned document is a copy with ``embedding`` set and ``meta["doc_norm"]``
    = the vector's norm, so the magnitude stays visible after a cosine store drops it.
    ``batch_size`` is the most texts per call to the export's engine (local; concurrent calls
    may share a graph run) or per request (remote; the server's ``max_inputs`` caps it).
    """

    _side = "document"

    def __init__(
        self,
        export_dir: str | None = None,
        title_field: str | None = "title",
        batch_size: int = 32,
        threads: int | None = None,
        runtime: str | None = None,
        url: str | None = None,
        api_key: Secret = Secret.from_env_var(API_KEY_ENV, strict=False),  # noqa: B008
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self._init_source(export_dir, threads, runtime, url, api_key, timeout)
        self.title_field = title_field
        self.batch_size = common.check_top_k(batch_size, "batch_size")

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(
            self, title_field=self.title_field, batch_size=self.batch_size, **self._source_dict()
        )

    def _text(self, doc: Document, position: int) -> str:
        if not isinstance(doc, Document):
            raise ConfigError(
                f"MagRetrieveDocumentEmbedder takes a list of haystack Documents; "
                f"item #{position} is a {type(doc).__name__}"
            )
        content = doc.content or ""
        title = doc.meta.get(self.title_field) if self.title_field else None
        text = f"{title} {content}".strip() if isinstance(title, str) and title else content
        try:
            check_text(text, position)
        except ConfigError as exc:
            raise ConfigError(f"document {doc.id!r}: no text to embed ({exc})") from None
        return text

    @component.output_types(documents=list[Document])
    def run(self, documents: list[Document]) -> dict[str, Any]:
        if isinstance(documents, (str, Document)):
            raise ConfigError("MagRetrieveDocumentEmbedder takes a list of Documents")
        import numpy as np

        texts = [self._text(d, n) for n, d in enumerate(documents)]
        if not texts:
            return {"documents": []}
        vectors = self._encoder.encode(texts, "document", batch_size=self.batch_size)
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


def _masked_refusal(where: str) -> ConfigError:
    return ConfigError(
        f"{where} holds a masked credential ({MASK}): pipeline YAML never holds secrets. Pass "
        "the spec as store=Secret.from_env_var('VAR') (the variable holding the whole spec), "
        "give a secret store option Secret.from_env_var('VAR') as its value, or (pgvector) "
        "leave the password out of the spec and set $PGPASSWORD"
    )


def _check_store(store: Any) -> str | Secret:
    if isinstance(store, Secret):
        return store
    if not isinstance(store, str) or ":" not in store:
        raise ConfigError(
            f"store must be a store spec such as 'faiss:PATH' (or a haystack Secret holding "
            f"one), got {redact(store) if isinstance(store, str) else store!r}"
        )
    if MASK in store:
        raise _masked_refusal("the store spec")
    return store


def _check_store_options(options: Any) -> dict[str, Any]:
    if options is not None and not isinstance(options, dict):
        raise ConfigError(f"store_options must be a dict, got {type(options).__name__}")
    out = dict(options or {})
    for name, value in out.items():
        if value == MASK:
            raise _masked_refusal(f"store option {name!r}")
    return out


def _serialize_store(store: str | Secret) -> Any:
    if isinstance(store, Secret):
        return store.to_dict()
    masked = redact(store)
    if masked != store:
        logger.warning(
            "the store spec holds a credential: it is written masked, and a pipeline loaded "
            "from this YAML will refuse to start; pass store=Secret.from_env_var('VAR') instead"
        )
    return masked


def _serialize_options(options: dict[str, Any]) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    for name, value in options.items():
        if isinstance(value, Secret):
            out[name] = value.to_dict()
        elif is_secret_name(name) and value is not None:
            logger.warning(
                "store option %r is a credential: it is written masked; pass it as "
                "Secret.from_env_var('VAR') instead",
                name,
            )
            out[name] = MASK
        else:
            out[name] = redact_value(value)
    return out or None


def _is_serialized_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") in ("env_var", "token")


@component
class MagRetrieveRetriever:
    """Top-``top_k`` documents of a magretrieve store by the model's inner product.

    ``export_dir`` and ``store`` (a spec such as ``faiss:PATH`` or ``qdrant:URL/COLLECTION``)
    are what :meth:`Retriever.load <magretrieve.serving.retriever.Retriever.load>` takes;
    ``store_options`` go to the store (e.g. ``{"ef_search": 128}``). The store must exist:
    this component searches, it never creates one. A spec or option holding a credential is
    best given as a ``Secret`` (``store=Secret.from_env_var("MAGRETRIEVE_STORE")``,
    ``store_options={"api_key": Secret.from_env_var("QDRANT_API_KEY")}``), resolved when the
    store opens; ``to_dict`` writes plain-string credentials masked.
    """

    def __init__(
        self,
        export_dir: str,
        store: str | Secret,
        top_k: int = 10,
        threads: int | None = None,
        runtime: str | None = None,
        store_options: dict[str, Any] | None = None,
        where: dict[str, Any] | None = None,
    ) -> None:
        self.export_dir = _check_export_dir(export_dir)
        self.store = _check_store(store)
        self.top_k = common.check_top_k(top_k, "top_k")
        self.where = common.check_where_option(where)
        self.threads = check_threads(threads)
        self.runtime = runtime
        self.store_options = _check_store_options(store_options)
        self._retriever: Any = None
        self._lock = threading.Lock()

    def warm_up(self) -> None:
        """Open the export and the store (a Pipeline calls this before running)."""
        self._open()

    def _open(self) -> Any:
        with self._lock:
            if self._retriever is None:
                from magretrieve.serving.engine import shared_engine
                from magretrieve.serving.retriever import Retriever

                self._retriever = Retriever.load(
                    self.export_dir,
                    store=self._resolve(self.store, "store"),
                    create=False,
                    # the embedders over the same export share its engine (graphs, batches)
                    encoder=shared_engine(
                        self.export_dir, threads=self.threads, runtime=self.runtime
                    ),
                    **{k: self._resolve(v, k) for k, v in self.store_options.items()},
                )
            return self._retriever

    @staticmethod
    def _resolve(value: Any, name: str) -> Any:
        if not isinstance(value, Secret):
            return value
        resolved = value.resolve_value()
        if resolved is None:
            raise ConfigError(f"{name}: the Secret resolves to nothing (its variable is unset)")
        return resolved

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
            store=_serialize_store(self.store),
            top_k=self.top_k,
            threads=self.threads,
            runtime=self.runtime,
            store_options=_serialize_options(self.store_options),
            where=self.where,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MagRetrieveRetriever:
        data = copy.deepcopy(data)
        params = data.get("init_parameters", {})
        if _is_serialized_secret(params.get("store")):
            params["store"] = Secret.from_dict(params["store"])
        options = params.get("store_options")
        if isinstance(options, dict):
            params["store_options"] = {
                k: Secret.from_dict(v) if _is_serialized_secret(v) else v
                for k, v in options.items()
            }
        return default_from_dict(cls, data)

    @component.output_types(documents=list[Document])
    def run(
        self, query: str, top_k: int | None = None, where: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Top-k documents for ``query``; ``where`` (``{field: value}``, the server's
        ``/search`` filter) keeps those whose payload holds every field with an equal value
        (default: the component's own ``where``)."""
        if not isinstance(query, str):
            raise ConfigError(f"query must be a string, got {type(query).__name__}")
        k = self.top_k if top_k is None else common.check_top_k(top_k, "top_k")
        hits = common.search_hits(self._open(), query, k, where, default=self.where)
        docs = [
            Document(
                id=h.id,
                content=common.hit_text(h),
                meta=common.hit_metadata(h),
                score=float(h.score),
            )
            for h in hits
        ]
        return {"documents": docs}
