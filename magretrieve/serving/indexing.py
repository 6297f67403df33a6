"""Bulk indexing that survives interruption: resumable, checkpointed, with a progress bar.

Reading + tokenizing, encoding and writing run as a pipeline of three threads joined by
bounded queues, so the encoder (the whole cost) never waits for the store or the parser.

Re-running the same command skips ids the store already holds, so a crash (or Ctrl-C, or
SIGKILL) costs at most the work since the last checkpoint. Checkpoints call the store's
``persist()`` (FAISS: an atomic new generation; Qdrant: already durable per write; Edge:
flush of its write-ahead log). Duplicate ids inside the corpus are refused, naming the line.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from magretrieve.core.errors import ConfigError, DataError
from magretrieve.data.readers import (
    Document,
    is_empty,
    iter_corpus,
    iter_documents_to_index,
    read_error,
)
from magretrieve.serving.tuning_queries import PseudoQuerySampler, pseudo_queries

if TYPE_CHECKING:  # pragma: no cover
    from magretrieve.serving.retriever import Retriever


#: Documents read, length-sorted, encoded and written together by default: enough texts
#: for token-budget batches with little padding (magretrieve.core.batching).
DEFAULT_INDEX_BATCH = 256


@dataclass
class IndexReport:
    """What one indexing run did."""

    seen: int
    added: int
    skipped: int
    seconds: float
    count: int
    #: Documents cut at the model's max document length (their tail is not in the index);
    #: counted when the encoder reports ``last_truncated`` (both magretrieve encoders do).
    truncated: int = 0
    #: Documents with empty title and text left out (``skip_empty`` / ``--skip-empty``).
    empty_skipped: int = 0
    #: Ids of the first skipped empty documents (for the report line).
    empty_ids: list[str] | None = None

    @property
    def docs_per_second(self) -> float:
        return self.added / self.seconds if self.seconds > 0 else 0.0


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as fh:
            return sum(1 for line in fh if line.strip())
    except OSError as exc:
        raise read_error(path, exc) from None


def check_corpus_file(path: str | Path, *, skip_empty: bool = False) -> int:
    """Validate a whole corpus file before anything is written; returns its document count.

    One parsing pass (cheap next to encoding) refuses a missing, unreadable or empty file, a
    malformed line, a duplicate id and (without ``skip_empty``) an empty document, each with
    its line, *before* a store is opened: a bad corpus never creates or half-fills a store.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    documents = sum(1 for _ in iter_documents_to_index(path, skip_empty=skip_empty))
    if not documents:
        raise DataError(
            f"{path}: no document to index"
            + (" (every document is empty)" if _count_lines(path) else " (empty file)")
            + "; no store was created or changed"
        )
    return documents


class _Stop(Exception):
    """Raised inside a pipeline stage when the consumer has stopped (error or Ctrl-C)."""


