"""Contrastive training (InfoNCE) under any member of the similarity family.

Logits are ``scale · s(q_i, d_j)`` over in-batch negatives (plus hard negatives when the
pairs carry them); the target is each query's own positive. Cosine cannot learn magnitude
(normalization removes the radial gradient); under qnorm/dot a document that is positive for
many queries is pushed outward, so its norm becomes a relevance prior.

``TrainConfig.precision="bf16"`` runs the forward passes under bf16 autocast (about 2x the
matmul throughput on CPUs with AMX / avx512_bf16); float32 stays the default because it is
exactly reproducible run to run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from magretrieve.data import RetrievalDataset, TrainingPair
from magretrieve.encoder import Encoder
from magretrieve.errors import ConfigError, DataError, SymmetryError

logger = logging.getLogger(__name__)

TASKS = ("retrieval", "symmetric")
PRECISIONS = ("fp32", "bf16")
LOG_NAME = "train_log.json"


@dataclass
class TrainConfig:
    """Training settings; defaults follow the paper where it states them (scale 20, AdamW, clip 1)."""

    epochs: int = 3
    batch_size: int = 32
    lr: float = 2e-5
    #: Learnable γ gets its own rate: at the encoder's rate the paper's γ stayed at 0.5.
    gamma_lr: float = 5e-2
    scale: float = 20.0
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 42
    #: Hard negatives used per pair (taken from ``TrainingPair.negatives``).
    hard_negatives: int = 0
    task: str = "retrieval"
    force: bool = False
    max_steps: int | None = None
    #: Log a step record every this many steps (loss, γ, norms, gradient norm).
    log_every: int = 1
    #: Validate every this many steps (None: at the end of each epoch).
    eval_every: int | None = None
    #: Train only these parameters' name prefixes (e.g. a norm head); None trains everything.
    trainable: list[str] | None = None
    #: Learning rate of a document norm head (magretrieve.heads): a zero-initialized head at
    #: the encoder's rate barely moves.
    head_lr: float = 1e-3
    #: Compute precision of the forward passes: "fp32" (default, exactly reproducible) or
    #: "bf16" (autocast). CPUs with bf16 matrix units (Intel AMX, avx512_bf16 on recent Xeons)
    #: run bf16 matmuls at roughly twice the fp32 throughput or more. Master weights, the
    #: optimizer, the side normalization and the loss stay float32 either way.
    precision: str = "fp32"

    def validate(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"unknown task {self.task!r}; choose one of {', '.join(TASKS)}")
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"unknown precision {self.precision!r}; choose one of {', '.join(PRECISIONS)}"
            )
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.batch_size < 2:
            raise ConfigError("batch_size must be at least 2 (in-batch negatives)")
        for name in ("lr", "gamma_lr", "head_lr", "scale"):
            if not (getattr(self, name) > 0 and math.isfinite(getattr(self, name))):
                raise ConfigError(f"{name} must be a positive number, got {getattr(self, name)}")
        if not 0 <= self.warmup_ratio < 1:
            raise ConfigError(f"warmup_ratio must lie in [0, 1), got {self.warmup_ratio}")


@dataclass
class TrainResult:
    """What a training run produced: its log and, when validated, the best step."""

    log: dict[str, Any]
    best_step: int | None = None
    best_score: float | None = None
    out_dir: Path | None = None
    evaluations: list[dict[str, Any]] = field(default_factory=list)


def check_task(mode: str, task: str, force: bool) -> None:
    """Refuse a one-sided (or drifting, learnable) mode on a symmetric task unless forced."""
    if task != "symmetric" or mode in ("cosine", "dot"):
        return
    message = (
        f"mode {mode!r} normalizes the two sides differently, so s(a, b) != s(b, a); on symmetric tasks "
        "(STS, deduplication, clustering) this collapses quality (paper: STS-B Spearman .788 -> .41). Use "
        "--mode cosine or dot, or pass --force to train anyway. `magretrieve diagnose` (symmetry check) "
        "and `magretrieve eval --data pairs.jsonl` show the asymmetry on your data."
    )
    if not force:
        raise SymmetryError(message)
    logger.warning("--force: %s", message)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def info_nce_loss(
    q: torch.Tensor,
    d: torch.Tensor,
    scale: float,
    exclude: torch.Tensor | None = None,
    symmetric: bool = False,
) -> torch.Tensor:
    """InfoNCE over side-normalized vectors: query i's positive is column i of ``d``.

    ``d`` holds the B positives first, then any hard negatives. ``exclude`` (B × N bool)
    masks columns that duplicate a query's positive, so a repeated document is not its
    own negative. ``symmetric`` adds the document→query direction (for symmetric tasks).
    """
    logits = scale * (q @ d.T)
    if exclude is not None:
        logits = logits.masked_fill(exclude, float("-inf"))
    target = torch.arange(q.shape[0], device=q.device)
    loss = torch.nn.functional.cross_entropy(logits, target)
    if symmetric:
        back = logits[:, : q.shape[0]].T
        loss = (loss + torch.nn.functional.cross_entropy(back, target)) / 2
    return loss


def duplicate_mask(
    positives: Sequence[str], columns: Sequence[str], device: torch.device
) -> torch.Tensor:
    """True where column j holds the same text as row i's positive (j != i): not a real negative."""
    mask = torch.zeros(len(positives), len(columns), dtype=torch.bool)
    where: dict[str, list[int]] = {}
    for j, text in enumerate(columns):
        where.setdefault(text, []).append(j)
    for i, text in enumerate(positives):
        for j in where.get(text, []):
            if j != i:
                mask[i, j] = True
    return mask.to(device)


