"""Retriever: an exported encoder plus a vector store, checked against each other.

``Retriever.load(export_dir, store="faiss:indexes/scifact")`` opens the ONNX encoder
(:class:`magretrieve.serving.onnx_encoder.OnnxEncoder`, no torch) and the store, and refuses a store that
would not give the model's scores: another dimension, a metric other than inner product, a
store that normalizes vectors while the model keeps document magnitude, or a store built by
another model (its recorded ``model_fingerprint``/mode/γ differ) unless ``force=True``.

Hits carry the score split as ``score = ‖q_stored‖ · ‖d_stored‖ · cos θ + offset`` (the norms
reported by the store) so a user sees what magnitude contributed. The
offset is non-zero only in a store given a document prior with an additive term
(:mod:`magretrieve.priors`): such a store holds one extra coordinate ``b(d)`` and is searched
with ``[q ; 1]``; the multiplier is ``doc_norm``.

Thread safety: ``search``/``search_batch`` may be called from many threads. Writes
(``add_documents``, ``delete``) change the store's memory under an exclusive lock, so adding
while searching is safe through one Retriever (searches wait while a batch is applied, never
while it is saved); stores whose search is not thread-safe (embedded qdrant-client) are
searched one call at a time. Writers take turns on a mutex of their own, which
:meth:`Retriever.persist` also holds, so a save sees no half-applied batch; a store whose save
changes nothing searches read (``persists_beside_search``) is saved while searches go on, any
other under the exclusive lock. Concurrent ``persist`` calls share saves (group commit, see
:meth:`Retriever.persist`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from magretrieve.core.errors import StoreError
from magretrieve.core.locks import RWLock
from magretrieve.core.similarity import EPS, INDEX_METRIC
from magretrieve.core.text import blank, lone_surrogate
from magretrieve.data.readers import Document, check_text
from magretrieve.serving.errors import InvalidInput
from magretrieve.stores import VectorStore, open_store
from magretrieve.stores.base import check_finite, check_queries
from magretrieve.stores.registry import backend_for

logger = logging.getLogger(__name__)


class EncoderLike(Protocol):
    """What the Retriever needs from an encoder (``OnnxEncoder`` is the real one)."""

    manifest: Any

    def encode_queries(self, texts: Sequence[str], batch_size: int = ...) -> np.ndarray: ...

    def encode_documents(self, texts: Sequence[str], batch_size: int = ...) -> np.ndarray: ...


#: Hits returned by every search method unless ``k`` is given (one default for all).
DEFAULT_K = 10
#: Candidates fetched per query when a payload filter is given, as a multiple of k (all of
#: them for stores up to FILTER_EXACT_UP_TO points, so the filtered top-k is exact there).
FILTER_FETCH = 20
FILTER_EXACT_UP_TO = 20_000
#: What a payload filter compares: JSON scalars.
FILTER_TYPES = (str, int, float, bool, type(None))


def check_where(where: Any) -> dict[str, Any] | None:
    """A payload filter ``{field: value, ...}`` checked (None or ``{}``: no filter).

    A hit is kept when every field is in its payload with an equal JSON value (see
    :func:`payload_matches`); values are JSON scalars (string, number, boolean, null).
    """
    if where is None:
        return None
    if not isinstance(where, Mapping):
        raise InvalidInput(
            f"where must be an object of payload field: value, got {type(where).__name__}"
        )
    for key, value in where.items():
        if not isinstance(key, str):
            raise InvalidInput(f"where: field names are strings, got {key!r}")
        if not isinstance(value, FILTER_TYPES):
            raise InvalidInput(
                f"where: field {key!r} holds a {type(value).__name__}; a filter compares "
                "strings, numbers, booleans and null"
            )
    return dict(where) or None


def payload_matches(payload: Mapping[str, Any], where: Mapping[str, Any]) -> bool:
    """Every field of ``where`` is present in ``payload`` with an equal JSON value: ``true``
    is not ``1``, and ``null`` matches a field that holds null, not a missing one."""
    return all(key in payload and _same(payload[key], value) for key, value in where.items())


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


@dataclass
class Hit:
    """One search result with its score decomposition.

    ``score = query_norm · doc_norm · cosine + offset``: ``doc_norm`` is the stored vector's
    norm (``‖d‖^(1−γd)``), so in qnorm/dot modes it is the magnitude the model kept, and in a
    prior-rescaled cosine store it is the prior's multiplier ``m(d)``; ``offset`` is the
    prior's additive term ``b(d)`` (0 without one).
    """

    id: str
    score: float
    doc_norm: float
    cosine: float
    query_norm: float
    payload: dict[str, Any] = field(default_factory=dict)
    rank: int = 0
    offset: float = 0.0

    @property
    def multiplier(self) -> float:
        """The document's multiplier (its stored norm): ``m(d)`` under a document prior."""
        return self.doc_norm

    @property
    def title(self) -> str:
        return str(self.payload.get("title", ""))

    @property
    def text(self) -> str:
        return str(self.payload.get("text", ""))

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "id": self.id,
            "score": self.score,
            "doc_norm": self.doc_norm,
            "cosine": self.cosine,
            "query_norm": self.query_norm,
            "multiplier": self.multiplier,
            "offset": self.offset,
            "payload": self.payload,
        }


