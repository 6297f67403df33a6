"""Write each document's magnitude ``m(d)`` into an existing Cosine collection: the plug-in path.

:func:`annotate_store` reads every point of an existing Cosine Qdrant collection or pgvector
table (its unit vectors ``d̂``; the vectors are never rewritten), computes ``m(d)`` from a
frozen-encoder norm head, a document prior whose only term is a multiplier (the hub prior,
or any ``fit-prior`` file of that kind), or a magnitude-keeping export, writes it into each
point's payload (Qdrant, field ``magretrieve_m``) or a column magretrieve adds (pgvector), and
records the recipe and the annotation in the store's metadata. From then on ``open_store``
opens it as a :class:`~magretrieve.stores.qdrant_cosine_store.QdrantCosineStore` (or
``PgCosineStore``), which ranks by ``cos·m(d)`` inside the database, so ``Retriever`` and
``magretrieve search`` work unchanged with the cosine export.

What it needs from the store is declared once, as
:class:`~magretrieve.stores.annotation.AnnotatableStore` (both stores implement it): read every
point, tell whether a field holds the user's data, begin marked incomplete, write m, record
the metadata. Any other store is refused in one line.

Safety rules:

* a ``--field`` that holds data magretrieve did not write (a payload key or column of the
  user's) is refused before anything is written; so are stores magretrieve built itself for
  inner product (they keep the magnitude already);
* the metadata is marked ``incomplete`` *before* the first ``m`` is written and unmarked
  last, so for the whole of a (re-)annotation searches rank by plain cosine and the Retriever
  refuses the store, never serving a mix of old and new magnitudes; an interrupted run is
  finished by running the same command again (every ``m`` is recomputed from the vectors);
* every input (prior file, field name, prefetch) is checked before the store is touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.core.errors import ConfigError, StoreError
from magretrieve.priors import DocumentPrior, prior_from_dict
from magretrieve.priors.base import unit
from magretrieve.priors.rescale import META_KEY as MAGNITUDE_KEY
from magretrieve.priors.rescale import (
    MagnitudeReport,
    head_recipe,
    incomplete_marker,
    magnitudes_for,
)
from magretrieve.stores.annotation import (
    ANNOTATION_KEY,
    DEFAULT_FIELD,
    DEFAULT_PREFETCH,
    INCOMPLETE_KEY,
    RECORDED_PREFETCH,
    AnnotatableStore,
    annotation_of,
    check_field_name,
    is_incomplete,
)

#: What annotate says about a store it cannot annotate.
NOT_ANNOTATABLE = (
    "annotate works on an existing Cosine Qdrant collection (qdrant:, qdrant-local:, "
    "qdrant-memory:) or pgvector table; to give another store a magnitude, write a new one "
    "with `magretrieve rescale`"
)


@dataclass
class AnnotateReport(MagnitudeReport):
    """What an annotation did."""

    store: str
    field: str
    prefetch: int


def open_for_annotation(spec: str) -> AnnotatableStore:
    """The Cosine collection a spec names, opened whether or not it was annotated before."""
    from magretrieve.stores import qdrant_store, registry

    backend, loc = registry.backend_for(spec)
    if backend.prefix == "pgvector":
        from magretrieve.stores.pgvector_store import open_pgvector

        return annotatable(open_pgvector(loc["uri"], loc["table"], annotating=True))
    opener = qdrant_store.OPENERS.get(backend.prefix)
    if backend.prefix == "qdrant-local" and not (Path(loc["path"]) / "collection").is_dir():
        # opening would create the folder: refuse first, so a typo leaves nothing behind
        raise StoreError(f"{spec}: no embedded Qdrant data in {loc['path']} to annotate")
    if opener is None:
        raise StoreError(f"{spec}: {NOT_ANNOTATABLE}")
    return annotatable(opener(loc, None, annotating=True))


def annotatable(store: Any, *, opened_here: bool = True) -> AnnotatableStore:
    """``store`` as the annotation protocol, or one line saying annotate cannot use it (a
    store ``opened_here`` is closed first; the caller's own store is left open)."""
    if isinstance(store, AnnotatableStore):
        return store
    where = getattr(store, "location", None) or type(store).__name__
    if opened_here and hasattr(store, "close"):
        store.close()
    raise StoreError(f"{where}: {NOT_ANNOTATABLE}")


def check_multiplier_only(prior: DocumentPrior) -> None:
    """Annotate stores one multiplier beside cosine: refuse priors with an offset or direction."""
    if prior.has_offset:
        raise ConfigError(
            f"{prior.source}: the prior {prior.label()} adds an offset b(d) to the score (or "
            "changes the direction), which a field beside a cosine index cannot hold; apply it "
            "with `magretrieve rescale --prior-file` into a new store, or fit a multiplier-only "
            "prior (`magretrieve fit-prior --method hub`)"
        )


def choose_field(target: AnnotatableStore, field: str | None, meta: dict[str, Any]) -> str:
    """The field (payload key or column) that receives m(d); refuses one holding user data."""
    where = target.location
    if field is not None:
        check_field_name(field, where)
    owned = (annotation_of(meta) or {}).get("field")
    if field is not None and owned and field != owned:
        state = "an interrupted annotation into" if is_incomplete(meta) else "annotated into"
        raise StoreError(
            f"{where}: {state} field {owned!r}; run annotate with --field {owned} (or no --field)"
        )
    chosen = str(field or owned or DEFAULT_FIELD)
    check_field_name(chosen, where)
    held = target.field_holds_user_data(chosen, meta)
    if held:
        raise StoreError(
            f"{where}: --field {chosen!r} would overwrite {held}; annotate never overwrites "
            "data it did not write: choose another --field"
        )
    return chosen


def point_text(payload: dict[str, Any]) -> str:
    """The text a document encoder gets for a stored point: title + text, else ``content``."""
    title = str(payload.get("title") or "").strip()
    text = str(payload.get("text") or payload.get("content") or "").strip()
    return f"{title} {text}".strip() if title and text else (text or title)


def export_norms(
    export_dir: str | Path, payloads: list[dict[str, Any]], ids: list[str], where: str
) -> tuple[np.ndarray, dict[str, Any]]:
    """m(d) = the stored norm a magnitude-keeping export gives each point's text, and its recipe."""
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    encoder = OnnxEncoder.load(export_dir)
    manifest = encoder.manifest
    if manifest.document_contract != "magnitude_keeping":
        raise ConfigError(
            f"{export_dir}: mode {manifest.mode} gives unit-norm documents, so its norms carry no "
            "magnitude; --norms-from needs a magnitude-keeping export (qnorm, dot, partial)"
        )
    texts = [point_text(p) for p in payloads]
    empty = [i for i, t in zip(ids, texts, strict=True) if not t]
    if empty:
        raise StoreError(
            f"{where}: point {empty[0]} has no title/text/content in its payload to encode "
            f"({len(empty)} such points); --norms-from re-encodes the stored texts"
        )
    vectors = np.asarray(encoder.encode_documents(texts), dtype=np.float64)
    recipe = {
        "kind": "export_norm",
        "export": str(export_dir),
        "model_fingerprint": manifest.model_fingerprint,
        "mode": manifest.mode,
    }
    return np.linalg.norm(vectors, axis=1), recipe


def stacked_vectors(points: list[Any], where: str) -> np.ndarray:
    """The points' vectors as one float32 array, or a StoreError naming the first point
    without a vector (a NULL embedding in a SQL table) or with a vector of another length."""
    size = None
    for point in points:
        vector = getattr(point, "vector", None)
        length = int(np.size(vector)) if vector is not None and np.ndim(vector) == 1 else 0
        if vector is not None and np.ndim(vector) == 1 and np.asarray(vector).dtype == object:
            length = 0  # an array around a NULL
        if not length:
            raise StoreError(
                f"{where}: point {point.id} has no vector; annotate reads every stored "
                "vector (delete that row or give it a vector, then run annotate again)"
            )
        if size is not None and length != size:
            raise StoreError(
                f"{where}: point {point.id} has a vector of length {length}, others {size}"
            )
        size = length
    try:
        return np.asarray([p.vector for p in points], dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{where}: stored vectors are not numbers ({exc})") from None


def annotate_store(
    store: str | AnnotatableStore,
    *,
    head: str | Path | None = None,
    prior: DocumentPrior | None = None,
    norms_from: str | Path | None = None,
    field: str | None = None,
    prefetch: int | None = None,
    batch_size: int = 512,
    progress: bool = True,
) -> AnnotateReport:
    """Write ``m(d)`` into every point of an existing Cosine collection (see module doc).

    ``store`` is a spec (opened here and closed at the end) or an open
    :class:`~magretrieve.stores.annotation.AnnotatableStore` (left open); any other object is
    refused in one line before anything is read.

    Exactly one of ``head`` (a run folder with a frozen-encoder norm head), ``prior`` (a
    multiplier-only :class:`~magretrieve.priors.DocumentPrior`, e.g. the hub prior; its corpus
    statistics are fitted on the stored vectors) or ``norms_from`` (a magnitude-keeping export
    whose document norm of each stored text becomes ``m``) is given. ``field`` defaults to the
    one recorded by an earlier annotation, else ``magretrieve_m``.
    """
    from tqdm.auto import tqdm

    if sum(x is not None for x in (head, prior, norms_from)) != 1:
        raise ConfigError(
            "give exactly one of a norm head (--head RUN), a prior (--corpus-prior β or "
            "--prior-file) or a magnitude-keeping export (--norms-from EXPORT)"
        )
    if prefetch is not None:
        prefetch = RECORDED_PREFETCH.check(prefetch)
    if batch_size < 1:
        raise ConfigError(f"batch size must be positive, got {batch_size}")
    if prior is not None:
        check_multiplier_only(prior)
    recipe = head_recipe(head) if head is not None else None  # fail on a bad run before reading
    if isinstance(store, str):
        target = open_for_annotation(store)
    else:
        target = annotatable(store, opened_here=False)
    try:
        where = target.location
        meta = dict(target.read_metadata() or {})
        chosen_field = choose_field(target, field, meta)
        target.field = chosen_field  # the payload read below leaves it out
        pages: list[list[Any]] = []
        ids: list[str] = []
        for points in tqdm(
            target.iter_points(batch_size), desc="reading", unit="page", disable=not progress
        ):
            pages.append(points)
            ids.extend(str(p.id) for p in points)
        if not ids:
            raise StoreError(f"{where}: the collection is empty; nothing to annotate")
        vectors = stacked_vectors([p for page in pages for p in page], where)
        # Cosine ranks by direction: what a point stores is taken as its d̂
        norms = np.linalg.norm(vectors, axis=1)
        if (norms <= 0).any() or not np.isfinite(vectors).all():
            bad = ids[int(np.flatnonzero((norms <= 0) | ~np.isfinite(vectors).all(axis=1))[0])]
            raise StoreError(f"{where}: point {bad} has a zero or non-finite vector")
        units = unit(vectors)
        if recipe is not None:
            mags = magnitudes_for(recipe, units)
        elif norms_from is not None:
            payloads = [dict(p.payload or {}) for page in pages for p in page]
            mags, recipe = export_norms(norms_from, payloads, ids, where)
        else:
            assert prior is not None
            prior.check_dimension(units.shape[1], prior.source)
            fitted = prior_from_dict(prior.to_dict(), prior.source)  # the caller's stays
            if fitted.uses_fields:  # a field prior reads each point's payload
                from magretrieve.priors.document_fields import DocumentFields

                points = [dict(p.payload or {}) for page in pages for p in page]
                fitted = fitted.with_fields(DocumentFields(ids, points))
            fitted.fit_corpus(units)
            mags = np.asarray(fitted.terms(units).multiplier, dtype=np.float64)
            recipe = fitted.to_dict()
        if not np.isfinite(mags).all() or (mags <= 0).any():
            raise StoreError(f"{where}: m(d) is not finite and positive for some points")
        chosen = int(prefetch or DEFAULT_PREFETCH)
        new_meta = {k: v for k, v in meta.items() if k != INCOMPLETE_KEY}
        new_meta[MAGNITUDE_KEY] = recipe
        new_meta[ANNOTATION_KEY] = {"field": chosen_field, "prefetch": chosen}
        if "document_contract" in new_meta:
            new_meta["document_contract"] = "magnitude_keeping"
        # Marked incomplete before the first m is written: from here until the marker goes,
        # searches rank by plain cosine and a Retriever refuses the store (no mixed m).
        marker = incomplete_marker(where, recipe, operation="annotate")
        target.begin_annotation(chosen_field, {**new_meta, INCOMPLETE_KEY: marker})
        bar = tqdm(total=len(ids), desc="annotating", unit="doc", disable=not progress)
        start = 0
        for points in pages:
            target.set_magnitudes(points, mags[start : start + len(points)])
            start += len(points)
            bar.update(len(points))
        bar.close()
        target.write_metadata(new_meta)  # last: the marker goes, the new m are served
        return AnnotateReport(
            **MagnitudeReport.measured(recipe, mags),
            store=where,
            field=chosen_field,
            prefetch=chosen,
        )
    finally:
        if isinstance(store, str):
            target.close()
