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
from typing import TYPE_CHECKING, Any

from magretrieve.data import Document, iter_corpus
from magretrieve.errors import ConfigError, DataError

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

    @property
    def docs_per_second(self) -> float:
        return self.added / self.seconds if self.seconds > 0 else 0.0


def _count_lines(path: Path) -> int:
    with path.open("rb") as fh:
        return sum(1 for line in fh if line.strip())


def index_documents(
    retriever: Retriever,
    docs: Iterable[tuple[int, Document]] | Iterable[Document],
    *,
    batch_size: int = 64,
    checkpoint_every: int = 4096,
    total: int | None = None,
    progress: bool = True,
    source: str = "corpus",
) -> IndexReport:
    """Add ``docs`` (``Document`` or ``(line, Document)``) in batches, skipping stored ids.

    Every ``checkpoint_every`` written documents the store is persisted; at the end it is
    optimized (FAISS IVF training, Edge HNSW build) and persisted again.
    """
    from tqdm.auto import tqdm

    if batch_size < 1 or checkpoint_every < 1:
        raise DataError("batch_size and checkpoint_every must be positive")
    start = time.perf_counter()
    seen: dict[str, int | None] = {}
    added = skipped = since_checkpoint = truncated = 0
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
        retriever.persist()
    retriever.store.optimize()
    retriever.persist()
    return IndexReport(
        seen=len(seen),
        added=added,
        skipped=skipped,
        seconds=time.perf_counter() - start,
        count=retriever.store.count(),
        truncated=truncated,
    )


def index_corpus(
    retriever: Retriever,
    corpus: str | Path,
    *,
    batch_size: int = 64,
    checkpoint_every: int = 4096,
    progress: bool = True,
    engine: str = "local",
    **engine_options: Any,
) -> IndexReport:
    """Stream a corpus JSONL (``_id``, ``title``, ``text`` + payload) into the retriever's store.

    ``engine`` picks where encoding runs (:mod:`magretrieve.engines`): ``"local"`` (this
    process) or ``"ray"`` (a Ray cluster; options ``address``, ``workers``, ``threads``).
    """
    if engine != "local":
        from magretrieve.engines import get_engine

        return get_engine(engine)(
            retriever,
            corpus,
            batch_size=batch_size,
            checkpoint_every=checkpoint_every,
            progress=progress,
            **engine_options,
        )
    if engine_options:
        raise ConfigError(f"options {sorted(engine_options)} need a distributed engine")
    path = Path(corpus)
    total = _count_lines(path) if path.is_file() else None
    return index_documents(
        retriever,
        iter_corpus(path),
        batch_size=batch_size,
        checkpoint_every=checkpoint_every,
        total=total,
        progress=progress,
        source=str(path),
    )