def _put(q: queue.Queue[object], item: object, stop: threading.Event) -> None:
    """Put into a bounded queue, giving up when the pipeline is stopping."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return
        except queue.Full:
            continue
    raise _Stop


def _get(q: queue.Queue[object], stop: threading.Event) -> object:
    while not stop.is_set():
        try:
            return q.get(timeout=0.1)
        except queue.Empty:
            continue
    raise _Stop


_END = object()


def index_documents(
    retriever: Retriever,
    docs: Iterable[tuple[int, Document]] | Iterable[Document],
    *,
    batch_size: int = DEFAULT_INDEX_BATCH,
    checkpoint_every: int = 4096,
    total: int | None = None,
    progress: bool = True,
    source: str = "corpus",
    skip_empty: bool = False,
    queue_size: int = 2,
) -> IndexReport:
    """Add ``docs`` (``Document`` or ``(line, Document)``) in batches, skipping stored ids.

    Three stages overlap, joined by bounded queues of ``queue_size`` batches (so memory stays
    bounded however fast the reader is): a reader thread parses, refuses duplicate ids,
    skips ids already stored and tokenizes; an encoder thread runs the graph; this thread
    writes in corpus order, shows progress and, every ``checkpoint_every`` written documents,
    persists the store. At the end the store is optimized (FAISS IVF training, Edge HNSW
    build) and persisted again. An error in any stage stops the others and is raised here
    after what was already written has been persisted, so a re-run resumes.

    With ``skip_empty`` documents with empty title and text are left out and counted
    (``empty_skipped``); without it they are refused. No document at all is refused too:
    empty work is not done.
    """
    from tqdm.auto import tqdm

    from magretrieve.serving.retriever import check_documents

    if batch_size < 1 or checkpoint_every < 1 or queue_size < 1:
        raise DataError("batch_size, checkpoint_every and queue_size must be positive")
    start = time.perf_counter()
    seen: dict[str, int | None] = {}
    added = skipped = since_checkpoint = truncated = 0
    empty_ids: list[str] = []
    empty = [0]  # counted by the reader thread
    stop = threading.Event()
    read_q: queue.Queue[object] = queue.Queue(maxsize=queue_size)
    encoded_q: queue.Queue[object] = queue.Queue(maxsize=queue_size)

    def pairs() -> Iterator[tuple[int | None, Document]]:
        for item in docs:
            yield item if isinstance(item, tuple) else (None, item)

    def ready(batch: list[Document]) -> tuple[list[Document], list[Document], object]:
        check_documents(batch)
        have = retriever.existing([d.id for d in batch])
        todo = [d for d in batch if d.id not in have]
        return batch, todo, retriever.tokenize_batch(todo) if todo else None

    def read() -> None:
        try:
            batch: list[Document] = []
            for line, doc in pairs():
                if is_empty(doc):
                    where = f"{source}:{line}" if line is not None else source
                    if not skip_empty:
                        raise DataError(
                            f"{where}: document {doc.id!r} has empty title and text "
                            "(`magretrieve index --skip-empty` skips and counts such documents)"
                        )
                    empty[0] += 1
                    if len(empty_ids) < 5:
                        empty_ids.append(doc.id)
                    continue
                if doc.id in seen:
                    first = seen[doc.id]
                    where = f"{source}:{line}" if line is not None else source
                    raise DataError(
                        f"{where}: duplicate document id {doc.id!r}"
                        + (f" (first on line {first})" if first is not None else "")
                    )
                seen[doc.id] = line
                batch.append(doc)
                if len(batch) >= batch_size:
                    _put(read_q, ready(batch), stop)
                    batch = []
            if batch:
                _put(read_q, ready(batch), stop)
            _put(read_q, _END, stop)
        except _Stop:
            pass
        except BaseException as exc:  # handed to the writer, in order, after earlier batches
            with contextlib.suppress(_Stop):
                _put(read_q, exc, stop)

    def encode() -> None:
        try:
            while True:
                item = _get(read_q, stop)
                if item is _END or isinstance(item, BaseException):
                    _put(encoded_q, item, stop)
                    return
                batch, todo, tokens = cast(tuple[list[Document], list[Document], Any], item)
                vectors = retriever.encode_batch(todo, tokens) if todo else None
                cut = int(getattr(retriever.encoder, "last_truncated", 0) or 0) if todo else 0
                _put(encoded_q, (batch, todo, vectors, cut), stop)
        except _Stop:
            pass
        except BaseException as exc:
            with contextlib.suppress(_Stop):
                _put(encoded_q, exc, stop)

    threads = [
        threading.Thread(target=read, name="magretrieve-index-read", daemon=True),
        threading.Thread(target=encode, name="magretrieve-index-encode", daemon=True),
    ]
    bar = tqdm(total=total, desc="indexing", unit="doc", disable=not progress)
    sampler = PseudoQuerySampler()
    with retriever.store.bulk_load():  # the store's index is built once, by optimize()
        try:
            for thread in threads:
                thread.start()
            while True:
                item = _get(encoded_q, stop)
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise item
                batch, todo, vectors, cut = cast(
                    tuple[list[Document], list[Document], Any, int], item
                )
                skipped += len(batch) - len(todo)
                sampler.add(batch)
                if todo:
                    n = retriever.write_batch(todo, vectors)
                    truncated += cut
                    added += n
                    since_checkpoint += n
                bar.update(len(batch))
                bar.set_postfix(added=added, skipped=skipped)
                if since_checkpoint >= checkpoint_every:
                    retriever.persist()
                    since_checkpoint = 0
        finally:
            stop.set()
            for thread in threads:
                thread.join()
            bar.close()
            # keep what was written even when the run stops on an error
            if added or since_checkpoint:
                retriever.persist()
    if not seen:
        raise DataError(
            f"{source}: no document to index"
            + (f" ({empty[0]} empty document(s) skipped)" if empty[0] else "")
        )
    use_pseudo_queries(retriever, sampler)
    retriever.store.optimize()
    retriever.persist()
    return IndexReport(
        seen=len(seen),
        added=added,
        skipped=skipped,
        seconds=time.perf_counter() - start,
        count=retriever.store.count(),
        truncated=truncated,
        empty_skipped=empty[0],
        empty_ids=empty_ids,
    )


def use_pseudo_queries(retriever: Retriever, sampler: PseudoQuerySampler) -> None:
    """Give an ANN store pseudo-queries from the indexed documents to tune its recall on,
    unless it already has tuning queries (the user's); see :mod:`.tuning_queries`."""
    store = retriever.store
    if store.tuning_queries is None and callable(getattr(store, "measure_recall", None)):
        store.tuning_queries = pseudo_queries(retriever, sampler)


def index_corpus(
    retriever: Retriever,
    corpus: str | Path,
    *,
    batch_size: int = DEFAULT_INDEX_BATCH,
    checkpoint_every: int = 4096,
    progress: bool = True,
    skip_empty: bool = False,
    total: int | None = None,
    engine: str = "local",
    **engine_options: Any,
) -> IndexReport:
    """Stream a corpus JSONL (``_id``, ``title``, ``text`` + payload) into the retriever's store.

    ``skip_empty`` leaves out (and counts) documents with empty title and text; without it
    the first one is refused with its line. The file is validated first
    (:func:`check_corpus_file`; pass its result as ``total`` when already done), so a bad
    corpus is refused before anything is written. ``engine`` picks where encoding runs
    (:mod:`magretrieve.engines`): ``"local"`` (this process) or ``"ray"`` (a Ray cluster;
    options ``address``, ``workers``, ``threads``); this process writes the store either way.
    """
    if engine != "local":
        from magretrieve.engines import get_engine

        run = get_engine(engine)
        if total is None:
            check_corpus_file(corpus, skip_empty=skip_empty)
        report: IndexReport = run(
            retriever,
            corpus,
            batch_size=batch_size,
            checkpoint_every=checkpoint_every,
            progress=progress,
            skip_empty=skip_empty,
            **engine_options,
        )
        return report
    if engine_options:
        raise ConfigError(f"options {sorted(engine_options)} need a distributed engine")
    path = Path(corpus)
    if total is None:
        total = check_corpus_file(path, skip_empty=skip_empty)
    return index_documents(
        retriever,
        iter_corpus(path, skip_empty=True),
        batch_size=batch_size,
        checkpoint_every=checkpoint_every,
        total=total,
        progress=progress,
        source=str(path),
        skip_empty=skip_empty,
    )
