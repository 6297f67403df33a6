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
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from magretrieve.core.errors import ConfigError, DataError, SymmetryError
from magretrieve.core.training import TrainConfig
from magretrieve.data.readers import RetrievalDataset, TrainingPair
from magretrieve.train.distributed import average_gradients, data_parallel, world
from magretrieve.train.encoder import Encoder
from magretrieve.train.losses import InfoNCE, cached_backward, text_keys

logger = logging.getLogger(__name__)

LOG_NAME = "train_log.json"


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


# ----------------------------------------------------------------------------- one step


class ContrastiveModel(torch.nn.Module):
    """The encoder and the loss as one module: one forward uses every trainable parameter
    (γ and the norm head included), which is what DistributedDataParallel needs to see."""

    def __init__(self, encoder: Encoder, loss: InfoNCE, precision: str = "fp32") -> None:
        super().__init__()
        self.encoder = encoder
        self.loss = loss
        self.precision = precision

    def embed(self, tokens: dict[str, torch.Tensor], side: str) -> torch.Tensor:
        """Raw embeddings, float32 whatever the forward precision (normalization and loss in
        float32: x/‖x‖^γ and a softmax over scale·logits lose too much in bfloat16)."""
        with autocast(self.encoder.device, self.precision):
            raw = self.encoder(**tokens, side=side)
        return raw.float()

    def score(
        self,
        q_raw: torch.Tensor,
        d_raw: torch.Tensor,
        pos_keys: torch.Tensor,
        col_keys: torch.Tensor,
    ) -> torch.Tensor:
        q = self.encoder.side_vectors(q_raw, "query")
        d = self.encoder.side_vectors(d_raw, "document")
        return self.loss(q, d, positive_keys=pos_keys, column_keys=col_keys)

    def forward(
        self,
        q_tokens: dict[str, torch.Tensor],
        d_tokens: dict[str, torch.Tensor],
        pos_keys: torch.Tensor,
        col_keys: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q_raw = self.embed(q_tokens, "query")
        d_raw = self.embed(d_tokens, "document")
        return self.score(q_raw, d_raw, pos_keys, col_keys), q_raw, d_raw


def wrap_model(encoder: Encoder, cfg: TrainConfig) -> torch.nn.Module:
    """:class:`ContrastiveModel` for ``cfg``, inside DistributedDataParallel across ranks (which
    also copies rank 0's weights to every rank)."""
    model = ContrastiveModel(
        encoder, InfoNCE(cfg.scale, symmetric=cfg.task == "symmetric"), cfg.precision
    )
    return data_parallel(model, encoder.device)


@dataclass
class StepOutput:
    """One step's loss (mean over every rank's queries) and what the log records."""

    loss: float
    mean_query_norm: float
    mean_doc_norm: float
    tokens: int
    padded_tokens: int


def contrastive_step(
    model: torch.nn.Module, chosen: Sequence[TrainingPair], cfg: TrainConfig
) -> StepOutput:
    """Forward and backward of this rank's pairs; afterwards the parameters hold the gradient
    of the mean loss over all ranks' queries (the same as one process with every rank's pairs).

    With ``cfg.mini_batch_size`` the loss is cached (GradCache, :func:`cached_backward`): the
    same gradient with one mini-batch's activations in memory.
    """
    core = model.module if hasattr(model, "no_sync") else model
    encoder = core.encoder
    positives = [p.positive for p in chosen]
    negatives = [n for p in chosen for n in p.negatives[: cfg.hard_negatives]]
    columns = positives + negatives
    queries = [p.query for p in chosen]
    pos_keys, col_keys = text_keys(positives), text_keys(columns)
    m = cfg.mini_batch_size
    if m is None or m >= max(len(queries), len(columns)):
        q_tok = [encoder.tokenize(queries, "query")]
        d_tok = [encoder.tokenize(columns, "document")]
        loss, q_raw, d_raw = model(q_tok[0], d_tok[0], pos_keys, col_keys)
        if not torch.isfinite(loss):
            raise ConfigError(f"loss became {loss.item()}; lower --lr or --scale")
        loss.backward()
    else:
        q_tok = [encoder.tokenize(queries[i : i + m], "query") for i in range(0, len(queries), m)]
        d_tok = [
            encoder.tokenize(columns[i : i + m], "document") for i in range(0, len(columns), m)
        ]
        sides = ("query", "document")
        size = world()[1]
        with model.no_sync() if hasattr(model, "no_sync") else contextlib.nullcontext():
            loss, (q_raw, d_raw) = cached_backward(
                lambda s, tokens: core.embed(tokens, sides[s]),
                [q_tok, d_tok],
                lambda e: core.score(e[0], e[1], pos_keys, col_keys),
            )
        if not torch.isfinite(loss):
            raise ConfigError(f"loss became {loss.item()}; lower --lr or --scale")
        if size > 1:  # several backward passes ran under no_sync: average once, here
            average_gradients([p for p in core.parameters() if p.requires_grad], size)
    value = loss.detach().clone()
    if world()[1] > 1:
        dist.all_reduce(value)
        value /= world()[1]
    return StepOutput(
        loss=float(value),
        mean_query_norm=float(q_raw.detach().norm(dim=1).mean()),
        mean_doc_norm=float(d_raw[: len(chosen)].detach().norm(dim=1).mean()),
        tokens=sum(int(t["attention_mask"].sum()) for t in q_tok + d_tok),
        padded_tokens=sum(t["input_ids"].numel() for t in q_tok + d_tok),
    )


def rank_batches(
    lengths: Sequence[int], batch_size: int, rng: random.Random, rank: int, size: int
) -> list[list[int]]:
    """This rank's share of each global batch of ``batch_size · size`` pairs (every rank draws
    the same global batches from the same seed and takes its slice)."""
    out = []
    for batch in length_bucketed_batches(lengths, batch_size * size, rng):
        if len(batch) < size:  # a rank without a query cannot take part
            continue
        out.append([int(i) for i in np.array_split(np.asarray(batch), size)[rank]])
    return out


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

    from magretrieve.evaluation.retrieval import evaluate_retrieval

    cfg = config or TrainConfig()
    cfg.validate()
    check_task(encoder.config.mode, cfg.task, cfg.force)
    pairs = list(pairs)
    if len(pairs) < 2:
        raise DataError(f"training needs at least 2 pairs with a positive, got {len(pairs)}")
    rank, size = world()
    seed_everything(cfg.seed)
    torch.manual_seed(cfg.seed + rank)  # ranks draw different dropout masks
    rng = random.Random(cfg.seed)  # the same batch order on every rank

    doc_lengths = encoder.token_lengths([p.positive for p in pairs], "document")
    batches_per_epoch = len(rank_batches(doc_lengths, cfg.batch_size, random.Random(0), 0, size))
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
        "world_size": size,
        "global_batch_size": cfg.batch_size * size,
        "total_steps": total_steps,
        "steps": [],
        "evaluations": [],
    }
    result = TrainResult(log=log, out_dir=Path(out_dir) if out_dir else None)
    best_state: dict[str, torch.Tensor] | None = None

    def evaluate(step: int) -> None:
        nonlocal best_state
        if rank != 0:  # rank 0 evaluates and keeps the best weights; it alone writes them
            return
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
        disable=not progress or rank != 0,
    )
    model = wrap_model(encoder, cfg)
    for epoch in range(cfg.epochs):
        for batch in rank_batches(doc_lengths, cfg.batch_size, rng, rank, size):
            if step >= total_steps:
                break
            chosen = [pairs[i] for i in batch]
            optimizer.zero_grad(set_to_none=True)
            try:
                out = contrastive_step(model, chosen, cfg)
            except ConfigError as exc:
                raise ConfigError(f"step {step}: {exc}") from None
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
                        "loss": out.loss,
                        "lr": scheduler.get_last_lr()[0],
                        "grad_norm": float(grad_norm),
                        "gamma_q": gq,
                        "gamma_d": gd,
                        "mean_query_norm": out.mean_query_norm,
                        "mean_doc_norm": out.mean_doc_norm,
                        # padding waste: real tokens vs tokens computed (padded), both sides
                        "tokens": out.tokens,
                        "padded_tokens": out.padded_tokens,
                        # wall time since training began (speed benchmarks skip warm-up steps)
                        "elapsed": time.perf_counter() - started,
                    }
                )
            bar.set_postfix(loss=f"{out.loss:.3f}", gq=f"{gq:.3f}", gd=f"{gd:.3f}")
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
    if out_dir is not None and rank == 0:  # only rank 0 writes the run folder
        folder = encoder.save(out_dir)
        (folder / LOG_NAME).write_text(json.dumps(log, indent=1) + "\n")
    if size > 1:
        dist.barrier()  # no rank leaves before the run folder is complete
    return result