def manifest_metadata(manifest: Any) -> dict[str, Any]:
    """What a store records about the model that built it."""
    return {
        "model_fingerprint": manifest.model_fingerprint,
        "mode": manifest.mode,
        "gamma_q": float(manifest.gamma_q),
        "gamma_d": float(manifest.gamma_d),
        "dimension": int(manifest.dimension),
        "metric": INDEX_METRIC,
        "document_contract": manifest.document_contract,
    }


def check_compatible(manifest: Any, store: VectorStore, *, force: bool = False) -> None:
    """Refuse a store that cannot reproduce the model's scores (see module docstring)."""
    where = store.location
    meta = store.read_metadata()
    extra = 1 if offset_coordinate(meta) else 0
    if int(store.dimension) != int(manifest.dimension) + extra:
        raise StoreError(
            f"{where}: store dimension {store.dimension} does not match the model's "
            f"dimension {manifest.dimension}"
            + (" plus the prior's offset coordinate" if extra else "")
            + f" ({getattr(manifest, 'folder', '')})"
        )
    if getattr(manifest, "index_metric", INDEX_METRIC) != INDEX_METRIC:
        raise StoreError(
            f"manifest index_metric is {manifest.index_metric!r}; only inner_product is supported"
        )
    if store.metric != INDEX_METRIC:
        raise StoreError(f"{where}: store metric {store.metric} is not inner product")
    if store.normalizes_vectors and manifest.document_contract != "unit_norm":
        raise StoreError(
            f"{where}: the store normalizes vectors, but mode {manifest.mode} keeps document "
            "magnitude (document contract magnitude_keeping); use an index without L2norm"
        )
    if not meta:
        return
    if meta.get("incomplete"):
        job = meta["incomplete"]
        if job.get("operation") == "annotate":  # the user's own collection: never "delete it"
            raise StoreError(
                f"{where}: incomplete: a `magretrieve annotate` of it is running or was "
                "interrupted; wait for it, or run the same command again to finish it"
            )
        raise StoreError(
            f"{where}: incomplete: a `magretrieve {job.get('operation', 'rescale')}` from "
            f"{job.get('source')} into it was interrupted; run the same command again to "
            "finish it (or delete the store)"
        )
    ours = manifest_metadata(manifest)
    differs = [
        key
        for key in ("model_fingerprint", "mode", "gamma_q", "gamma_d", "dimension")
        if key in meta and meta[key] != ours[key]
    ]
    if differs:
        message = (
            f"{where} was built by another model: store has model_fingerprint "
            f"{str(meta.get('model_fingerprint'))[:16]}… mode {meta.get('mode')} "
            f"(γq={meta.get('gamma_q')}, γd={meta.get('gamma_d')}), the export "
            f"{getattr(manifest, 'folder', '') or ''} has {ours['model_fingerprint'][:16]}… "
            f"mode {ours['mode']} (γq={ours['gamma_q']}, γd={ours['gamma_d']}); differing: "
            f"{', '.join(differs)}. Re-index into a new store, or pass force=True / --force"
        )
        if not force:
            raise StoreError(message)
        logger.warning("forced: %s", message)


