"""Give the documents of a cosine-built store a magnitude without re-encoding any text.

A store built with a cosine export holds unit vectors ``d̂``. Both kinds of document
magnitude it offers are functions of ``d̂`` alone, so they can be applied to what is stored:

* a **frozen-encoder norm head** (``magretrieve train --norm-head linear --freeze-encoder``):
  ``d̂ · exp(g(d̂))`` with the head's weights (read torch-free from ``norm_head.safetensors``);
* a **document prior** (:mod:`magretrieve.priors`: hub, CSLS, inverted softmax, mean-direction
  removal, combinations): a multiplier ``m(d)`` and/or an additive offset ``b(d)`` computed
  from the stored vectors themselves (and the training queries the prior carries). A prior
  with an offset writes one extra coordinate, ``[m(d)·v(d) ; b(d)]``, and the Retriever
  searches it with ``[q̂ ; 1]``.

:func:`rescale_store` reads every point (id, vector, payload) of the source store, refuses
vectors that are not unit-norm (or, for a head, not the outputs of the head's encoder,
checked on a small sample of stored texts), and writes ``d̂·m`` with the same ids and
payloads into a new target store (Qdrant: a new Dot collection; FAISS: an index rebuilt from
the stored vectors). The recipe is recorded in the target's metadata under ``magnitude``, so
documents added later through a :class:`~magretrieve.serving.retriever.Retriever` get the same
treatment (:func:`apply_recorded_magnitude`). Queries stay unit-norm, as the cosine export
already makes them, so the score becomes ``cos(q, d)·m(d)``.

Torch is imported only for the encoder check of a head.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.core.errors import ConfigError, StoreError
from magretrieve.core.extras import require_all
from magretrieve.core.text import blank
from magretrieve.priors import DocumentPrior, prior_from_dict, stored_vectors
from magretrieve.priors.base import unit
from magretrieve.stores.annotation import INCOMPLETE_KEY  # present while a rescale runs

logger = logging.getLogger(__name__)

#: Store-metadata key holding the magnitude recipe of a rescaled store.
META_KEY = "magnitude"
#: How far a stored norm may be from 1 and still count as a unit vector.
UNIT_TOLERANCE = 1e-3
#: Cosine a re-encoded sample must reach against the stored vector.
ENCODER_AGREEMENT = 0.999
#: Stores that live in this process: written in batches of :data:`IN_PROCESS_BATCH` points
#: (a memory store appends by copying its matrix, so small batches cost O(n²) at a million).
IN_PROCESS_KINDS = ("memory", "faiss")
IN_PROCESS_BATCH = 65536
#: Points per write to a store behind a server (one request each).
SERVER_BATCH = 512
#: Ids read per ``get`` call from the source store.
READ_BATCH = 8192


@dataclass
class MagnitudeReport:
    """What writing documents' magnitudes did (a rescale or an annotation): the magnitude's
    kind (its method), how many documents got one, and the range of m(d)."""

    kind: str
    count: int
    magnitude_min: float
    magnitude_mean: float
    magnitude_max: float

    @staticmethod
    def measured(recipe: Mapping[str, Any], mags: np.ndarray) -> dict[str, Any]:
        """The report's fields for the magnitudes ``mags`` written by ``recipe``."""
        return {
            "kind": str(recipe.get("method") or recipe["kind"]),
            "count": len(mags),
            "magnitude_min": float(mags.min()),
            "magnitude_mean": float(mags.mean()),
            "magnitude_max": float(mags.max()),
        }

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class RescaleReport(MagnitudeReport):
    """What a rescale did."""

    source: str
    target: str
    encoder_check: str


# ----------------------------------------------------------------------------- recipes


