"""Give the documents of a cosine-built store a magnitude without re-encoding any text.

A store built with a cosine export holds unit vectors ``d̂``. Both magnitudes of issue 6 are
functions of ``d̂`` alone, so they can be applied to what is stored:

* a **frozen-encoder norm head** (``magretrieve train --norm-head linear --freeze-encoder``):
  ``d̂ · exp(g(d̂))`` with the head's weights (read torch-free from ``norm_head.safetensors``);
* the **corpus prior** (:mod:`magretrieve.corpus_prior`): ``d̂ · exp(−β·z)``, ``z`` the
  standardized hub score computed over the stored vectors themselves.

:func:`rescale_store` reads every point (id, vector, payload) of the source store, refuses
vectors that are not unit-norm (or, for a head, not the outputs of the head's encoder,
checked on a small sample of stored texts), and writes ``d̂·m`` with the same ids and
payloads into a new target store (Qdrant: a new Dot collection; FAISS: an index rebuilt from
the stored vectors). The recipe is recorded in the target's metadata under ``magnitude``, so
documents added later through a :class:`~magretrieve.retriever.Retriever` get the same
treatment (:func:`apply_recorded_magnitude`). Queries stay unit-norm, as the cosine export
already makes them, so the score becomes ``cos(q, d)·m(d)``.

Torch is imported only for the encoder check of a head.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.corpus_prior import CorpusPrior, hub_scores, unit
from magretrieve.errors import ConfigError, StoreError

logger = logging.getLogger(__name__)

#: Store-metadata key holding the magnitude recipe of a rescaled store.
META_KEY = "magnitude"
#: How far a stored norm may be from 1 and still count as a unit vector.
UNIT_TOLERANCE = 1e-3
#: Cosine a re-encoded sample must reach against the stored vector.
ENCODER_AGREEMENT = 0.999


@dataclass
class RescaleReport:
    """What a rescale did."""

    source: str
    target: str
    kind: str
    count: int
    magnitude_min: float
    magnitude_max: float
    magnitude_mean: float
    encoder_check: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# ----------------------------------------------------------------------------- recipes


def head_recipe(run_dir: str | Path) -> dict[str, Any]:
    """The magnitude recipe of a trained norm head (weights inlined as lists), torch-free."""
    from magretrieve.config import CONFIG_NAME
    from magretrieve.heads import load_head_weights

    run = Path(run_dir)
    cfg_path = run / CONFIG_NAME
    if not cfg_path.is_file():
        raise ConfigError(f"{cfg_path}: missing; --head must be a magretrieve run folder")
    cfg = json.loads(cfg_path.read_text())
    kind = cfg.get("norm_head", "none")
    if kind == "none":
        raise ConfigError(f"{cfg_path}: this run has no norm head (train with --norm-head)")
    if not cfg.get("extra", {}).get("frozen_encoder"):
        raise ConfigError(
            f"{run}: the head was trained together with the encoder, so it expects that encoder's "
            "new vectors; rescaling vectors of the original encoder would be wrong. Re-index "
            "with this run's export instead, or train a head with --freeze-encoder"
        )
    weights = load_head_weights(run)
    return {
        "kind": "norm_head",
        "head": kind,
        "bound": float(cfg.get("norm_head_bound", 0.0)),
        "weights": {k: np.asarray(v).tolist() for k, v in weights.items()},
        "run": str(run),
    }


def magnitudes_for(
    recipe: Mapping[str, Any], units: np.ndarray, store: Any | None = None
) -> np.ndarray:
    """Magnitude ``m`` of each unit vector under ``recipe`` (a head or a fitted corpus prior).

    For a corpus prior the hub score of a new vector is its mean cosine to its ``k`` nearest
    documents in ``store`` (re-ranked by cosine among a wider candidate list, since the stored
    vectors are already scaled).
    """
    kind = recipe.get("kind")
    if kind == "norm_head":
        from magretrieve.heads import log_magnitude_numpy

        weights = {k: np.asarray(v, dtype=np.float64) for k, v in recipe["weights"].items()}
        return np.exp(log_magnitude_numpy(units, weights, recipe["head"], float(recipe["bound"])))
    if kind == "corpus_prior":
        prior = CorpusPrior.from_dict(recipe)
        if store is None or store.count() == 0:
            return np.ones(len(units))
        hits = store.search(units, prior.k * 4, with_vectors=True)
        hubs = np.zeros(len(units))
        for row, found in enumerate(hits):
            if not found:
                continue
            cos = unit(np.stack([h.vector for h in found])) @ units[row]
            hubs[row] = np.sort(cos)[::-1][: prior.k].mean()
        return prior.magnitudes(prior.z_scores(hubs))
    raise ConfigError(f"unknown magnitude recipe {kind!r}")


def apply_recorded_magnitude(
    meta: Mapping[str, Any] | None, vectors: np.ndarray, store: Any
) -> np.ndarray:
    """Vectors as a rescaled store expects them: ``d̂·m`` when its metadata holds a recipe.

    The :class:`~magretrieve.retriever.Retriever` calls this before writing new documents,
    so a rescaled store stays consistent; stores without a recipe get ``vectors`` unchanged.
    """
    recipe = (meta or {}).get(META_KEY)
    if not recipe:
        return vectors
    units = unit(vectors)
    return (units * magnitudes_for(recipe, units, store)[:, None]).astype(np.float32)


# ----------------------------------------------------------------------------- checks


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
        if str(p.get("text", "")).strip() or str(p.get("title", "")).strip()
    ]
    if not with_text:
        raise StoreError(
            f"{where}: payloads hold no title/text, so rescale cannot check that the stored "
            "vectors come from the head's encoder; pass --skip-encoder-check if you are sure"
        )
    rng = np.random.default_rng(0)
    rows = sorted(rng.choice(with_text, size=min(sample, len(with_text)), replace=False).tolist())
    from magretrieve.data import Document

    try:
        from magretrieve.encoder import Encoder
    except ImportError as exc:  # a serving install: no torch / transformers
        raise ConfigError(
            f"{run_dir}: the encoder check re-encodes {len(rows)} stored texts with the head's "
            f"PyTorch encoder, which needs {exc.name or 'torch'} (pip install "
            "'magretrieve[train]'); on a serving install pass --skip-encoder-check"
        ) from None

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


def read_all(store: Any, batch: int = 1024) -> tuple[list[str], np.ndarray, list[dict[str, Any]]]:
    """Every (id, vector, payload) of a store, ids sorted for a deterministic order."""
    ids = sorted(store.iter_ids())
    vecs, pays = [], []
    for start in range(0, len(ids), batch):
        chunk = ids[start : start + batch]
        for doc_id, rec in zip(chunk, store.get(chunk), strict=True):
            if rec is None:
                raise StoreError(f"{store.location}: id {doc_id!r} listed but not readable")
            vecs.append(np.asarray(rec.vector, dtype=np.float32))
            pays.append(dict(rec.payload))
    dim = int(store.dimension)
    return ids, (np.stack(vecs) if vecs else np.zeros((0, dim), np.float32)), pays


def rescale_store(
    source: str | Any,
    target: str | Any,
    *,
    head: str | Path | None = None,
    prior: CorpusPrior | None = None,
    encoder_check_sample: int = 16,
    skip_encoder_check: bool = False,
    force: bool = False,
    batch_size: int = 512,
    progress: bool = True,
    **target_options: Any,
) -> RescaleReport:
    """Rescale every stored vector of ``source`` into the new store ``target`` (see module doc).

    Exactly one of ``head`` (a run folder with a frozen-encoder norm head) or ``prior`` (a
    :class:`CorpusPrior`; its mean/std are refitted on the source's vectors) must be given.
    The source is only read; the target must be new or empty.
    """
    from tqdm.auto import tqdm

    from magretrieve.adapters import open_store

    if (head is None) == (prior is None):
        raise ConfigError(
            "give exactly one of a norm head (--head RUN) or a corpus prior (--corpus-prior β)"
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
        ids, vectors, payloads = read_all(src)
    finally:
        if isinstance(source, str):
            src.close()
    if not ids:
        raise StoreError(f"{where}: the store is empty; nothing to rescale")
    check_unit_norm(ids, vectors, where)
    units = unit(vectors)
    if recipe is not None:
        check = "skipped (--skip-encoder-check)"
        if not skip_encoder_check:
            check = check_encoder(head, ids, vectors, payloads, encoder_check_sample, where)  # type: ignore[arg-type]
        mags = magnitudes_for(recipe, units)
    else:
        assert prior is not None
        prior = CorpusPrior(**{**prior.to_dict()})
        prior.validate()
        h = hub_scores(units, prior.k)
        prior.mean, prior.std = float(h.mean()), float(h.std()) or 1.0
        mags = prior.magnitudes(prior.z_scores(h))
        recipe = prior.to_dict()
        check = "not needed (the prior uses only the stored vectors)"
    if not np.isfinite(mags).all():
        raise StoreError("the magnitude is not finite for some documents; nothing was written")
    new = (units * mags[:, None]).astype(np.float32)

    dst = open_store(target, dimension=int(units.shape[1]), **target_options)
    try:
        if dst.count():
            raise StoreError(f"{dst.location}: target is not empty; choose a new store")
        new_meta = dict(meta or {})
        new_meta["document_contract"] = "magnitude_keeping"
        new_meta[META_KEY] = recipe
        new_meta["rescaled_from"] = where
        dst.write_metadata(new_meta)
        bar = tqdm(total=len(ids), desc="rescaling", unit="doc", disable=not progress)
        for start in range(0, len(ids), batch_size):
            end = start + batch_size
            dst.add(ids[start:end], new[start:end], payloads[start:end])
            bar.update(len(ids[start:end]))
        bar.close()
        dst.optimize()
        dst.persist()
        target_location = dst.location
    finally:
        if isinstance(target, str):
            dst.close()
    return RescaleReport(
        source=where,
        target=target_location,
        kind=str(recipe["kind"]),
        count=len(ids),
        magnitude_min=float(mags.min()),
        magnitude_max=float(mags.max()),
        magnitude_mean=float(mags.mean()),
        encoder_check=check,
    )