def offset_coordinate(meta: Mapping[str, Any] | None) -> bool:
    """Does the store hold a document prior's offset in one extra coordinate?"""
    if not meta or not meta.get("magnitude"):
        return False
    from magretrieve.priors.rescale import has_offset_coordinate

    return has_offset_coordinate(meta)


#: Keys of a document dict that are the document itself, not payload.
DOCUMENT_FIELDS = ("_id", "id", "text", "title")


def _as_document(doc: Document | Mapping[str, Any], position: int) -> Document:
    if isinstance(doc, Document):
        return doc
    if not isinstance(doc, Mapping):
        raise StoreError(
            f"document #{position}: expected a dict or Document, got {type(doc).__name__}"
        )
    doc_id = doc.get("_id", doc.get("id"))
    if isinstance(doc_id, int) and not isinstance(doc_id, bool):
        doc_id = str(doc_id)
    if not isinstance(doc_id, str) or not doc_id:
        raise StoreError(f"document #{position}: missing a string '_id'")
    text = doc.get("text", "")
    title = doc.get("title") or ""
    if not isinstance(text, str) or not isinstance(title, str):
        raise StoreError(f"document {doc_id!r}: 'text' and 'title' must be strings")
    if blank(text) and blank(title):
        raise StoreError(f"document {doc_id!r}: empty title and text")
    nested = doc.get("payload")
    if nested is not None and not isinstance(nested, Mapping):
        raise StoreError(
            f"document {doc_id!r}: 'payload' must be an object of fields, "
            f"got {type(nested).__name__}"
        )
    shadowed = sorted(set(nested or {}) & set(DOCUMENT_FIELDS))
    if shadowed:
        raise StoreError(
            f"document {doc_id!r}: 'payload' holds {shadowed}, the document's own fields; "
            "give them at the top level"
        )
    extra = dict(nested or {})
    extra.update({k: v for k, v in doc.items() if k not in (*DOCUMENT_FIELDS, "payload")})
    return Document(doc_id, text, title, extra)


def load_encoder(
    export_dir: str | Path,
    threads: int | None = None,
    device: str = "cpu",
    runtime: str | None = None,
) -> EncoderLike:
    """The ONNX encoder of an export folder (one seam, so tests can substitute a fake)."""
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    return OnnxEncoder.load(export_dir, threads=threads, device=device, runtime=runtime)


def check_documents(docs: Sequence[Document]) -> None:
    """Refuse a lone surrogate in an id, title or text (tokenizers and Qdrant's id hashing
    fail on one), naming the document."""
    for d in docs:
        for what, value in (("id", d.id), ("title", d.title), ("text", d.text)):
            if isinstance(value, str) and lone_surrogate(value) is not None:
                check_text(value, f"document {d.id!r}: {what}")


