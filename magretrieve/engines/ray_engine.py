"""``engine="ray"``: encode a corpus on a Ray cluster, write it through the store protocol.

Layout of a run (``magretrieve index EXPORT CORPUS --store SPEC --engine ray``):

1. **Check, on the driver** (no Ray yet): every line is parsed as the local engine parses it
   (:func:`magretrieve.data.readers.iter_documents_to_index`) and duplicate ids are refused naming their lines, so
   bad input fails before anything is encoded or stored. The ids the store already holds are
   looked up (``store.existing``): a re-run skips them, exactly like the local engine.
2. **Encode, on the cluster**: Ray Data reads the JSONL in byte ranges cut at ``\\n`` and splits
   them on ``\\n`` only, exactly as the local reader does (``read_text`` would also split inside
   JSON strings at U+2028, U+0085 and the other Unicode line breaks); an actor pool
   of ``workers`` actors, each holding one :class:`~magretrieve.serving.onnx_encoder.OnnxEncoder` session
   (1 CPU, 1 onnxruntime thread by default), parses each line and encodes the documents not yet
   stored.
3. **Write, on the driver — one writer**: vectors stream back in corpus order and the driver
   writes them with :meth:`Retriever.write_batch` (same payloads, same recorded magnitude as the
   local path), persisting every ``checkpoint_every`` documents. A folder store (FAISS, Qdrant
   Edge, embedded Qdrant) is single-writer by construction, so one writer is the only correct
   choice for it; it also keeps the crash semantics of the local engine (a killed run keeps
   what was persisted and resumes). For a Qdrant server the single writer costs little:
   encoding, not upserting, dominates (see docs/scale.md).

The export folder and the corpus must be readable at the same path on every Ray node (a shared
filesystem, or the same files copied to each node).
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from magretrieve.core.errors import ConfigError, DataError, StoreError
from magretrieve.core.extras import require
from magretrieve.data.readers import (
    Document,
    corpus_document,
    is_empty,
    iter_corpus,
    iter_documents_to_index,
)
from magretrieve.engines import RayOptions
from magretrieve.serving.indexing import IndexReport
from magretrieve.stores.base import check_finite

if TYPE_CHECKING:  # pragma: no cover
    from magretrieve.serving.retriever import Retriever

#: Ids per ``store.existing`` call when looking up what a re-run may skip.
EXISTING_CHUNK = 4096
#: Bytes of corpus per Ray read task (cut at the next newline).
READ_CHUNK = 4 << 20
#: Seconds to wait for a cluster address to answer before giving up.
CONNECT_TIMEOUT = 30.0


def _ray() -> Any:
    return require("ray", what="engine 'ray'")


def probe_address(address: str, timeout: float) -> None:
    """Fail in ``timeout`` seconds, in one line, if nothing listens at ``host:port``.

    ``ray.init`` keeps retrying an address nobody answers on for minutes; a TCP connection
    attempt tells a dead or unreachable address at once. ``auto`` and other forms without a
    port are left to Ray.
    """
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        cause = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise ConfigError(
            f"Ray at {address} did not answer within {timeout:g} s ({cause}); is the cluster "
            "running? (--connect-timeout sets the wait)"
        ) from None


def start_ray(
    address: str | None = None,
    num_cpus: int | None = None,
    connect_timeout: float = CONNECT_TIMEOUT,
) -> bool:
    """Connect to the Ray cluster at ``address``, or start a local node; True if this call did.

    A local node's raylet sometimes misses Ray's fixed 30 s registration window on a small,
    busy machine (seen once in this project's CI with nothing else running); a second start,
    with fresh ports and a fresh session, is what a user would do, so a local start gets two
    tries. A cluster address gets one: an unreachable cluster will not come up by retrying.
    Failing that, one line naming where Ray was asked to run.
    """
    ray = _ray()
    if ray.is_initialized():
        return False
    options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if num_cpus is not None:
        options["num_cpus"] = num_cpus
    if address:
        probe_address(address, connect_timeout)
    tries = 1 if address else 2
    for attempt in range(1, tries + 1):
        try:
            ray.init(address=address, **options)
            return True
        except Exception as exc:  # ray raises plain Exception / ConnectionError on start-up
            ray.shutdown()
            if attempt == tries:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                where = f"at {address}" if address else "(a local node)"
                raise ConfigError(f"Ray {where} did not start: {first[:300]}") from None
    return False  # pragma: no cover - the loop returns or raises


def check_corpus(
    retriever: Retriever, path: Path, skip_empty: bool
) -> tuple[int, set[str], list[str]]:
    """Validate every line, refuse duplicates; return (documents, ids stored, empty ids)."""
    documents = 0
    stored: set[str] = set()
    empty: list[str] = []
    pending: list[str] = []
    for _, doc in iter_documents_to_index(path, skip_empty=skip_empty, on_empty=empty.append):
        documents += 1
        pending.append(doc.id)
        if len(pending) >= EXISTING_CHUNK:
            stored |= retriever.store.existing(pending)
            pending.clear()
    if pending:
        stored |= retriever.store.existing(pending)
    if not documents:
        raise DataError(f"{path}: no document to index")
    return documents, stored, empty


def line_ranges(path: Path, chunk: int) -> list[tuple[int, int]]:
    """Byte ranges of about ``chunk`` bytes covering ``path``, each ending after a ``\\n``."""
    size = path.stat().st_size
    ranges: list[tuple[int, int]] = []
    start = 0
    with path.open("rb") as fh:
        while start < size:
            fh.seek(min(start + chunk, size))
            fh.readline()  # on to the end of the line the cut falls in
            end = min(fh.tell(), size)
            ranges.append((start, end))
            start = end
    return ranges


def read_lines(row: dict[str, Any]) -> list[dict[str, str]]:
    """The non-blank lines of one byte range, split on ``\\n`` only (as the local reader)."""
    with open(row["path"], "rb") as fh:
        fh.seek(int(row["start"]))
        data = fh.read(int(row["end"]) - int(row["start"]))
    lines = (raw.decode("utf-8") for raw in data.split(b"\n"))
    return [{"text": line} for line in lines if line.strip()]


class EncodeActor:
    """A Ray Data actor: one ONNX document session, encodes the lines it is given."""

    def __init__(self, export_dir: str, source: str, stored: list[Any], threads: int) -> None:
        import ray

        from magretrieve.serving.onnx_encoder import OnnxEncoder

        self.encoder = OnnxEncoder.load(export_dir, threads=threads)
        self.source = Path(source)
        skip = stored[0]
        self.stored = ray.get(skip) if isinstance(skip, ray.ObjectRef) else skip

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        docs: list[Document] = []
        for line in batch["text"]:
            if not str(line).strip():
                continue
            # the driver has validated every line: "?" only shows if the file changed since
            doc = corpus_document(json.loads(line), self.source, 0, skip_empty=True)
            if not is_empty(doc) and doc.id not in self.stored:
                docs.append(doc)
        dim = self.encoder.manifest.dimension
        if not docs:
            vectors = np.zeros((0, dim), dtype=np.float32)
        else:
            vectors = np.asarray(
                self.encoder.encode_documents([d.full_text for d in docs]), dtype=np.float32
            )
        truncated = np.zeros(len(docs), dtype=np.int64)
        if len(docs):
            truncated[0] = int(getattr(self.encoder, "last_truncated", 0) or 0)
        return {
            "id": np.array([d.id for d in docs], dtype=object),
            "title": np.array([d.title for d in docs], dtype=object),
            "body": np.array([d.text for d in docs], dtype=object),
            "payload": np.array([json.dumps(d.payload) for d in docs], dtype=object),
            "vector": vectors,
            "truncated": truncated,
        }


def index_corpus_ray(
    retriever: Retriever,
    corpus: str | Path,
    *,
    batch_size: int = 64,
    checkpoint_every: int = 4096,
    progress: bool = True,
    skip_empty: bool = False,
    address: str | None = None,
    workers: int | None = None,
    threads: int = 1,
    connect_timeout: float | None = None,
) -> IndexReport:
    """Index ``corpus`` with ``workers`` Ray actors encoding and this process writing.

    ``address``: a running cluster (``ray://host:10001`` or ``auto``); None joins the Ray
    instance this process already started, or starts a local one. ``workers``: encoding actors
    (default: the cluster's CPUs divided by ``threads``). ``skip_empty`` as in the local engine.
    ``connect_timeout``: seconds an ``address`` gets to answer (default 30).
    """
    from tqdm.auto import tqdm

    if batch_size < 1 or checkpoint_every < 1:
        raise DataError("batch_size and checkpoint_every must be positive")
    # the engine's options are checked against their declarations (engines.RayOptions)
    checked = RayOptions(address=address, workers=workers, connect_timeout=connect_timeout)
    checked.check_declared()
    workers = checked.workers
    if threads < 1:
        raise ConfigError(f"threads must be at least 1, got {threads}")
    connect_timeout = checked.connect_timeout or CONNECT_TIMEOUT
    folder = getattr(retriever.manifest, "folder", None)
    if folder is None:
        raise ConfigError("engine 'ray' needs a retriever loaded from an export folder")
    path = Path(corpus)
    start = time.perf_counter()
    total, stored, empty = check_corpus(retriever, path, skip_empty)
    added = truncated = 0
    todo = total - len(stored)
    if todo:
        ray = _ray()
        started = start_ray(address, connect_timeout=connect_timeout)
        try:
            with retriever.store.bulk_load():  # the store's index is built once, by optimize()
                added, truncated = _run(
                    ray,
                    retriever,
                    path,
                    folder,
                    stored,
                    todo,
                    batch_size=batch_size,
                    checkpoint_every=checkpoint_every,
                    progress=progress,
                    workers=workers,
                    threads=threads,
                    tqdm=tqdm,
                )
        finally:
            retriever.persist()  # keep what was written even when the run stops on an error
            if started:
                ray.shutdown()
    from magretrieve.serving.indexing import use_pseudo_queries
    from magretrieve.serving.tuning_queries import PseudoQuerySampler

    sampler = PseudoQuerySampler()  # one more pass over the corpus: documents to make queries of
    for _, doc in iter_corpus(path, skip_empty=True):
        sampler.add([doc])
    use_pseudo_queries(retriever, sampler)
    retriever.store.optimize()
    retriever.persist()
    return IndexReport(
        seen=total,
        added=added,
        skipped=len(stored),
        seconds=time.perf_counter() - start,
        count=retriever.store.count(),
        truncated=truncated,
        empty_skipped=len(empty),
        empty_ids=empty[:5],
    )


def _run(
    ray: Any,
    retriever: Retriever,
    path: Path,
    folder: Path,
    stored: set[str],
    todo: int,
    *,
    batch_size: int,
    checkpoint_every: int,
    progress: bool,
    workers: int | None,
    threads: int,
    tqdm: Any,
) -> tuple[int, int]:
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # the store is written in corpus order
    ctx.enable_progress_bars = False  # one bar, ours
    if workers is None:
        workers = max(1, int(ray.cluster_resources().get("CPU", 1)) // threads)
    # reading is light next to encoding; at 0 CPUs it never waits for the actors, which hold
    # every CPU (with a 1-CPU read task on a 2-CPU cluster and 2 actors, nothing would run)
    # a few ranges per worker, so every actor gets input from the first blocks on
    source = str(path.resolve())
    chunk = max(1, min(READ_CHUNK, path.stat().st_size // (4 * workers)))
    ranges = [{"path": source, "start": a, "end": b} for a, b in line_ranges(path, chunk)]
    ds = ray.data.from_items(ranges, override_num_blocks=len(ranges)).flat_map(
        read_lines, num_cpus=0
    )
    encoded = ds.map_batches(
        EncodeActor,
        fn_constructor_kwargs={
            "export_dir": str(Path(folder).resolve()),
            "source": str(path),
            "stored": [ray.put(frozenset(stored))],
            "threads": threads,
        },
        batch_size=batch_size,
        batch_format="numpy",
        concurrency=workers,
        num_cpus=threads,
    )
    added = truncated = since_checkpoint = 0
    bar = tqdm(
        total=todo, desc=f"indexing (ray, {workers} workers)", unit="doc", disable=not progress
    )
    try:
        for out in encoded.iter_batches(batch_size=None, batch_format="numpy"):
            if not len(out["id"]):
                continue
            docs = [
                Document(str(i), str(b), str(t), json.loads(p))
                for i, t, b, p in zip(
                    out["id"], out["title"], out["body"], out["payload"], strict=True
                )
            ]
            vectors = np.stack(out["vector"]).astype(np.float32)
            ids = [d.id for d in docs]
            if vectors.shape != (len(docs), int(retriever.manifest.dimension)):
                raise StoreError(f"ray engine: {vectors.shape} vectors for {len(docs)} documents")
            check_finite(vectors, ids, f"encoding for {retriever.store.location}")
            n = retriever.write_batch(docs, vectors)
            added += n
            since_checkpoint += n
            truncated += int(out["truncated"].sum())
            bar.update(len(docs))
            if since_checkpoint >= checkpoint_every:
                retriever.persist()
                since_checkpoint = 0
    finally:
        bar.close()
    return added, truncated
