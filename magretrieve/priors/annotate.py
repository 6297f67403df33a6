"""Write each document's magnitude ``m(d)`` into an existing Cosine collection: the plug-in path.

:func:`annotate_store` reads every point of an existing Cosine Qdrant collection (its unit
vectors ``d̂``; the vectors are never rewritten), computes ``m(d)`` from a frozen-encoder norm
head or the corpus prior (the same recipes as :mod:`magretrieve.priors.rescale`), writes it into each
point's payload (``magretrieve_m``), and records the recipe and the annotation in the
collection's metadata **last**. From then on ``open_store`` opens the collection as a
:class:`~magretrieve.stores.qdrant_cosine_store.QdrantCosineStore`, which ranks by
``cos·m(d)`` inside Qdrant (cosine prefetch + formula), so ``Retriever`` and
``magretrieve search`` work unchanged with the cosine export.

An interrupted run leaves the collection unannotated (refused as before, vectors intact) with
some payloads already holding ``m``; running it again recomputes and completes it. Running it
after new points were added by another pipeline refreshes every point.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.core.errors import ConfigError, StoreError
from magretrieve.priors.corpus_prior import CorpusPrior, hub_scores, unit
from magretrieve.priors.rescale import META_KEY as MAGNITUDE_KEY
from magretrieve.priors.rescale import head_recipe, magnitudes_for


@dataclass
class AnnotateReport:
    """What an annotation did."""

    store: str
    kind: str
    count: int
    field: str
    prefetch: int
    magnitude_min: float
    magnitude_mean: float
    magnitude_max: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def open_for_annotation(spec: str) -> Any:
    """The Cosine collection a spec names, opened whether or not it was annotated before."""
    from magretrieve.stores import qdrant_store, registry

    backend, loc = registry.backend_for(spec)
    if backend.prefix == "pgvector":
        from magretrieve.stores.pgvector_store import open_pgvector

        return open_pgvector(loc["uri"], loc["table"], annotating=True)
    opener = qdrant_store.OPENERS.get(backend.prefix)
    if opener is None:
        raise StoreError(
            f"{spec}: annotate works on an existing Cosine Qdrant collection (qdrant:, "
            "qdrant-local:, qdrant-memory:) or pgvector table; to give another store a "
            "magnitude, write a new one with `magretrieve rescale`"
        )
    return opener(loc, None, {}, annotating=True)


def load_prior(beta: float | None, prior_file: str | Path | None, k: int) -> CorpusPrior | None:
    """The corpus prior of ``--corpus-prior β`` or ``--prior-file`` (None when neither)."""
    if prior_file is not None:
        if beta is not None:
            raise ConfigError("give --corpus-prior or --prior-file, not both")
        try:
            return CorpusPrior.from_dict(
                json.loads(Path(prior_file).read_text()), source=str(prior_file)
            )
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{prior_file}: not valid JSON ({exc})") from None
    if beta is not None:
        return CorpusPrior(beta=beta, k=k)
    return None


def point_text(payload: dict[str, Any]) -> str:
    """The text a document encoder gets for a stored point: title + text, else ``content``."""
    title = str(payload.get("title") or "").strip()
    text = str(payload.get("text") or payload.get("content") or "").strip()
    return f"{title} {text}".strip() if title and text else (text or title)


def export_norms(
    export_dir: str | Path, payloads: list[dict[str, Any]], ids: list[str], where: str
) -> tuple[np.ndarray, dict[str, Any]]:
    """m(d) = the stored norm a magnitude-keeping export gives each point's text, and its recipe."""
    from magretrieve.serving.runtime import OnnxEncoder

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


def annotate_store(
    store: str | Any,
    *,
    head: str | Path | None = None,
    prior: CorpusPrior | None = None,
    norms_from: str | Path | None = None,
    field: str | None = None,
    prefetch: int | None = None,
    batch_size: int = 512,
    progress: bool = True,
) -> AnnotateReport:
    """Write ``m(d)`` into every point of an existing Cosine collection (see module doc).

    Exactly one of ``head`` (a run folder with a frozen-encoder norm head), ``prior`` (a
    :class:`CorpusPrior`; its mean/std are fitted on the stored vectors) or ``norms_from`` (a
    magnitude-keeping export whose document norm of each stored text becomes ``m``) is given.
    """
    from tqdm.auto import tqdm

    from magretrieve.stores.qdrant_cosine_store import (
        ANNOTATION_KEY,
        DEFAULT_FIELD,
        DEFAULT_PREFETCH,
    )

    if sum(x is not None for x in (head, prior, norms_from)) != 1:
        raise ConfigError(
            "give exactly one of a norm head (--head RUN), a corpus prior (--corpus-prior β) or "
            "a magnitude-keeping export (--norms-from EXPORT)"
        )
    if prefetch is not None and prefetch < 1:
        raise ConfigError(f"--prefetch must be positive, got {prefetch}")
    recipe = head_recipe(head) if head is not None else None  # fail on a bad run before reading
    target = open_for_annotation(store) if isinstance(store, str) else store
    try:
        where = target.location
        meta = dict(target.read_metadata() or {})
        if field is not None:
            target.field = field
        pages, ids = [], []
        for points in tqdm(
            target.iter_points(batch_size), desc="reading", unit="page", disable=not progress
        ):
            pages.append(points)
            ids.extend(str(p.id) for p in points)
        if not ids:
            raise StoreError(f"{where}: the collection is empty; nothing to annotate")
        vectors = np.asarray([p.vector for page in pages for p in page], dtype=np.float32)
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
            fitted = CorpusPrior(**prior.to_dict())
            fitted.validate()
            hubs = hub_scores(units, fitted.k)
            fitted.mean, fitted.std = float(hubs.mean()), float(hubs.std()) or 1.0
            mags = fitted.magnitudes(fitted.z_scores(hubs))
            recipe = fitted.to_dict()
        if not np.isfinite(mags).all() or (mags <= 0).any():
            raise StoreError(f"{where}: m(d) is not finite and positive for some points")
        bar = tqdm(total=len(ids), desc="annotating", unit="doc", disable=not progress)
        start = 0
        for points in pages:
            target.set_magnitudes(points, mags[start : start + len(points)])
            start += len(points)
            bar.update(len(points))
        bar.close()
        chosen = int(prefetch or DEFAULT_PREFETCH)
        meta[MAGNITUDE_KEY] = recipe
        meta[ANNOTATION_KEY] = {"field": target.field or DEFAULT_FIELD, "prefetch": chosen}
        if "document_contract" in meta:
            meta["document_contract"] = "magnitude_keeping"
        target.write_metadata(meta)  # last: the collection counts as annotated from here on
        return AnnotateReport(
            store=where,
            kind=str(recipe["kind"]),
            count=len(ids),
            field=target.field,
            prefetch=chosen,
            magnitude_min=float(mags.min()),
            magnitude_mean=float(mags.mean()),
            magnitude_max=float(mags.max()),
        )
    finally:
        if isinstance(store, str):
            target.close()