def length_bucketed_batches(
    lengths: Sequence[int], batch_size: int, rng: random.Random, pool: int = 20
) -> list[list[int]]:
    """Shuffle, sort each pool of ``pool`` batches by length, cut batches, shuffle their order.

    Batches stay random in content but hold texts of similar length, so padding wastes little.
    """
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches: list[list[int]] = []
    span = batch_size * pool
    for start in range(0, len(order), span):
        chunk = sorted(order[start : start + span], key=lambda i: lengths[i])
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    batches = [b for b in batches if len(b) >= 2]  # a batch of one has no negatives
    rng.shuffle(batches)
    return batches


def _param_groups(encoder: Encoder, cfg: TrainConfig) -> list[dict[str, Any]]:
    decay, no_decay, gammas, head = [], [], [], []
    for name, param in encoder.named_parameters():
        if cfg.trainable is not None and not any(name.startswith(p) for p in cfg.trainable):
            param.requires_grad_(False)
            continue
        if not param.requires_grad:
            continue
        if name == "gamma_logits":
            gammas.append(param)
        elif name.startswith("norm_head."):
            head.append(param)
        elif param.ndim < 2 or "LayerNorm" in name or name.endswith("bias"):
            no_decay.append(param)
        else:
            decay.append(param)
    groups = [
        {"params": decay, "lr": cfg.lr, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "lr": cfg.lr, "weight_decay": 0.0},
        {"params": gammas, "lr": cfg.gamma_lr, "weight_decay": 0.0},
        {"params": head, "lr": cfg.head_lr, "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def _train_mode(encoder: Encoder, cfg: TrainConfig) -> None:
    """Training mode, but a frozen transformer stays in eval mode (no dropout on its outputs)."""
    encoder.train()
    if cfg.trainable is not None and not any(p.startswith("transformer") for p in cfg.trainable):
        encoder.transformer.eval()


def _gamma_values(encoder: Encoder) -> tuple[float, float]:
    gq, gd = encoder.gammas()  # detached: float() of a tensor needing grad warns
    return float(torch.as_tensor(gq).detach()), float(torch.as_tensor(gd).detach())


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    """The forward-pass context for ``precision``: bf16 autocast, or nothing for fp32.

    Under bf16 autocast matmuls run in bfloat16 (on AMX / avx512_bf16 CPUs about twice as fast
    as float32) while the parameters stay float32, so the optimizer updates full-precision
    master weights; autocast keeps reductions such as layer norm and softmax in float32.
    """
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train(
    encoder: Encoder,
    pairs: Sequence[TrainingPair],
    config: TrainConfig | None = None,
    *,
    validation: RetrievalDataset | None = None,
    report: Sequence[RetrievalDataset] = (),
    out_dir: str | Path | None = None,
    progress: bool = True,
) -> TrainResult:
    """Fine-tune ``encoder`` in place with InfoNCE under its own mode.

    ``validation`` (if given) is scored with NDCG@10 at each evaluation point and the best
    weights are kept; ``report`` sets are only evaluated and logged (pass a test set here,
    never as ``validation``). With ``out_dir`` the final model and ``train_log.json`` are saved.
    """
    from tqdm.auto import tqdm
    from transformers import get_cosine_schedule_with_warmup

    from magretrieve.evaluate import evaluate_retrieval

    cfg = config or TrainConfig()
    cfg.validate()
    check_task(encoder.config.mode, cfg.task, cfg.force)
    pairs = list(pairs)
    if len(pairs) < 2:
        raise DataError(f"training needs at least 2 pairs with a positive, got {len(pairs)}")
    seed_everything(cfg.seed)
    rng = random.Random(cfg.seed)
    device = encoder.device

    doc_lengths = encoder.token_lengths([p.positive for p in pairs], "document")
    batches_per_epoch = len(length_bucketed_batches(doc_lengths, cfg.batch_size, random.Random(0)))
    total_steps = cfg.epochs * batches_per_epoch
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)
    groups = _param_groups(encoder, cfg)
    if not groups:
        raise ConfigError(f"no trainable parameters (trainable={cfg.trainable})")
    optimizer = torch.optim.AdamW(groups, betas=(0.9, 0.98))
    scheduler = get_cosine_schedule_with_warmup(
        optimizer, int(cfg.warmup_ratio * total_steps), total_steps
    )
    trainable_params = [p for g in groups for p in g["params"]]

    log: dict[str, Any] = {
        "config": asdict(cfg),
        "precision": cfg.precision,
        "encoder": encoder.config.to_dict(),
        "n_pairs": len(pairs),
        "total_steps": total_steps,
        "steps": [],
        "evaluations": [],
    }
    result = TrainResult(log=log, out_dir=Path(out_dir) if out_dir else None)
    best_state: dict[str, torch.Tensor] | None = None

    def evaluate(step: int) -> None:
        nonlocal best_state
        encoder.eval()
        entry: dict[str, Any] = {"step": step}
        if validation is not None:
            val = evaluate_retrieval(encoder, validation, progress=progress)
            entry["validation"] = val.to_dict()
            if result.best_score is None or val.ndcg_at_10 > result.best_score:
                result.best_score, result.best_step = val.ndcg_at_10, step
                best_state = {
                    k: v.detach().to("cpu", copy=True) for k, v in encoder.state_dict().items()
                }
        for data in report:
            entry[f"{data.name}:{data.split}"] = evaluate_retrieval(
                encoder, data, progress=progress
            ).to_dict()
        log["evaluations"].append(entry)
        _train_mode(encoder, cfg)

    started = time.perf_counter()
    step = 0
    _train_mode(encoder, cfg)
    bar = tqdm(
        total=total_steps,
        desc=f"training ({encoder.config.mode})",
        unit="step",
        disable=not progress,
    )
    for epoch in range(cfg.epochs):
        for batch in length_bucketed_batches(doc_lengths, cfg.batch_size, rng):
            if step >= total_steps:
                break
            chosen = [pairs[i] for i in batch]
            positives = [p.positive for p in chosen]
            negatives = [n for p in chosen for n in p.negatives[: cfg.hard_negatives]]
            columns = positives + negatives
            q_tokens = encoder.tokenize([p.query for p in chosen], "query")
            d_tokens = encoder.tokenize(columns, "document")
            with autocast(device, cfg.precision):
                q_raw = encoder(**q_tokens, side="query")
                d_raw = encoder(**d_tokens, side="document")
            # Normalization and loss in float32 whatever the forward precision: x/‖x‖^γ and a
            # softmax over scale·logits lose too much in bfloat16's 8-bit mantissa.
            q_raw, d_raw = q_raw.float(), d_raw.float()
            q = encoder.side_vectors(q_raw, "query")
            d = encoder.side_vectors(d_raw, "document")
            exclude = duplicate_mask(positives, columns, device)
            loss = info_nce_loss(q, d, cfg.scale, exclude, symmetric=cfg.task == "symmetric")
            if not torch.isfinite(loss):
                raise ConfigError(
                    f"loss became {loss.item()} at step {step}; lower --lr or --scale"
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(trainable_params, cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            step += 1
            gq, gd = _gamma_values(encoder)
            if step % cfg.log_every == 0 or step == total_steps:
                log["steps"].append(
                    {
                        "step": step,
                        "epoch": epoch,
                        "loss": float(loss.detach()),
                        "lr": scheduler.get_last_lr()[0],
                        "grad_norm": float(grad_norm),
                        "gamma_q": gq,
                        "gamma_d": gd,
                        "mean_query_norm": float(q_raw.detach().norm(dim=1).mean()),
                        "mean_doc_norm": float(d_raw[: len(chosen)].detach().norm(dim=1).mean()),
                        # padding waste: real tokens vs tokens computed (padded), both sides
                        "tokens": int(q_tokens["attention_mask"].sum())
                        + int(d_tokens["attention_mask"].sum()),
                        "padded_tokens": q_tokens["input_ids"].numel()
                        + d_tokens["input_ids"].numel(),
                        # wall time since training began (speed benchmarks skip warm-up steps)
                        "elapsed": time.perf_counter() - started,
                    }
                )
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}", gq=f"{gq:.3f}", gd=f"{gd:.3f}")
            bar.update(1)
            if cfg.eval_every and step % cfg.eval_every == 0 and (validation is not None or report):
                evaluate(step)
        if cfg.eval_every is None and (validation is not None or report):
            evaluate(step)
        if step >= total_steps:
            break
    if cfg.eval_every and step % cfg.eval_every and (validation is not None or report):
        evaluate(step)  # judge the final weights too before preferring an earlier checkpoint
    bar.close()
    log["seconds"] = time.perf_counter() - started
    log["steps_per_second"] = step / log["seconds"] if log["seconds"] else float("nan")
    if best_state is not None and result.best_step != step:
        encoder.load_state_dict(best_state)
        logger.info(
            "restored the best checkpoint (step %s, validation NDCG@10 %.4f)",
            result.best_step,
            result.best_score,
        )
    log["best_step"], log["best_validation_ndcg@10"] = result.best_step, result.best_score
    encoder.sync_config()
    log["final_gamma_q"], log["final_gamma_d"] = _gamma_values(encoder)
    encoder.eval()
    result.evaluations = log["evaluations"]
    if out_dir is not None:
        out = encoder.save(out_dir)
        (out / LOG_NAME).write_text(json.dumps(log, indent=1) + "\n")
    return result


def split_validation(
    pairs: Sequence[TrainingPair], dataset: RetrievalDataset | None, fraction: float, seed: int
) -> tuple[list[TrainingPair], RetrievalDataset | None]:
    """Hold out ``fraction`` of the training *queries* (all their pairs) as a validation split.

    Needs the BEIR dataset the pairs came from (for its corpus); returns the remaining
    pairs and the validation dataset, or the pairs unchanged when ``fraction`` is 0.
    """
    if fraction <= 0:
        return list(pairs), None
    if dataset is None:
        raise ConfigError(
            "a validation split needs BEIR training data (DIR:split), not a pair file"
        )
    if not 0 < fraction < 1:
        raise ConfigError(f"validation fraction must lie in (0, 1), got {fraction}")
    qids = sorted(dataset.qrels)
    random.Random(seed).shuffle(qids)
    held = set(qids[: max(1, int(round(fraction * len(qids))))])
    held_texts = {dataset.queries[q] for q in held}
    train_pairs = [p for p in pairs if p.query not in held_texts]
    val = RetrievalDataset(
        dataset.name,
        f"{dataset.split}-validation",
        dataset.corpus,
        {q: dataset.queries[q] for q in held},
        {q: dataset.qrels[q] for q in held},
    )
    return train_pairs, val


def mine_hard_negatives(
    encoder: Encoder,
    dataset: RetrievalDataset,
    pairs: Sequence[TrainingPair],
    count: int,
    *,
    top: int = 30,
    progress: bool = True,
) -> list[TrainingPair]:
    """Attach ``count`` hard negatives per pair: the starting model's top-``top`` non-relevant documents."""
    from magretrieve.evaluate import exact_search

    doc_ids = list(dataset.corpus)
    docs = encoder.encode_documents(
        [dataset.corpus[i].full_text for i in doc_ids], progress=progress and "mining: corpus"
    )
    # Several query ids may share a text: a pair's query text is relevant to the union.
    relevant: dict[str, set[str]] = {}
    for qid, judged in dataset.qrels.items():
        ids = relevant.setdefault(dataset.queries[qid], set())
        ids.update(d for d, rel in judged.items() if rel > 0)
    texts = list(relevant)
    qv = encoder.encode_queries(texts, progress=progress and "mining: queries")
    idx, _ = exact_search(qv, docs, top)
    rng = random.Random(0)
    negatives: dict[str, list[str]] = {}
    for row, text in enumerate(texts):
        # a document with a relevant document's text is no negative either
        relevant_texts = {dataset.corpus[d].full_text for d in relevant[text]}
        pool = [
            dataset.corpus[doc_ids[j]].full_text
            for j in idx[row]
            if doc_ids[j] not in relevant[text]
            and dataset.corpus[doc_ids[j]].full_text not in relevant_texts
        ]
        rng.shuffle(pool)
        negatives[text] = pool[:count]
    return [
        TrainingPair(p.query, p.positive, negatives.get(p.query, [])[:count], p.positive_id)
        for p in pairs
    ]