def head_recipe(run_dir: str | Path) -> dict[str, Any]:
    """The magnitude recipe of a trained norm head (weights inlined as lists), torch-free."""
    from magretrieve.core.config import CONFIG_NAME, EncoderConfig
    from magretrieve.core.norm_head import load_head_weights

    run = Path(run_dir)
    cfg_path = run / CONFIG_NAME
    if not cfg_path.is_file():
        raise ConfigError(f"{cfg_path}: missing; --head must be a magretrieve run folder")
    cfg = EncoderConfig.load(run)  # the one torch-free reader of a run's configuration
    kind = cfg.norm_head
    if kind == "none":
        raise ConfigError(f"{cfg_path}: this run has no norm head (train with --norm-head)")
    if not cfg.head.frozen_encoder:
        raise ConfigError(
            f"{run}: the head was trained together with the encoder, so it expects that encoder's "
            "new vectors; rescaling vectors of the original encoder would be wrong. Re-index "
            "with this run's export instead, or train a head with --freeze-encoder"
        )
    weights = load_head_weights(run)
    return {
        "kind": "norm_head",
        "head": kind,
        "bound": float(cfg.norm_head_bound),
        "weights": {k: np.asarray(v).tolist() for k, v in weights.items()},
        "run": str(run),
    }


def magnitudes_for(recipe: Mapping[str, Any], units: np.ndarray) -> np.ndarray:
    """Magnitude ``m`` of each unit vector under a norm-head ``recipe``.

    Document priors (which may add an offset coordinate) go through
    :func:`apply_recorded_magnitude` instead.
    """
    kind = recipe.get("kind")
    if kind == "norm_head":
        from magretrieve.core.norm_head import log_magnitude_numpy

        weights = {k: np.asarray(v, dtype=np.float64) for k, v in recipe["weights"].items()}
        return np.exp(log_magnitude_numpy(units, weights, recipe["head"], float(recipe["bound"])))
    if kind == "export_norm":
        raise ConfigError(
            f"m(d) of this store comes from re-encoding each text with {recipe.get('export')}; "
            "add documents through your own pipeline, then run `magretrieve annotate "
            "--norms-from` again"
        )
    raise ConfigError(f"unknown magnitude recipe {kind!r}")


def is_prior_recipe(recipe: Mapping[str, Any] | None) -> bool:
    return recipe is not None and recipe.get("kind") == "document_prior"


def has_offset_coordinate(meta: Mapping[str, Any] | None) -> bool:
    """Does a store written by :func:`rescale_store` hold the prior's offset coordinate?"""
    recipe = (meta or {}).get(META_KEY)
    return is_prior_recipe(recipe) and prior_from_dict(recipe, "store metadata").has_offset


