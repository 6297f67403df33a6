"""Bulk indexing that survives interruption: resumable, checkpointed, with a progress bar.

Re-running the same command skips ids the store already holds, so a crash (or Ctrl-C, or
SIGKILL) costs at most the work since the last checkpoint. Checkpoints call the store's
``persist()`` (FAISS: an atomic new generation; Qdrant: already durable per write; Edge:
flush of its write-ahead log). Duplicate ids inside the corpus are refused, naming the line.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from magretrieve.data import Document, is_empty, iter_corpus, read_error
from magretrieve.errors import DataError

if TYPE_CHECKING:  # pragma: no cover
    from magretrieve.retriever import Retriever


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
    first: dict[str, int] = {}
    documents = 0
    for line, doc in iter_corpus(path, skip_empty=True):
        if is_empty(doc):
            if not skip_empty:
                raise DataError(
                    f"{path}:{line}: document {doc.id!r} has empty title and text "
                    "(`magretrieve index --skip-empty` skips and counts such documents)"
                )
            continue
        if doc.id in first:
            raise DataError(
                f"{path}:{line}: duplicate document id {doc.id!r} (first on line {first[doc.id]})"
            )
        first[doc.id] = line
        documents += 1
    if not documents:
        raise DataError(
            f"{path}: no document to index"
            + (" (every document is empty)" if first or _count_lines(path) else " (empty file)")
            + "; no store was created or changed"
        )
    return documents


def index_documents(
    retriever: Retriever,
    docs: Iterable[tuple[int, Document]] | Iterable[Document],
    *,
    batch_size: int = 64,
    checkpoint_every: int = 4096,
    total: int | None = None,
    progress: bool = True,
    source: str = "corpus",
    skip_empty: bool = False,
) -> IndexReport:
    """Add ``docs`` (``Document`` or ``(line, Document)``) in batches, skipping stored ids.

    Every ``checkpoint_every`` written documents the store is persisted; at the end it is
    optimized (FAISS IVF training, Edge HNSW build) and persisted again. With ``skip_empty``
    documents with empty title and text are left out and counted (``empty_skipped``);
    without it they are refused. No document at all is refused too: empty work is not done.
    """
    from tqdm.auto import tqdm

    if batch_size < 1 or checkpoint_every < 1:
        raise DataError("batch_size and checkpoint_every must be positive")
    start = time.perf_counter()
    seen: dict[str, int | None] = {}
    added = skipped = since_checkpoint = truncated = empty = 0
    empty_ids: list[str] = []
    bar = tqdm(total=total, desc="indexing", unit="doc", disable=not progress)

    def pairs() -> Iterator[tuple[int | None, Document]]:
        for item in docs:
            yield item if isinstance(item, tuple) else (None, item)

    batch: list[Document] = []

    def flush() -> None:
        nonlocal added, skipped, since_checkpoint, truncated
        have = retriever.store.existing([d.id for d in batch])
        todo = [d for d in batch if d.id not in have]
        skipped += len(batch) - len(todo)
        if todo:
            n = retriever.add_batch(todo)
            truncated += int(getattr(retriever.encoder, "last_truncated", 0) or 0)
            added += n
            since_checkpoint += n
        bar.update(len(batch))
        bar.set_postfix(added=added, skipped=skipped)
        batch.clear()
        if since_checkpoint >= checkpoint_every:
            retriever.persist()
            since_checkpoint = 0

    try:
        for line, doc in pairs():
            if is_empty(doc):
                where = f"{source}:{line}" if line is not None else source
                if not skip_empty:
                    raise DataError(
                        f"{where}: document {doc.id!r} has empty title and text "
                        "(`magretrieve index --skip-empty` skips and counts such documents)"
                    )
                empty += 1
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
                flush()
        if batch:
            flush()
    finally:
        bar.close()
        # keep what was written even when the run stops on an error
        if added or since_checkpoint:
            retriever.persist()
    if not seen:
        raise DataError(
            f"{source}: no document to index"
            + (f" ({empty} empty document(s) skipped)" if empty else "")
        )
    retriever.store.optimize()
    retriever.persist()
    return IndexReport(
        seen=len(seen),
        added=added,
        skipped=skipped,
        seconds=time.perf_counter() - start,
        count=retriever.store.count(),
        truncated=truncated,
        empty_skipped=empty,
        empty_ids=empty_ids,
    )


def index_corpus(
    retriever: Retriever,
    corpus: str | Path,
    *,
    batch_size: int = 64,
    checkpoint_every: int = 4096,
    progress: bool = True,
    skip_empty: bool = False,
    total: int | None = None,
) -> IndexReport:
    """Stream a corpus JSONL (``_id``, ``title``, ``text`` + payload) into the retriever's store.

    ``skip_empty`` leaves out (and counts) documents with empty title and text; without it
    the first one is refused with its line. The file is validated first
    (:func:`check_corpus_file`; pass its result as ``total`` when already done), so a bad
    corpus is refused before anything is written.
    """
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