class Retriever:
    """Encode with an exported model, search a store by inner product, explain each score."""

    def __init__(
        self,
        encoder: EncoderLike,
        store: VectorStore,
        *,
        force: bool = False,
        store_text: bool = True,
    ) -> None:
        self.encoder = encoder
        self.manifest = encoder.manifest
        self.store = store
        self.store_text = store_text
        check_compatible(self.manifest, store, force=force)
        self._force = force
        #: Searched with ``[q ; 1]``: the store holds a prior's offset coordinate.
        self.offset = offset_coordinate(store.read_metadata())
        self._lock = RWLock()  # searches share it; applying a write to memory takes it alone
        self._serial = threading.Lock()  # for stores whose search is not thread-safe
        self._writing = threading.Lock()  # writers take turns; a persist holds it too
        self._commit = threading.Condition()  # guards the counters of the group commit below
        self._changes = 0  # writes applied through this Retriever
        self._saved = 0  # of them, how many a finished persist began after
        self._saving = False  # a persist runs
        self._entered = 0  # writers that asked for a turn ...
        self._left = 0  # ... and of them, those whose turn is over
        #: Saves run by :meth:`persist` (group commit: fewer than the writes they made durable).
        self.persists = 0
        warm = getattr(encoder, "session", None)
        if callable(warm):
            warm("query")  # create the query session before threads race to do it

    @classmethod
    def load(
        cls,
        export_dir: str | Path,
        store: str | Any,
        *,
        force: bool = False,
        threads: int | None = None,
        device: str = "cpu",
        runtime: str | None = None,
        create: bool = True,
        for_writing: bool = False,
        encoder: EncoderLike | None = None,
        **store_options: Any,
    ) -> Retriever:
        """Open an export folder and a store (created with the model's dimension if absent).

        The query graph (and with ``for_writing`` the document graph) is checked against the
        manifest before the store is touched, so a broken export never creates a store.
        ``threads``, ``device`` and ``runtime`` go to :class:`~magretrieve.serving.onnx_encoder.OnnxEncoder`
        (``runtime=None``: the export's own, onnxruntime unless its manifest names another).
        ``tuning_queries`` (a file of query texts, one per line, or a BEIR ``queries.jsonl``)
        are what an ANN store tunes ``target_recall`` on (:meth:`use_tuning_queries`).
        ``encoder`` is the export's encoder already opened (the process's shared
        :class:`~magretrieve.serving.engine.EmbeddingEngine`), used instead of opening
        ``export_dir`` again.
        """
        if encoder is None:
            encoder = load_encoder(export_dir, threads=threads, device=device, runtime=runtime)
        # check the graphs against the manifest before a store is opened (or created)
        warm = getattr(encoder, "session", None)
        if callable(warm):
            warm("query")
            if for_writing:
                warm("document")
        tuning = store_options.pop("tuning_queries", None)
        if force and isinstance(store, str) and "force" in backend_for(store)[0].option_names:
            store_options.setdefault("force", True)  # a store that asks, e.g. a poor ANN index
        try:  # an existing store opens with its own dimension (d + 1 with a prior's offset)
            vs = open_store(store, dimension=None, **store_options)
        except StoreError:
            if not create:
                raise
            vs = open_store(store, dimension=encoder.manifest.dimension, **store_options)
        try:
            retriever = cls(encoder, vs, force=force)
            if for_writing:
                retriever.check_not_foreign()
            if tuning is not None:
                retriever.use_tuning_queries(tuning)
            return retriever
        except BaseException:
            vs.close()
            raise

    def use_tuning_queries(self, queries: Any) -> None:
        """Tune the store's ANN search on these queries (a file of query texts or a BEIR
        ``queries.jsonl``, a list of texts, or vectors), encoded with the query graph; see
        :mod:`magretrieve.serving.tuning_queries`."""
        from magretrieve.serving.tuning_queries import user_queries
        from magretrieve.stores import use_tuning_queries

        use_tuning_queries(self.store, user_queries(self, queries))

    # ------------------------------------------------------------------ writing

    def check_not_foreign(self) -> None:
        """Refuse to write into points magretrieve did not write (unless ``force``)."""
        foreign = 0 if self._force else self.store.foreign_points()
        if foreign:
            raise StoreError(
                f"{self.store.location} already holds {foreign} point(s) that magretrieve did "
                "not write (no model metadata); writing would mix them with this model's "
                "documents and stamp the collection. Use a new collection, or pass "
                "force=True / --force"
            )

    def _record_model(self) -> None:
        if not self.store.read_metadata():
            self.check_not_foreign()
            self.store.write_metadata(manifest_metadata(self.manifest))

    def add_documents(
        self,
        docs: Iterable[Document | Mapping[str, Any]],
        *,
        batch_size: int = 32,
        skip_existing: bool = False,
    ) -> int:
        """Encode and upsert documents (dicts with ``_id``, ``title``, ``text`` + payload fields,
        or :class:`~magretrieve.data.readers.Document`). Returns how many were written.

        Title and text go into the payload (``store_text``) so hits can be shown. NaN/inf
        vectors are refused before anything of their batch reaches the store.
        """
        written = 0
        batch: list[Document] = []
        for n, doc in enumerate(docs):
            batch.append(_as_document(doc, n))
            if len(batch) >= batch_size:
                written += self.add_batch(batch, skip_existing=skip_existing)
                batch = []
        if batch:
            written += self.add_batch(batch, skip_existing=skip_existing)
        return written

    def add_batch(self, docs: Sequence[Document], *, skip_existing: bool = False) -> int:
        """Encode one batch and write it (the unit of work of resumable indexing)."""
        docs = list(docs)
        ids = [d.id for d in docs]
        check_documents(docs)
        if len(set(ids)) != len(ids):
            seen: set[str] = set()
            dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
            raise StoreError(f"duplicate document id {dup!r} in one batch")
        if skip_existing:
            have = self.store.existing(ids)
            docs = [d for d in docs if d.id not in have]
            ids = [d.id for d in docs]
        if not docs:
            return 0
        return self.write_batch(docs, self.encode_batch(docs))

    def tokenize_batch(self, docs: Sequence[Document]) -> Any | None:
        """The encoder's tokens for ``docs`` (None when the encoder tokenizes inside encoding).

        With :meth:`encode_batch` ``(docs, tokens)`` this lets an indexing pipeline tokenize
        one batch while the previous one is encoded.
        """
        tokenize = getattr(self.encoder, "tokenize", None)
        if not callable(tokenize) or not callable(getattr(self.encoder, "encode_tokenized", None)):
            return None
        return tokenize([d.full_text for d in docs], "document")

    def encode_batch(self, docs: Sequence[Document], tokens: Any | None = None) -> np.ndarray:
        """Document vectors of ``docs`` (from :meth:`tokenize_batch` tokens when given);
        NaN/inf vectors are refused, naming the document."""
        if tokens is not None:
            raw = self.encoder.encode_tokenized(tokens, "document")  # type: ignore[attr-defined]
        else:
            raw = self.encoder.encode_documents([d.full_text for d in docs])
        vectors = np.asarray(raw, dtype=np.float32)
        check_finite(vectors, [d.id for d in docs], f"encoding for {self.store.location}")
        return vectors

    def write_batch(self, docs: Sequence[Document], vectors: np.ndarray) -> int:
        """Write encoded documents (with the store's recorded magnitude treatment, if any)."""
        ids = [d.id for d in docs]
        payloads = []
        for d in docs:
            payload = dict(d.payload)
            if self.store_text:  # the text that was encoded, whatever the payload says
                payload["title"] = d.title
                payload["text"] = d.text
            payloads.append(payload)
        meta = self.store.read_metadata()
        if meta and meta.get("magnitude"):
            # a store rescaled after the fact (`magretrieve rescale`) records how its documents got their
            # magnitude; new documents must get the same treatment to be comparable (a field
            # prior reads each new document's own fields)
            from magretrieve.priors.rescale import apply_recorded_magnitude

            fields = [{**d.payload, "title": d.title, "text": d.text} for d in docs]
            vectors = apply_recorded_magnitude(meta, vectors, self.store, fields, ids)
            check_finite(vectors, ids, f"recorded magnitude of {self.store.location}")
        with self._changing():
            self._record_model()
            return self.store.add(ids, vectors, payloads)

    def existing(self, ids: Sequence[str]) -> set[str]:
        """Ids the store already holds (under the read lock: safe beside a writing thread)."""
        with self._lock.read():
            if self.store.thread_safe_search:
                return set(self.store.existing(list(ids)))
            with self._serial:
                return set(self.store.existing(list(ids)))

    def delete(self, ids: Sequence[str]) -> int:
        with self._changing():
            return self.store.delete(list(ids))

    @contextmanager
    def _changing(self) -> Iterator[None]:
        """One writer's turn: apply a change to the store while searches wait (short)."""
        with self._commit:
            self._entered += 1
        try:
            with self._writing, self._lock.write():
                try:
                    yield
                finally:  # counted even when it failed half-way: the store may be changed
                    with self._commit:
                        self._changes += 1
        finally:
            with self._commit:
                self._left += 1
                self._commit.notify_all()

    def persist(self) -> None:
        """Make every write made through this Retriever before the call durable (and any
        unsaved write made on the store directly).

        Group commit: a call returns once a save that *began after* its writes were applied
        has finished. Calls that arrive while a save runs wait for it, then one of them saves
        for all (after letting the writers already waiting for their turn apply their
        batches), so eight concurrent writers cost about two saves, not eight. The save holds
        the writers' mutex, not the search lock, when the store declares
        ``persists_beside_search``; otherwise searches wait for it too. When the save fails
        it raises in the call that ran it; each caller it would have covered then saves
        itself (and gets that error, if it repeats).
        """
        with self._commit:
            want = self._changes
            ours = want > self._saved  # writes of this Retriever wait for a save
            waited_for = self._entered  # writers already waiting: let them apply first
            while True:
                if ours and self._saved >= want:
                    return  # a save that began after our writes covered them
                if self._saving or (ours and self._left < waited_for):
                    self._commit.wait()
                    continue
                self._saving = True
                break
        covered = None
        try:
            with self._writing:
                began = self._changes  # no write runs now: the save holds them all
                if self.store.persists_beside_search:
                    self.store.persist()
                else:
                    with self._lock.write():
                        self.store.persist()
                covered = began
        finally:
            with self._commit:
                self._saving = False
                if covered is not None:
                    self._saved = max(self._saved, covered)
                    self.persists += 1
                self._commit.notify_all()

    # ------------------------------------------------------------------ searching

    def search(
        self, text: str, k: int = DEFAULT_K, *, where: Mapping[str, Any] | None = None
    ) -> list[Hit]:
        """Top-``k`` hits for one query text (``where``: a payload filter, see
        :meth:`search_vectors`)."""
        return self.search_batch([text], k=k, where=where)[0]

    def search_batch(
        self, texts: Sequence[str], k: int = DEFAULT_K, *, where: Mapping[str, Any] | None = None
    ) -> list[list[Hit]]:
        """Top-``k`` hits for each query text (one encoder call, one store call)."""
        if isinstance(texts, str):
            raise StoreError("search_batch takes a list of texts; use search() for one text")
        texts = list(texts)
        if not texts:
            return []
        for n, t in enumerate(texts):
            if not isinstance(t, str) or blank(t):
                raise StoreError(
                    f"query #{n} is empty or only whitespace and invisible characters, or not "
                    f"a string: {t!r}"
                )
        wanted = check_where(where)  # before the encoder runs
        qvecs = np.asarray(self.encoder.encode_queries(texts), dtype=np.float32)
        return self.search_vectors(qvecs, k=k, where=wanted)

    def search_vectors(
        self,
        query_vectors: np.ndarray,
        k: int = DEFAULT_K,
        *,
        where: Mapping[str, Any] | None = None,
    ) -> list[list[Hit]]:
        """Search with already-encoded query vectors (``q / ‖q‖^γq``).

        ``where`` (``{field: value}``) keeps only hits whose payload holds every field with an
        equal JSON value (:func:`payload_matches`). The store is asked for more candidates
        than ``k`` and the matches among them are kept in score order: all of its points up
        to :data:`FILTER_EXACT_UP_TO` (the filtered top-k is then exact), else
        :data:`FILTER_FETCH` × k. The same filter answers ``magretrieve search --where`` and
        the server's ``/search``.
        """
        wanted = check_where(where)
        q = check_queries(query_vectors, int(self.manifest.dimension), "search")
        if self.offset:
            q = np.hstack([q, np.ones((len(q), 1), dtype=q.dtype)])
        # stores report each hit's doc_norm, so no vector is fetched to explain a score; a
        # store with a prior's offset coordinate returns vectors to split m(d) from b(d)
        with_vectors = bool(self.offset)
        with self._lock.read():
            fetch = k if wanted is None else self._filter_fetch(k)
            if self.store.thread_safe_search:
                results = self.store.search(q, fetch, with_vectors=with_vectors)
            else:
                with self._serial:
                    results = self.store.search(q, fetch, with_vectors=with_vectors)
        if wanted is not None:
            results = [
                [h for h in hits if payload_matches(h.payload, wanted)][:k] for hits in results
            ]
        out: list[list[Hit]] = []
        for qv, hits in zip(q, results, strict=True):
            if not hits:
                out.append([])
                continue
            if self.offset:
                stored = self._vectors(hits)
                offsets = stored[:, -1].astype(np.float64)
                qv = qv[:-1]
                norms = np.linalg.norm(stored[:, :-1], axis=1)
            else:
                offsets = np.zeros(len(hits))
                norms = self._doc_norms(hits)
            qn = float(np.linalg.norm(qv))
            out.append(
                [
                    Hit(
                        id=h.id,
                        score=float(h.score),
                        doc_norm=float(norms[i]),
                        cosine=float((h.score - offsets[i]) / max(qn * float(norms[i]), EPS)),
                        query_norm=qn,
                        payload=h.payload,
                        rank=i + 1,
                        offset=float(offsets[i]),
                    )
                    for i, h in enumerate(hits)
                ]
            )
        return out

    def _filter_fetch(self, k: int) -> int:
        """Candidates to ask the store for when a filter will drop some (see
        :meth:`search_vectors`); never more than it holds, at least ``k``."""
        count = int(self.store.count())
        fetch = count if count <= FILTER_EXACT_UP_TO else k * FILTER_FETCH
        return max(1, min(max(fetch, k), max(count, 1)))

    def _vectors(self, hits: Sequence[Any]) -> np.ndarray:
        """The stored vectors of the hits (fetched when the store did not return them)."""
        vecs = [h.vector for h in hits]
        if any(v is None for v in vecs):
            vecs = list(self.store.get_vectors([h.id for h in hits]))
        return np.stack([np.asarray(v, dtype=np.float32) for v in vecs])

    def _doc_norms(self, hits: Sequence[Any]) -> np.ndarray:
        """Each hit's stored norm; vectors are fetched only for stores that do not report it."""
        norms = np.array(
            [np.nan if h.doc_norm is None else h.doc_norm for h in hits], dtype=np.float64
        )
        missing = [i for i, h in enumerate(hits) if h.doc_norm is None]
        if missing:
            vecs = [hits[i].vector for i in missing]
            if any(v is None for v in vecs):
                vecs = list(self.store.get_vectors([hits[i].id for i in missing]))
            norms[missing] = np.linalg.norm(np.stack(vecs), axis=1)
        return norms

    # ------------------------------------------------------------------ misc

    def describe(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "model": {
                "folder": str(getattr(m, "folder", "")),
                "mode": m.mode,
                "gamma_q": m.gamma_q,
                "gamma_d": m.gamma_d,
                "dimension": m.dimension,
                "model_fingerprint": m.model_fingerprint,
            },
            "store": self.store.describe(),
        }

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Retriever:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        """Like the store's: a normal exit saves unsaved writes, an exception keeps the last
        saved state."""
        try:
            if exc_type is None and self.store.has_unsaved_writes():
                self.persist()
        finally:
            self.close()