def recorded_prior(meta: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The document prior a store's metadata records (:meth:`DocumentPrior.describe`), or
    None when its scores carry none (no recipe, a norm head, re-encoded norms, prior ``none``).

    Both ways a prior reaches a store record it here: a rescale writes the prior's JSON under
    ``magnitude``, and so does an annotation (the multiplier then lives in a payload field)."""
    recipe = (meta or {}).get(META_KEY)
    if not is_prior_recipe(recipe):
        return None
    described = prior_from_dict(recipe, "store metadata").describe()
    return None if described["name"] == "none" else described


def store_neighbours(store: Any, with_offset: bool) -> Any:
    """``neighbours(units, k)`` over a prior-rescaled store: cosines to the stored directions.

    The stored vectors are scaled (and may carry an offset), so a wider candidate list is
    fetched and re-ranked by cosine to each stored vector's direction part.
    """

    def neighbours(units: np.ndarray, k: int) -> np.ndarray:
        out = np.full((len(units), k), np.nan)
        if store is None or store.count() == 0:
            return out[:, :0]
        q = np.hstack([units, np.zeros((len(units), 1), np.float32)]) if with_offset else units
        hits = store.search(np.asarray(q, np.float32), k * 4, with_vectors=True)
        width = k
        for row, found in enumerate(hits):
            if not found:
                continue
            vecs = np.stack([h.vector for h in found])[:, : units.shape[1]]
            cos = np.sort(unit(vecs) @ units[row])[::-1][:k]
            out[row, : len(cos)] = cos
            width = min(width, len(cos))
        return out[:, :width]

    return neighbours


def apply_recorded_magnitude(
    meta: Mapping[str, Any] | None,
    vectors: np.ndarray,
    store: Any,
    payloads: Sequence[Mapping[str, Any]] | None = None,
    ids: Sequence[str] | None = None,
) -> np.ndarray:
    """Vectors as a rescaled store expects them, when its metadata holds a recipe.

    A norm head gives ``d̂·m``; a document prior gives ``m·v`` or ``[m·v ; b]`` from the
    recorded statistics and the store's neighbours (a field prior: from each new document's
    own field in ``payloads``, named by ``ids`` in errors). The
    :class:`~magretrieve.serving.retriever.Retriever` calls this before writing new documents, so a
    rescaled store stays consistent; stores without a recipe get ``vectors`` unchanged.
    """
    recipe = (meta or {}).get(META_KEY)
    if not recipe:
        return vectors
    units = unit(vectors)
    if is_prior_recipe(recipe):
        prior = prior_from_dict(recipe, "store metadata")
        if prior.uses_fields and payloads is not None:
            from magretrieve.priors.document_fields import DocumentFields

            names = list(ids) if ids is not None else [str(i) for i in range(len(payloads))]
            prior = prior.with_fields(DocumentFields(names, payloads))
        terms = prior.terms_for_new(units, store_neighbours(store, prior.has_offset))
        return stored_vectors(terms, prior.has_offset)
    return (units * magnitudes_for(recipe, units)[:, None]).astype(np.float32)


# ----------------------------------------------------------------------------- checks


def incomplete_marker(
    source: str, recipe: Mapping[str, Any], operation: str = "rescale"
) -> dict[str, Any]:
    """What a store records while a rescale (or annotate) into it runs: operation, source and
    recipe hash."""
    canonical = json.dumps(recipe, sort_keys=True, separators=(",", ":"), default=str)
    return {
        "operation": operation,
        "source": source,
        "recipe_sha256": hashlib.sha256(canonical.encode()).hexdigest(),
    }


def check_target(dst: Any, marker: Mapping[str, Any]) -> Any:
    """Refuse a target that holds anything but an interrupted run of this same rescale.

    Returns a predicate telling which ids still need writing (all of them for a new target;
    those not stored yet when an interrupted rescale with the same source and recipe resumes).
    """
    meta = dst.read_metadata() or {}
    found = meta.get(INCOMPLETE_KEY)
    if found:
        if dict(found) != dict(marker):
            raise StoreError(
                f"{dst.location}: holds an interrupted rescale of {found.get('source')} with "
                "another source or recipe; finish it with the command that started it, or "
                "choose a new store"
            )
        logger.warning("%s: resuming an interrupted rescale", dst.location)
        have = set(dst.iter_ids())
        return lambda doc_id: doc_id not in have
    if dst.count():
        raise StoreError(f"{dst.location}: target is not empty; choose a new store")
    return lambda doc_id: True


def check_source_metadata(meta: Mapping[str, Any] | None, where: str, force: bool) -> None:
    """The source must be a cosine-normalized store that was not rescaled already."""
    if not meta:
        if force:
            logger.warning("%s: no metadata; trusting --force that it is cosine-normalized", where)
            return
        raise StoreError(
            f"{where}: no model metadata, so nothing says which encoder built it; index it "
            "with `magretrieve index` from a cosine export, or pass --force"
        )
    if meta.get(META_KEY):
        raise StoreError(
            f"{where}: already rescaled ({meta[META_KEY].get('kind')}); rescale the original store"
        )
    gamma_d = float(meta.get("gamma_d", 1.0))
    if meta.get("document_contract", "unit_norm") != "unit_norm" or gamma_d < 1.0:
        raise StoreError(
            f"{where}: built in mode {meta.get('mode')!r} (γd={gamma_d}), whose stored vectors "
            "already keep a magnitude; rescale needs a store of unit-norm (cosine) vectors"
        )


def check_unit_norm(ids: list[str], vectors: np.ndarray, where: str) -> None:
    """Refuse, naming the first id, when a stored vector is not unit-norm."""
    norms = np.linalg.norm(vectors, axis=1)
    bad = np.abs(norms - 1.0) > UNIT_TOLERANCE
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise StoreError(
            f"{where}: document {ids[i]!r} has a stored norm of {norms[i]:.4f}, not 1 "
            f"({int(bad.sum())} such vectors); rescale expects the unit-norm outputs of a cosine "
            "encoder"
        )


def check_encoder(
    run_dir: str | Path,
    ids: list[str],
    vectors: np.ndarray,
    payloads: list[dict[str, Any]],
    sample: int,
    where: str,
) -> str:
    """Re-encode up to ``sample`` stored texts with the head's encoder; directions must agree."""
    with_text = [
        i
        for i, p in enumerate(payloads)
        if not (blank(str(p.get("text", ""))) and blank(str(p.get("title", ""))))
    ]
    if not with_text:
        raise StoreError(
            f"{where}: payloads hold no title/text, so rescale cannot check that the stored "
            "vectors come from the head's encoder; pass --skip-encoder-check if you are sure"
        )
    rng = np.random.default_rng(0)
    rows = sorted(rng.choice(with_text, size=min(sample, len(with_text)), replace=False).tolist())
    from magretrieve.data.readers import Document

    require_all(  # a serving install has neither
        ["torch", "transformers"],
        what=f"{run_dir}: the encoder check (re-encoding {len(rows)} stored texts with the "
        "head's PyTorch encoder)",
        extra="train",
        hint="on a serving install pass --skip-encoder-check",
    )
    from magretrieve.train.encoder import Encoder

    encoder = Encoder.load(run_dir, device="cpu")
    encoder.norm_head = None  # the unit direction of the frozen encoder
    texts = [
        Document(
            ids[r], str(payloads[r].get("text", "")), str(payloads[r].get("title", ""))
        ).full_text
        for r in rows
    ]
    fresh = unit(encoder.embed(texts, "document"))
    agreement = np.einsum("ij,ij->i", fresh, unit(vectors[rows]))
    worst = int(np.argmin(agreement))
    if agreement[worst] < ENCODER_AGREEMENT:
        raise StoreError(
            f"{where}: document {ids[rows[worst]]!r} re-encoded with {run_dir} has cosine "
            f"{agreement[worst]:.4f} to its stored vector (< {ENCODER_AGREEMENT}): the store was "
            "built by another encoder (or other prefixes/max length); refusing to rescale"
        )
    return f"{len(rows)} stored texts re-encoded, min cosine {float(agreement.min()):.5f}"