def train_frozen(
    encoder: Encoder,
    pairs: Sequence[TrainingPair],
    config: TrainConfig | None = None,
    *,
    report: Sequence[RetrievalDataset] = (),
    out_dir: str | Path | None = None,
    progress: bool = True,
) -> TrainResult:
    """Train only ``encoder``'s norm head, the transformer frozen: encode every text once and
    train the head on the cached vectors (:func:`magretrieve.train.heads.train_frozen_head`; seconds
    to minutes on a CPU instead of hours). What ``magretrieve train --freeze-encoder
    --norm-head ...`` runs.

    Uses ``config``'s epochs, batch size, scale, hard negatives, seed and ``head_lr``. ``report``
    sets are evaluated after training; with ``out_dir`` the model and ``train_log.json`` are
    saved. The log has the keys of :func:`train`'s where they apply.
    """
    from magretrieve.evaluation.retrieval import evaluate_retrieval
    from magretrieve.train.heads import train_frozen_head

    cfg = config or TrainConfig()
    cfg.validate()
    if encoder.norm_head is None:
        raise ConfigError("train_frozen needs an encoder with a norm head (norm_head=linear|mlp)")
    pairs = list(pairs)
    if len(pairs) < 2:
        raise DataError(f"training needs at least 2 pairs with a positive, got {len(pairs)}")
    encoder.config.head = replace(encoder.config.head, frozen_encoder=True)
    started = time.perf_counter()
    losses = train_frozen_head(encoder, pairs, cfg, progress=progress)
    evaluations = (
        [
            {
                f"{d.name}:{d.split}": evaluate_retrieval(encoder, d, progress=progress).to_dict()
                for d in report
            }
        ]
        if report
        else []
    )
    log: dict[str, Any] = {
        "frozen_encoder": True,
        "config": asdict(cfg),
        "epoch_losses": losses,
        "n_pairs": len(pairs),
        "world_size": 1,
        "seconds": time.perf_counter() - started,
        "evaluations": evaluations,
        "total_steps": len(losses),
        "final_gamma_q": encoder.config.gamma_q,
        "final_gamma_d": encoder.config.gamma_d,
        "steps": [{"loss": losses[-1]}] if losses else [],
    }
    if out_dir is not None:
        folder = encoder.save(out_dir)
        (folder / LOG_NAME).write_text(json.dumps(log, indent=1) + "\n")
    return TrainResult(log=log, out_dir=Path(out_dir) if out_dir else None, evaluations=evaluations)


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
