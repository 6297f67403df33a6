"""Which side to normalize: the ΔCV probe (paper v1) and a Fisher condition number κ (experimental).

ΔCV
    Two short probe trainings from the same starting weights, one under ``dnorm`` and one
    under ``dot`` (same batches, same seed, :func:`magretrieve.train.trainer.train` on deep copies).
    ΔCV = CV(‖q‖) after the dnorm probe / CV(‖q‖) after the dot probe, with ‖q‖ the raw query
    norms of a fixed probe set. The paper reports RetroMAE 6.1× (dnorm won) and Contriever
    1.3× (qnorm won); we split at their geometric mean, √(1.3·6.1) ≈ 2.82, the midpoint of
    the only two calibration points on the log scale where ratios live.

Fisher κ (experimental; the paper's v2 procedure is not published, this is our definition)
    At the starting weights, for mode m ∈ {qnorm, dnorm}: per-example gradients g_i of the
    in-batch InfoNCE loss ℓ_i (row i of :class:`magretrieve.train.losses.InfoNCE`, same
    scale) over N examples from ``n_batches`` batches, restricted to the parameters of the
    last transformer layer and count-sketched to ``sketch_dim`` coordinates (a fixed random
    projection: each coordinate goes to one bucket with a random sign, same sketch for both
    modes). The empirical Fisher F = GᵀG/N; κ = λ₁/λ_k over its top-k eigenvalues
    (k ≤ rank). The side whose Fisher is better conditioned (smaller κ) is recommended.
"""

from __future__ import annotations

import copy
import math
import random
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from magretrieve.core import metrics, similarity
from magretrieve.core.errors import ConfigError, DataError
from magretrieve.data.readers import TrainingPair
from magretrieve.train import torch_similarity

#: ΔCV at or above this → dnorm; below → qnorm (geometric mean of the paper's 1.3× and 6.1×).
DELTA_CV_THRESHOLD = math.sqrt(1.3 * 6.1)


@dataclass
class DeltaCV:
    """Outcome of the two probe trainings."""

    delta_cv: float
    cv_query_norm_start: float
    cv_query_norm_dnorm: float
    cv_query_norm_dot: float
    mean_query_norm_start: float
    mean_query_norm_dnorm: float
    mean_query_norm_dot: float
    steps: int
    batch_size: int
    lr: float
    max_document_length: int
    probe_queries: int
    threshold: float = DELTA_CV_THRESHOLD
    prediction: str = ""
    final_loss: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FisherKappa:
    """κ of the empirical Fisher under qnorm and dnorm at the starting weights."""

    kappa: dict[str, float]
    top_eigenvalues: dict[str, list[float]]
    n_examples: int
    n_parameters: int
    sketch_dim: int
    top_k: int
    parameters: str
    prediction: str = ""
    experimental: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def with_mode(encoder: Any, mode: str) -> Any:
    """A deep copy of ``encoder`` that scores (and trains) under fixed ``mode``."""
    clone = copy.deepcopy(encoder)
    sim = similarity.resolve(mode)
    clone.config.mode, clone.config.gamma_q, clone.config.gamma_d = (
        sim.mode,
        sim.gamma_q,
        sim.gamma_d,
    )
    return clone


def _query_norms(encoder: Any, queries: Sequence[str], batch_size: int) -> np.ndarray:
    return np.linalg.norm(encoder.embed(list(queries), "query", batch_size=batch_size), axis=1)


def probe_queries(pairs: Sequence[TrainingPair], limit: int, seed: int) -> list[str]:
    """A fixed sample of distinct training queries whose norms the probes compare."""
    queries = list(dict.fromkeys(p.query for p in pairs))
    random.Random(seed).shuffle(queries)
    return queries[:limit]