# ----------------------------------------------------------------------------- the operation


def read_all(
    store: Any, batch: int = READ_BATCH, progress: bool = False
) -> tuple[list[str], np.ndarray, list[dict[str, Any]]]:
    """Every (id, vector, payload) of a store, ids sorted for a deterministic order.

    The vectors go straight into one preallocated float32 matrix (no per-row arrays to stack).
    """
    from tqdm.auto import tqdm

    ids = sorted(store.iter_ids())
    dim = int(store.dimension)
    vectors = np.empty((len(ids), dim), dtype=np.float32)
    pays: list[dict[str, Any]] = []
    bar = tqdm(total=len(ids), desc="reading", unit="doc", disable=not progress)
    for start in range(0, len(ids), batch):
        chunk = ids[start : start + batch]
        for row, (doc_id, rec) in enumerate(zip(chunk, store.get(chunk), strict=True), start):
            if rec is None:
                raise StoreError(f"{store.location}: id {doc_id!r} listed but not readable")
            vectors[row] = rec.vector
            pays.append(rec.payload if isinstance(rec.payload, dict) else dict(rec.payload))
        bar.update(len(chunk))
    bar.close()
    return ids, vectors, pays


def rescale_store(
    source: str | Any,
    target: str | Any,
    *,
    head: str | Path | None = None,
    prior: DocumentPrior | None = None,
    encoder_check_sample: int = 16,
    skip_encoder_check: bool = False,
    force: bool = False,
    batch_size: int | None = None,
    progress: bool = True,
    **target_options: Any,
) -> RescaleReport:
    """Rescale every stored vector of ``source`` into the new store ``target`` (see module doc).

    Exactly one of ``head`` (a run folder with a frozen-encoder norm head) or ``prior`` (a
    :class:`~magretrieve.priors.DocumentPrior`; its corpus statistics are refitted on the
    source's vectors) must be given.
    The source is only read; the target must be new or empty, or hold an interrupted
    rescale of the same source with the same recipe, which is then resumed. The target is
    marked ``incomplete`` until its last point is written (every Retriever refuses it until
    then), so a crash leaves the old state (nothing), the new one, or a reported, resumable one.
    """
    from tqdm.auto import tqdm

    from magretrieve.stores import open_store

    if (head is None) == (prior is None):
        raise ConfigError(
            "give exactly one of a norm head (--head RUN) or a prior (--corpus-prior β, "
            "--prior-file)"
        )
    if isinstance(source, str) and isinstance(target, str) and source == target:
        raise ConfigError(
            f"target {target!r} is the source; write a new store (the source stays as it is "
            "until the new one is checked)"
        )
    recipe = head_recipe(head) if head is not None else None  # fail on a bad run before reading
    src = open_store(source)
    where = src.location
    try:
        meta = src.read_metadata()
        check_source_metadata(meta, where, force)
        if prior is not None:  # a prior of another dimension is refused before any reading
            prior.check_dimension(src.dimension, prior.source)
        ids, vectors, payloads = read_all(src, progress=progress)
    finally:
        if isinstance(source, str):
            src.close()
    del src  # an opened source (a memory store holds every vector) is not needed any more
    if not ids:
        raise StoreError(f"{where}: the store is empty; nothing to rescale")
    check_unit_norm(ids, vectors, where)
    units = unit(vectors)
    if recipe is None:
        del vectors  # only the head's encoder check reads the raw vectors again
    if recipe is not None:
        check = "skipped (--skip-encoder-check)"
        if not skip_encoder_check:
            check = check_encoder(head, ids, vectors, payloads, encoder_check_sample, where)  # type: ignore[arg-type]
        mags = magnitudes_for(recipe, units)
    else:
        assert prior is not None
        prior.check_dimension(units.shape[1], prior.source)
        prior = prior_from_dict(prior.to_dict(), prior.source)  # a fresh copy: the caller's stays
        if prior.uses_fields:  # field priors read each stored document's payload
            from magretrieve.priors.document_fields import DocumentFields

            prior = prior.with_fields(DocumentFields(ids, payloads))
        from magretrieve.priors.neighbors import progress_shown

        with progress_shown(progress):
            prior.fit_corpus(units)
        terms = prior.terms(units)
        mags = terms.multiplier
        offset = prior.has_offset
        recipe = prior.to_dict()
        check = "not needed (the prior uses only the stored vectors)"
    if not np.isfinite(mags).all():
        raise StoreError("the magnitude is not finite for some documents; nothing was written")
    if recipe.get("kind") == "document_prior":
        new = stored_vectors(terms, offset)
        if not np.isfinite(new).all():
            raise StoreError("the prior is not finite for some documents; nothing was written")
    else:
        offset = False
        new = (units * mags[:, None]).astype(np.float32)

    dim = int(new.shape[1])
    dst = open_store(target, dimension=dim, **target_options)
    try:
        if int(dst.dimension) != dim:
            raise StoreError(
                f"{dst.location}: target has dimension {dst.dimension}; this prior stores "
                f"{dim} ({'the vector and one offset coordinate' if offset else 'the vector'})"
            )
        marker = incomplete_marker(where, recipe)
        todo = check_target(dst, marker)
        new_meta = dict(meta or {})
        new_meta["document_contract"] = "magnitude_keeping"
        new_meta[META_KEY] = recipe
        new_meta["rescaled_from"] = where
        # Marked incomplete first: a crash from here on leaves a target every Retriever
        # refuses ("incomplete"), and re-running this command resumes it.
        dst.write_metadata({**new_meta, INCOMPLETE_KEY: marker})
        dst.persist()
        if batch_size is None:  # in-process stores take large batches, servers moderate ones
            in_process = getattr(dst, "kind", "") in IN_PROCESS_KINDS
            batch_size = IN_PROCESS_BATCH if in_process else SERVER_BATCH
        bar = tqdm(total=len(ids), desc="rescaling", unit="doc", disable=not progress)
        for start in range(0, len(ids), batch_size):
            end = start + batch_size
            chunk = [i for i in range(start, min(end, len(ids))) if todo(ids[i])]
            if chunk:
                dst.add([ids[i] for i in chunk], new[chunk], [payloads[i] for i in chunk])
            bar.update(len(ids[start:end]))
        bar.close()
        dst.optimize()
        dst.persist()
        if dst.count() != len(ids):
            raise StoreError(
                f"{dst.location}: holds {dst.count()} points after the rescale, expected "
                f"{len(ids)}; left marked incomplete"
            )
        dst.write_metadata(new_meta)  # done: the marker goes last
        dst.persist()
        target_location = dst.location
    finally:
        if isinstance(target, str):
            dst.close()
    return RescaleReport(
        **MagnitudeReport.measured(recipe, mags),
        source=where,
        target=target_location,
        encoder_check=check,
    )
