"""Distributed and cached training equal one process with the whole batch.

* 2 gloo ranks × B pairs give the loss and the gradients of 1 process with the 2·B pairs:
  embeddings are gathered with gradients, so every query sees every rank's documents.
* The cached loss (GradCache, mini-batches of 2) gives the uncached loss and gradients.
* ``torchrun --nproc-per-node 2 -m magretrieve train`` writes one run folder whose
  ``train_log.json`` says ``"world_size": 2``.

Tolerance: float32 sums taken in another order — each gradient tensor agrees to
1e-5·(1 + its largest |entry|) (observed: ~2e-5 on an embedding gradient of size 16), losses
to 1e-6 relative. The encoder is in eval mode (no dropout) so both sides draw
no random masks. CPU-heavy (process start-up, torch import per rank): run under the CPU lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from magretrieve.data.readers import TrainingPair
from magretrieve.train.encoder import Encoder
from magretrieve.train.trainer import TrainConfig, contrastive_step, wrap_model

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi".split()


def make_pairs(n: int = 8) -> list[TrainingPair]:
    rng = np.random.default_rng(3)
    pairs = []
    for i in range(n):
        q = " ".join(rng.choice(WORDS, size=4))
        pos = " ".join(rng.choice(WORDS, size=int(rng.integers(4, 12))))
        # uneven hard negatives: ranks hold different numbers of columns
        negs = [" ".join(rng.choice(WORDS, size=6)) for _ in range(i % 3)]
        pairs.append(TrainingPair(q, pos, negs))
    # a positive repeated on the other rank's half: masked there, not a negative
    pairs[6] = TrainingPair(pairs[6].query, pairs[1].positive, pairs[6].negatives)
    return pairs


CASES = {
    "learnable-hard-negatives": ("learnable", dict(hard_negatives=2)),
    "cosine-symmetric": ("cosine", dict(task="symmetric", force=True)),
    "qnorm-cached": ("qnorm", dict(hard_negatives=2, mini_batch_size=2)),
}


def one_step(model_dir: Path, mode: str, pairs, cfg: TrainConfig) -> dict:
    torch.manual_seed(0)
    enc = Encoder.load(model_dir, mode)
    enc.eval()
    model = wrap_model(enc, cfg)
    out = contrastive_step(model, pairs, cfg)
    grads = {n: p.grad.detach().clone() for n, p in enc.named_parameters() if p.grad is not None}
    return {"loss": out.loss, "grads": grads}


def _rank(rank: int, world: int, init: str, model_dir: str, case: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        mode, kw = CASES[case]
        pairs = make_pairs()
        half = len(pairs) // world
        cfg = TrainConfig(batch_size=half, **kw)
        got = one_step(Path(model_dir), mode, pairs[rank * half : (rank + 1) * half], cfg)
        torch.save(got, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, init: str, model_dir: str, case: str, out: str) -> None:
    """Start each rank as this file run as a script: a fresh interpreter imports the installed
    magretrieve (the tests' package is not importable from the working folder a child gets)."""
    procs = [
        subprocess.Popen([sys.executable, __file__, str(r), str(world), init, model_dir, case, out])
        for r in range(world)
    ]
    codes = [p.wait(timeout=900) for p in procs]
    assert codes == [0] * world, f"ranks exited with {codes}"


def assert_same(a: dict, b: dict) -> None:
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    assert sorted(a["grads"]) == sorted(b["grads"])
    for name, g in a["grads"].items():
        diff = float((b["grads"][name] - g).abs().max())
        assert diff <= 1e-5 * (1 + float(g.abs().max())), (name, diff)


@pytest.mark.integration  # real multi-process torch.distributed (gloo ranks)
@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ranks_equal_one_process_with_the_doubled_batch(case, tiny_model_dir, tmp_path):
    mode, kw = CASES[case]
    pairs = make_pairs()
    single = one_step(tiny_model_dir, mode, pairs, TrainConfig(batch_size=len(pairs), **kw))
    assert single["grads"], "no gradient reached the parameters"
    out = str(tmp_path / "grads")
    run_ranks(2, str(tmp_path / "init"), str(tiny_model_dir), case, out)
    ranks = [torch.load(f"{out}.{r}") for r in range(2)]
    for got in ranks:  # DDP leaves the same averaged gradient on every rank
        assert_same(single, got)


@pytest.mark.parametrize("mode", ["qnorm", "learnable"])
def test_cached_loss_equals_uncached(mode, tiny_model_dir):
    pairs = make_pairs()
    plain = one_step(tiny_model_dir, mode, pairs, TrainConfig(batch_size=8, hard_negatives=2))
    for m in (1, 3):
        cached = one_step(
            tiny_model_dir,
            mode,
            pairs,
            TrainConfig(batch_size=8, hard_negatives=2, mini_batch_size=m),
        )
        assert_same(plain, cached)


def test_no_duplicate_masking_changes_the_loss(tiny_model_dir):
    # the repeated positive is masked: the loss differs from a batch where it is distinct
    pairs = make_pairs()
    distinct = list(pairs)
    distinct[6] = TrainingPair(pairs[6].query, pairs[6].positive + " omega", pairs[6].negatives)
    cfg = TrainConfig(batch_size=8)
    a = one_step(tiny_model_dir, "qnorm", pairs, cfg)["loss"]
    b = one_step(tiny_model_dir, "qnorm", distinct, cfg)["loss"]
    assert a != pytest.approx(b, rel=1e-3)


@pytest.mark.integration  # torchrun starts two ranks of the CLI
def test_torchrun_two_ranks_writes_one_run(tiny_model_dir, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join(json.dumps({"query": p.query, "positive": p.positive}) + "\n" for p in make_pairs())
    )
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--standalone", "-m", "magretrieve", "train", "--model", str(tiny_model_dir),
           "--train", str(pairs), "--out", str(out), "--mode", "qnorm", "--epochs", "1",
           "--batch-size", "2", "--json"]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    log = json.loads((out / "train_log.json").read_text())
    assert log["world_size"] == 2
    assert log["global_batch_size"] == 4
    assert log["total_steps"] == 2  # 8 pairs / (2 ranks × 2)
    # rank 0 alone printed the summary
    assert result.stdout.count('"out"') == 1


if __name__ == "__main__":  # one rank, started by run_ranks
    _rank(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:7])