def delta_cv(
    encoder: Any,
    pairs: Sequence[TrainingPair],
    *,
    steps: int = 100,
    batch_size: int = 16,
    lr: float = 2e-5,
    scale: float = 20.0,
    seed: int = 42,
    max_document_length: int | None = 128,
    n_probe_queries: int = 512,
    progress: bool = True,
) -> DeltaCV:
    """Run the dnorm and dot probe trainings and return ΔCV with its parts.

    ``encoder`` itself is not modified. ``max_document_length`` caps document tokens during
    the probes only (CPU budget); the query side is untouched.
    """
    from magretrieve.train.trainer import TrainConfig, length_bucketed_batches, train

    if steps < 1:
        raise ConfigError(f"probe steps must be at least 1, got {steps}")
    pairs = list(pairs)
    if len(pairs) < 2:
        raise DataError(f"probe trainings need at least 2 training pairs, got {len(pairs)}")
    queries = probe_queries(pairs, n_probe_queries, seed)
    start_norms = _query_norms(encoder, queries, 64)
    batches = max(1, len(length_bucketed_batches([1] * len(pairs), batch_size, random.Random(0))))
    results: dict[str, tuple[np.ndarray, float]] = {}
    for mode in ("dnorm", "dot"):
        probe = with_mode(encoder, mode)
        if max_document_length is not None:
            probe.config.max_document_length = min(
                probe.config.max_document_length, max_document_length
            )
        cfg = TrainConfig(
            epochs=math.ceil(steps / batches),
            batch_size=batch_size,
            lr=lr,
            scale=scale,
            seed=seed,
            max_steps=steps,
            log_every=max(1, steps // 20),
        )
        log = train(probe, pairs, cfg, progress=progress).log
        loss = log["steps"][-1]["loss"] if log["steps"] else float("nan")
        results[mode] = (_query_norms(probe, queries, 64), loss)
        del probe
    cv_start = metrics.coefficient_of_variation(start_norms)
    cv_dn = metrics.coefficient_of_variation(results["dnorm"][0])
    cv_dot = metrics.coefficient_of_variation(results["dot"][0])
    ratio = cv_dn / cv_dot if cv_dot > 0 else float("nan")
    return DeltaCV(
        delta_cv=ratio,
        cv_query_norm_start=cv_start,
        cv_query_norm_dnorm=cv_dn,
        cv_query_norm_dot=cv_dot,
        mean_query_norm_start=float(start_norms.mean()),
        mean_query_norm_dnorm=float(results["dnorm"][0].mean()),
        mean_query_norm_dot=float(results["dot"][0].mean()),
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        max_document_length=min(encoder.config.max_document_length, max_document_length or 10**9),
        probe_queries=len(queries),
        prediction=predict_from_delta_cv(ratio),
        final_loss={m: results[m][1] for m in results},
    )


def predict_from_delta_cv(ratio: float, threshold: float = DELTA_CV_THRESHOLD) -> str:
    """``dnorm`` when ΔCV ≥ threshold, ``qnorm`` below it, ``""`` when ΔCV is undefined."""
    if not math.isfinite(ratio):
        return ""
    return "dnorm" if ratio >= threshold else "qnorm"


# ----------------------------------------------------------------------------- Fisher κ


def fisher_condition(gradients: np.ndarray, top_k: int = 20) -> tuple[float, np.ndarray]:
    """κ = λ₁/λ_k of F = GᵀG/N over its top-k eigenvalues (k capped at the rank), and those λ.

    ``gradients`` is G (N examples × P coordinates). The non-zero spectrum of GᵀG/N equals
    that of the N × N Gram matrix GGᵀ/N, which is what is decomposed (cheap when P ≫ N).
    """
    g = np.asarray(gradients, dtype=np.float64)
    if g.ndim != 2 or g.shape[0] < 2:
        raise ConfigError(f"need a 2-D gradient matrix with at least 2 rows, got shape {g.shape}")
    n = g.shape[0]
    gram = g @ g.T / n if g.shape[1] >= n else g.T @ g / n
    eig = np.sort(np.linalg.eigvalsh(gram))[::-1]
    eig = eig[eig > eig[0] * 1e-10] if eig[0] > 0 else eig[:0]
    if eig.size == 0:
        return float("nan"), eig
    top = eig[: max(1, min(top_k, eig.size))]
    return float(top[0] / top[-1]), top


def last_layer_parameters(encoder: Any) -> list[tuple[str, Any]]:
    """Parameters of the transformer's last layer (``….layer.N.`` / ``layers.N`` / ``h.N``).

    Falls back to the last four parameter tensors of a model without numbered layers.
    """
    named = [(n, p) for n, p in encoder.transformer.named_parameters()]
    pattern = re.compile(r"(?:^|\.)(?:layer|layers|h|block|blocks)\.(\d+)\.")
    indices = [int(m.group(1)) for n, _ in named if (m := pattern.search(n))]
    if not indices:
        return named[-4:]
    last = max(indices)
    return [(n, p) for n, p in named if (m := pattern.search(n)) and int(m.group(1)) == last]


class CountSketch:
    """A fixed random projection of P coordinates to ``dim``: bucket h(i), sign s(i)."""

    def __init__(self, n_params: int, dim: int, seed: int = 0) -> None:
        import torch

        gen = torch.Generator().manual_seed(seed)
        self.dim = dim
        self.bucket = torch.randint(0, dim, (n_params,), generator=gen)
        self.sign = torch.randint(0, 2, (n_params,), generator=gen).float() * 2 - 1

    def __call__(self, flat: Any) -> Any:
        import torch

        out = torch.zeros(self.dim, dtype=flat.dtype)
        return out.index_add_(0, self.bucket, flat * self.sign)


def per_example_gradients(
    encoder: Any,
    batches: Sequence[Sequence[TrainingPair]],
    mode: str,
    params: Sequence[tuple[str, Any]],
    sketch: CountSketch | None,
    scale: float,
    progress: bool | str = False,
) -> np.ndarray:
    """G: one (sketched) gradient row per query of the in-batch InfoNCE loss under ``mode``."""
    import torch
    from tqdm.auto import tqdm

    from magretrieve.train.losses import InfoNCE, text_keys

    info_nce = InfoNCE(scale, gather=False)

    sim = similarity.resolve(mode)
    names = {n for n, _ in params}
    for name, p in encoder.transformer.named_parameters():
        p.requires_grad_(name in names)
    tensors = [p for _, p in params]
    rows = []
    encoder.eval()  # no dropout: the Fisher of the deterministic model at these weights
    bar = tqdm(
        total=sum(len(b) for b in batches), desc=progress or "", disable=not progress, leave=False
    )
    for batch in batches:
        positives = [p.positive for p in batch]
        q_raw = encoder(**encoder.tokenize([p.query for p in batch], "query"), side="query")
        d_raw = encoder(**encoder.tokenize(positives, "document"), side="document")
        q = torch_similarity.partial_normalize_torch(q_raw, sim.gamma_q)
        d = torch_similarity.partial_normalize_torch(d_raw, sim.gamma_d)
        keys = text_keys(positives)
        losses = info_nce(q, d, positive_keys=keys, column_keys=keys, reduction="none")
        for i in range(len(batch)):
            grads = torch.autograd.grad(
                losses[i], tensors, retain_graph=i < len(batch) - 1, allow_unused=True
            )
            flat = torch.cat(
                [
                    (g if g is not None else torch.zeros_like(t)).reshape(-1)
                    for g, t in zip(grads, tensors, strict=True)
                ]
            )
            flat = flat.detach().float().cpu()
            rows.append((sketch(flat) if sketch is not None else flat).numpy())
            bar.update(1)
    bar.close()
    return np.stack(rows)


def fisher_kappa(
    encoder: Any,
    pairs: Sequence[TrainingPair],
    *,
    n_batches: int = 8,
    batch_size: int = 16,
    scale: float = 20.0,
    top_k: int = 20,
    sketch_dim: int = 1024,
    seed: int = 42,
    max_document_length: int | None = 128,
    progress: bool = True,
) -> FisherKappa:
    """κ of the empirical InfoNCE Fisher under qnorm and under dnorm (same examples, same sketch)."""
    from magretrieve.train.trainer import length_bucketed_batches

    pairs = list(pairs)
    if len(pairs) < 2:
        raise DataError(f"the Fisher estimate needs at least 2 training pairs, got {len(pairs)}")
    if n_batches < 1:
        raise ConfigError(f"fisher batches must be at least 1, got {n_batches}")
    work = with_mode(encoder, "dot")  # a private copy whose requires_grad flags we may change
    if max_document_length is not None:
        work.config.max_document_length = min(work.config.max_document_length, max_document_length)
    lengths = work.token_lengths([p.positive for p in pairs], "document")
    chosen = length_bucketed_batches(lengths, batch_size, random.Random(seed))[:n_batches]
    batches = [[pairs[i] for i in b] for b in chosen]
    params = last_layer_parameters(work)
    n_params = sum(p.numel() for _, p in params)
    sketch = CountSketch(n_params, sketch_dim, seed) if n_params > sketch_dim else None
    kappa: dict[str, float] = {}
    eigen: dict[str, list[float]] = {}
    n_examples = 0
    for mode in ("qnorm", "dnorm"):
        g = per_example_gradients(
            work, batches, mode, params, sketch, scale, progress=progress and f"Fisher ({mode})"
        )
        n_examples = g.shape[0]
        kappa[mode], top = fisher_condition(g, top_k)
        eigen[mode] = [float(v) for v in top]
    del work
    prediction = ""
    if all(math.isfinite(v) for v in kappa.values()):
        prediction = "qnorm" if kappa["qnorm"] <= kappa["dnorm"] else "dnorm"
    first = params[0][0] if params else ""
    return FisherKappa(
        kappa=kappa,
        top_eigenvalues=eigen,
        n_examples=n_examples,
        n_parameters=n_params,
        sketch_dim=sketch.dim if sketch is not None else n_params,
        top_k=top_k,
        parameters=f"{len(params)} tensors of the last layer (first: {first})",
        prediction=prediction,
    )
