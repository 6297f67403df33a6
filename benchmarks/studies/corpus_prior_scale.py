"""Corpus prior at scale: hub scores by approximate k-NN (FAISS IVF) against the exact O(n²) path.

The hub score (mean cosine to the k = 10 nearest other documents) is computed both ways on
growing prefixes of one pool of vectors, in one run, side by side:

* **real** all-MiniLM-L6-v2 vectors of the shared sets: scifact and cranfield documents, their
  abstracts cut into sentences, and the STS-B sentences (~70,000 passages);
* **synthetic** vectors topping the pool up to the largest size: each is a mix of two random
  real vectors plus isotropic noise, renormalized, so it sits in the real vectors' region of the
  sphere (hubs and all) rather than in the near-orthogonal bulk a Gaussian would give.

Reported per size: seconds of each path, the speed-up, Spearman of z (approximate vs exact) and
the largest |Δz|; the growth exponent of each path's time (log-log slope). On scifact the prior's
NDCG@10 (β chosen on scifact *train* queries, scored on *test*) with z from the approximate path
(forced, although 5,183 documents would take the exact one by default) against the exact one.

End to end, in a child process each (wall time and peak RSS of that process):

* ``rescale --corpus-prior``: :func:`~magretrieve.priors.rescale.rescale_store` (what the command
  runs) from a persisted ``memory:`` store of the size's vectors (built beforehand, untimed) to
  a new one: read, hub score, write, persist. Its hub z (Spearman against exact) is the one
  reported for the default path.
* ``fit-prior --method hub``: :func:`~magretrieve.priors.fit.fit_prior` on scifact *train*
  queries over a corpus of the 5,183 scifact documents plus pool vectors up to the size, with
  the vectors encoded beforehand (an encoder stand-in returns them): choosing β, every
  candidate ranking the whole corpus. Encoding a million texts is the encoder's cost, not the
  prior's, and is left out.

    python benchmarks/study.py corpus_prior_scale --out benchmarks/results
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import numpy as np
from _common import (
    cache_dir,
    cpu_lock,
    data_dir,
    machine_summary,
    markdown_table,
    recorded_command,
)
from scipy.stats import spearmanr

K = 10
SIZES = (100_000, 300_000, 1_000_000)
#: β of the rescale run (any β > 0 gives the same z; z is read back from the magnitudes).
RESCALE_BETA = 0.05


def passages(data: Path) -> list[str]:
    """Real texts of the shared sets: documents, their sentences, STS-B sentences (deduplicated)."""
    from magretrieve.data.readers import iter_corpus, read_jsonl

    texts: list[str] = []
    for name in ("scifact", "cranfield"):
        for _, doc in iter_corpus(data / name / "corpus.jsonl", skip_empty=True):
            if not doc.full_text.strip():  # cranfield has empty documents: nothing to encode
                continue
            texts.append(doc.full_text)
            texts.extend(s for s in re.split(r"(?<=[.!?])\s+", doc.text) if len(s) > 20)
    for split in ("train", "dev", "test"):
        for _, obj in read_jsonl(data / "stsb" / f"{split}.jsonl"):
            texts += [obj["sentence1"], obj["sentence2"]]
    return list(dict.fromkeys(t.strip() for t in texts if t.strip()))


def real_vectors(model: str, data: Path, max_length: int) -> np.ndarray:
    """Unit MiniLM vectors of :func:`passages`, cached (encoding takes minutes on 2 cores)."""
    from magretrieve.priors.base import unit

    path = cache_dir("corpus_prior_scale") / f"real-{max_length}.npy"
    if path.is_file():
        return np.load(path)
    from magretrieve.train.encoder import Encoder

    enc = Encoder.load(model, "cosine", max_document_length=max_length)
    vecs = unit(enc.encode_documents(passages(data), batch_size=128, progress="real passages"))
    np.save(path, vecs)
    return vecs


def topped_up(real: np.ndarray, n: int, seed: int = 0, noise: float = 0.05) -> np.ndarray:
    """``real`` plus synthetic vectors up to ``n`` rows, shuffled (fixed seed)."""
    return topped_up_marked(real, n, seed, noise)[0]


def topped_up_marked(
    real: np.ndarray, n: int, seed: int = 0, noise: float = 0.05
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`topped_up` and, per row, whether it is a real vector."""
    from magretrieve.priors.base import unit

    rng = np.random.default_rng(seed)
    extra = max(0, n - len(real))
    a = real[rng.integers(0, len(real), extra)]
    b = real[rng.integers(0, len(real), extra)]
    w = rng.uniform(0.5, 1.0, size=(extra, 1)).astype(np.float32)
    g = rng.standard_normal((extra, real.shape[1])).astype(np.float32) * noise
    pool = np.concatenate([real, unit(w * a + (1 - w) * b + g)])
    order = rng.permutation(len(pool))[:n]
    return pool[order], order < len(real)


def timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def z_of(h: np.ndarray) -> np.ndarray:
    return (h - h.mean()) / (h.std() or 1.0)


def scifact_ndcg(model: str, data: Path, max_length: int) -> dict[str, Any]:
    """NDCG@10 on scifact test of cosine, prior with exact z, prior with approximate z."""
    from magretrieve.data.readers import load_beir
    from magretrieve.priors import HubPrior
    from magretrieve.priors.base import unit
    from magretrieve.priors.neighbors import mean_knn_similarity
    from magretrieve.priors.select import choose_prior, ndcg_at_10

    def _ndcg(q, stored, qids, doc_ids, qrels):  # type: ignore[no-untyped-def]
        return ndcg_at_10(q @ stored.T, qids, doc_ids, qrels)

    cache = cache_dir("corpus_prior_scale") / f"scifact-{max_length}.npz"
    train, test = load_beir(data / "scifact", "train"), load_beir(data / "scifact", "test")
    doc_ids = list(test.corpus)
    tq = [q for q in train.queries if q in train.qrels]
    sq = [q for q in test.queries if q in test.qrels]
    if cache.is_file():
        z = np.load(cache)
        d, qtr, qte = z["d"], z["qtr"], z["qte"]
    else:
        from magretrieve.train.encoder import Encoder

        enc = Encoder.load(model, "cosine", max_document_length=max_length)
        d = unit(enc.encode_documents([test.corpus[i].full_text for i in doc_ids], progress=True))
        qtr = unit(enc.encode_queries([train.queries[q] for q in tq]))
        qte = unit(enc.encode_queries([test.queries[q] for q in sq]))
        np.savez(cache, d=d, qtr=qtr, qte=qte)
    grid = [HubPrior(b, K) for b in (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3)]
    sel = choose_prior(
        qtr, d, tq, doc_ids, train.qrels, method="hub", grids={"hub": grid},
        chosen_on="scifact:train",
    )  # fmt: skip
    beta = float(getattr(sel.prior, "beta", 0.0))  # 0: cosine won
    out: dict[str, Any] = {"beta": beta, "documents": len(doc_ids)}
    out["cosine"] = _ndcg(qte, d, sq, doc_ids, test.qrels)
    for method in ("exact", "grouped", "blocked", "ivf"):
        h, seconds = timed(lambda m=method: mean_knn_similarity(d, K, method=m))
        z = (h - float(h.mean())) / float(h.std())
        stored = (d * np.exp(-beta * z)[:, None]).astype(np.float32)
        out[method] = {"ndcg@10": _ndcg(qte, stored, sq, doc_ids, test.qrels), "seconds": seconds}
        out[f"h_{method}"] = h
    exact = out.pop("h_exact")
    for method in ("grouped", "blocked", "ivf"):
        out[method]["spearman_z"] = float(spearmanr(out.pop(f"h_{method}"), exact)[0])
    return out


class _Cached:
    """An encoder stand-in for ``fit_prior``: returns vectors encoded beforehand."""

    similarity = type("Cosine", (), {"gamma_q": 1.0, "gamma_d": 1.0, "mode": "cosine"})()
    last_truncated = 0

    def __init__(self, docs: np.ndarray, queries: np.ndarray) -> None:
        self.docs, self.queries = docs, queries

    def encode_documents(self, texts: list[str], **_: Any) -> np.ndarray:
        assert len(texts) == len(self.docs)
        return self.docs

    def encode_queries(self, texts: list[str], **_: Any) -> np.ndarray:
        assert len(texts) == len(self.queries)
        return self.queries


def child_rescale(pool: np.ndarray, n: int, work: Path) -> dict[str, Any]:
    """Time ``rescale_store`` memory:src -> memory:dst (the source is built first, untimed)."""
    import magretrieve.priors.hub as hub
    from magretrieve.priors import HubPrior
    from magretrieve.priors.rescale import rescale_store
    from magretrieve.stores.memory_store import MemoryStore

    src, dst = work / "src", work / "dst"
    store = MemoryStore(pool.shape[1], src)
    store.write_metadata({"mode": "cosine", "gamma_d": 1.0, "document_contract": "unit_norm"})
    store.add([f"d{i:07d}" for i in range(n)], pool[:n], [{"n": i} for i in range(n)])
    store.persist()
    store.close()
    del store
    captured: dict[str, Any] = {}
    real = hub.corpus_hub_scores

    def spy(units: np.ndarray, k: int) -> np.ndarray:
        h, captured["hub_s"] = timed(lambda: real(units, k))
        captured["h"] = h
        return h

    hub.corpus_hub_scores = spy  # type: ignore[assignment]
    _, seconds = timed(
        lambda: rescale_store(
            f"memory:{src}", f"memory:{dst}", prior=HubPrior(RESCALE_BETA, K), progress=False
        )
    )
    np.save(work / "h.npy", captured["h"])  # rows in id order = pool order
    return {"rescale_s": seconds, "rescale_hub_s": captured["hub_s"]}


def child_fit_prior(pool: np.ndarray, n: int, model: str, data: Path, max_length: int) -> dict:
    """Time ``fit_prior --method hub`` on scifact train over scifact + pool vectors up to n."""
    from types import SimpleNamespace

    from magretrieve.data.readers import Document, load_beir
    from magretrieve.priors.fit import fit_prior

    z = np.load(cache_dir("corpus_prior_scale") / f"scifact-{max_length}.npz")
    train = load_beir(data / "scifact", "train")
    extra = max(0, n - len(z["d"]))
    docs = np.concatenate([z["d"], pool[:extra]])
    corpus = dict(train.corpus)
    corpus.update({f"pool{i}": Document(f"pool{i}", "") for i in range(extra)})
    dataset = SimpleNamespace(
        name="scifact+pool", split="train", corpus=corpus, queries=train.queries, qrels=train.qrels
    )
    sel, seconds = timed(
        lambda: fit_prior(_Cached(docs, z["qtr"]), dataset, method="hub", progress=False)
    )
    return {
        "fit_prior_s": seconds,
        "fit_prior_docs": len(docs),
        "fit_prior_beta": float(getattr(sel.prior, "beta", 0.0)),
        "fit_prior_training_ndcg": sel.training_ndcg,
    }


def in_child(args: list[str]) -> tuple[dict[str, Any], float]:
    """Run this study with ``--child ...`` in a new process (through ``benchmarks/study.py``,
    which gives it the benchmarks' helpers): its JSON and peak RSS (GiB)."""
    study = Path(__file__).resolve().parents[1] / "study.py"
    proc = subprocess.Popen(
        [sys.executable, str(study), "corpus_prior_scale", *args],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ,
    )
    out = proc.stdout.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"child {args} failed ({proc.returncode})")
    return json.loads(out.strip().splitlines()[-1]), usage.ru_maxrss / 2**20


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for key, style, label in (
        ("exact_s", "o-", "exact (O(n²))"),
        ("blocked_s", "s-", "blocked IVF"),
        ("ivf_s", "^-", "FAISS IndexIVFFlat search"),
        ("grouped_s", "D-", "grouped IVF (default)"),
        ("rescale_s", "v--", "whole rescale --corpus-prior"),
    ):
        have = [r for r in rows if key in r]
        if have:
            ax.loglog([r["n"] for r in have], [r[key] for r in have], style, label=label)
    ax.set_xlabel("documents")
    ax.set_ylabel("seconds (hub score, k = 10)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def slope(rows: list[dict[str, Any]], key: str) -> float:
    x = np.log([r["n"] for r in rows])
    y = np.log([r[key] for r in rows])
    return float(np.polyfit(x, y, 1)[0])


def pool_for(model: str, data: Path, max_doc_length: int, n: int) -> tuple[np.ndarray, int]:
    real = real_vectors(model, data, max_doc_length)
    return topped_up(real, n), len(real)


@click.command()
@click.option("--model", default="all-MiniLM-L6-v2", show_default=True)
@click.option("--sizes", default=",".join(map(str, SIZES)), show_default=True)
@click.option("--max-doc-length", type=int, default=128, show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default="benchmarks/results")
@click.option(
    "--exact-full",
    type=int,
    default=100_000,
    show_default=True,
    help="Run the exact path on every row up to this size; above it on --exact-sample rows.",
)
@click.option("--exact-sample", type=int, default=50_000, show_default=True)
@click.option(
    "--ivf-max",
    type=int,
    default=300_000,
    show_default=True,
    help="Also time the FAISS IndexIVFFlat per-document search up to this size.",
)
@click.option(
    "--blocked-max", type=int, default=300_000, show_default=True, help="Time blocked up to this."
)
@click.option(
    "--fit-prior-sizes",
    default="1000000",
    show_default=True,
    help="Sizes at which fit-prior is timed ('' for none).",
)
@click.option("--lock", default="default", help="CPU lock file ('' for none).")
@click.option(
    "--child", default=None, hidden=True, help="rescale:N:POOL:DIR or fit-prior:N:POOL (internal)"
)
def main(
    model: str,
    sizes: str,
    max_doc_length: int,
    exact_full: int,
    exact_sample: int,
    ivf_max: int,
    blocked_max: int,
    fit_prior_sizes: str,
    out: str,
    lock: str,
    child: str | None,
) -> None:
    import faiss
    import torch

    from magretrieve.priors.neighbors import (
        BLOCKED_LISTS_PER_SQRT_N,
        default_nlist,
        exact_mean_knn,
        mean_knn_similarity,
    )

    torch.set_num_threads(2)
    faiss.omp_set_num_threads(2)
    ns = sorted(int(s) for s in sizes.split(","))
    data = data_dir()
    if child is not None:
        what, n_text, pool_text, *rest = child.split(":", 3)
        pool, _ = pool_for(model, data, max_doc_length, int(pool_text))  # the parent's pool
        if what == "rescale":
            result = child_rescale(pool, int(n_text), Path(rest[0]))
        else:
            result = child_fit_prior(pool, int(n_text), model, data, max_doc_length)
        click.echo(json.dumps(result))
        return
    fit_ns = {int(s) for s in fit_prior_sizes.split(",") if s.strip()}
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    with cpu_lock(lock):
        real = real_vectors(model, data, max_doc_length)
        sci = scifact_ndcg(model, data, max_doc_length)
        pool, is_real = topped_up_marked(real, max(ns))
        real_count = np.cumsum(is_real)
        rows: list[dict[str, Any]] = []
        for n in ns:
            x = np.ascontiguousarray(pool[:n])
            row: dict[str, Any] = {
                "n": n,
                "real": int(real_count[n - 1]),
                "nlist": default_nlist(n),
                "blocked_nlist": default_nlist(n, BLOCKED_LISTS_PER_SQRT_N),
            }
            # the default path, end to end: rescale --corpus-prior in a child process
            with tempfile.TemporaryDirectory(dir=cache_dir("corpus_prior_scale")) as tmp:
                got, row["rescale_peak_rss_gib"] = in_child(
                    ["--child", f"rescale:{n}:{max(ns)}:{tmp}", "--model", model,
                     "--max-doc-length", str(max_doc_length)]
                )  # fmt: skip
                row.update(got)
                row["grouped_s"] = row["rescale_hub_s"]
                h = {"grouped": np.load(Path(tmp) / "h.npy")}
            methods = ["grouped"]
            for method, limit in (("ivf", ivf_max), ("blocked", blocked_max)):
                if n <= limit:
                    methods.append(method)
                    h[method], row[f"{method}_s"] = timed(
                        lambda x=x, m=method: mean_knn_similarity(x, K, method=m)
                    )
            if n in fit_ns:
                got, row["fit_prior_peak_rss_gib"] = in_child(
                    ["--child", f"fit-prior:{n}:{max(ns)}", "--model", model,
                     "--max-doc-length", str(max_doc_length)]
                )  # fmt: skip
                row.update(got)
            # exact on every row up to --exact-full, else on a fixed random sample of rows
            # (each row costs the same, so the full time is the sample's time × n / rows)
            rows_ = (
                None
                if n <= exact_full
                else np.sort(np.random.default_rng(1).choice(n, exact_sample, replace=False))
            )
            chunk = max(64, min(1024, 250_000_000 // n))  # ≤ 1 GB of similarities at a time
            h_exact, t = timed(lambda x=x, r=rows_, c=chunk: exact_mean_knn(x, K, c, rows=r))
            row["exact_rows"] = n if rows_ is None else len(rows_)
            row["exact_s"] = t * n / row["exact_rows"]
            for method in methods:
                approx = h[method] if rows_ is None else h[method][rows_]
                row[f"{method}_speedup"] = row["exact_s"] / row[f"{method}_s"]
                row[f"{method}_spearman_z"] = float(spearmanr(approx, h_exact)[0])
                if rows_ is None:
                    row[f"{method}_max_abs_dz"] = float(np.abs(z_of(approx) - z_of(h_exact)).max())
            rows.append(row)
            click.echo(json.dumps(row))
            write_results(folder, rows, sci, real, max_doc_length, exact_full, exact_sample)


def write_results(
    folder: Path,
    rows: list[dict[str, Any]],
    sci: dict[str, Any],
    real: np.ndarray,
    max_doc_length: int,
    exact_full: int,
    exact_sample: int,
) -> None:
    """The json, the plot and the markdown of the sizes measured so far (after every size)."""
    from magretrieve.priors.neighbors import (
        BLOCKED_LISTS_PER_SQRT_N,
        BLOCKED_NPROBE,
        EXACT_MAX,
        LISTS_PER_SQRT_N,
        NPROBE,
        TRAIN_PER_LIST,
    )

    def exponent(key: str) -> float | None:
        have = [r for r in rows if key in r]
        return slope(have, key) if len(have) > 1 else None

    result = {
        "command": recorded_command(),
        "machine": machine_summary(),
        "k": K,
        "nprobe": {"blocked": BLOCKED_NPROBE, "ivf": NPROBE, "grouped": NPROBE},
        "exact_below": EXACT_MAX,
        "real_passages": int(len(real)),
        "rows": rows,
        "exponent": {
            m: exponent(f"{m}_s") for m in ("exact", "blocked", "ivf", "grouped", "rescale")
        },
        "scifact": sci,
    }
    (folder / "corpus_prior_scale.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(rows, folder / "corpus_prior_scale.png")

    def cell(r: dict[str, Any], key: str, fmt: str) -> str:
        return format(r[key], fmt) if key in r else "—"

    table = markdown_table(
        ["documents", "of them real", "exact s", "exact rows run",
         "lists", "grouped IVF (default) s", "speed-up", "Spearman z", "max abs Δz",
         "IndexIVFFlat search s", "speed-up", "Spearman z",
         "blocked: lists", "s", "speed-up", "Spearman z"],
        [
            (f"{r['n']:,}", f"{r['real']:,}", f"{r['exact_s']:.1f}", f"{r['exact_rows']:,}",
             r["nlist"], cell(r, "grouped_s", ".1f"), cell(r, "grouped_speedup", ".1f"),
             cell(r, "grouped_spearman_z", ".4f"), cell(r, "grouped_max_abs_dz", ".3f"),
             cell(r, "ivf_s", ".1f"), cell(r, "ivf_speedup", ".1f"),
             cell(r, "ivf_spearman_z", ".4f"),
             r["blocked_nlist"], cell(r, "blocked_s", ".1f"), cell(r, "blocked_speedup", ".1f"),
             cell(r, "blocked_spearman_z", ".4f"))
            for r in rows
        ],
    )  # fmt: skip
    e2e = markdown_table(
        ["documents", "rescale --corpus-prior s", "of it hub score s", "peak RSS GiB",
         "fit-prior --method hub s", "corpus", "peak RSS GiB", "β chosen"],
        [
            (f"{r['n']:,}", cell(r, "rescale_s", ".0f"), cell(r, "rescale_hub_s", ".0f"),
             cell(r, "rescale_peak_rss_gib", ".1f"), cell(r, "fit_prior_s", ".0f"),
             f"{r['fit_prior_docs']:,}" if "fit_prior_docs" in r else "—",
             cell(r, "fit_prior_peak_rss_gib", ".1f"), cell(r, "fit_prior_beta", "g"))
            for r in rows
        ],
    )  # fmt: skip
    sci_table = markdown_table(
        ["scifact test (5,183 docs)", "NDCG@10", "Spearman z vs exact"],
        [
            ("cosine", f"{sci['cosine']:.4f}", ""),
            (f"prior β={sci['beta']:g}, exact z", f"{sci['exact']['ndcg@10']:.4f}", "1"),
            (f"prior β={sci['beta']:g}, grouped IVF z (forced)",
             f"{sci['grouped']['ndcg@10']:.4f}", f"{sci['grouped']['spearman_z']:.4f}"),
            (f"prior β={sci['beta']:g}, IndexIVFFlat z (forced)",
             f"{sci['ivf']['ndcg@10']:.4f}", f"{sci['ivf']['spearman_z']:.4f}"),
            (f"prior β={sci['beta']:g}, blocked IVF z (forced)",
             f"{sci['blocked']['ndcg@10']:.4f}", f"{sci['blocked']['spearman_z']:.4f}"),
        ],
    )  # fmt: skip
    big = rows[-1]
    ndcg_diff = abs(sci["exact"]["ndcg@10"] - sci["grouped"]["ndcg@10"])
    goals = [
        (f"Spearman of z vs exact at {big['n']:,}", "≥ 0.99",
         cell(big, "grouped_spearman_z", ".4f"), big.get("grouped_spearman_z", 0) >= 0.99),
        (f"whole rescale --corpus-prior at {big['n']:,}", "≤ 600 s",
         cell(big, "rescale_s", ".0f") + " s", big.get("rescale_s", 1e9) <= 600),
        (f"fit-prior --method hub at {big['n']:,}", "≤ 600 s",
         cell(big, "fit_prior_s", ".0f") + " s", big.get("fit_prior_s", 1e9) <= 600),
        ("scifact NDCG@10 of the prior, approximate vs exact z", "within 0.001",
         f"{ndcg_diff:.4f}", ndcg_diff <= 0.001),
    ]  # fmt: skip
    goal_table = markdown_table(
        ["goal (corpus prior at 1M, default path)", "target", "measured", "met"],
        [(g, t, m, "yes" if ok else "**no**") for g, t, m, ok in goals],
    )
    sampled = (
        "on every row at every size"
        if big["exact_rows"] == big["n"]
        else f"on every row up to {exact_full:,} documents, above that on a fixed random sample "
        f"of {exact_sample:,} rows (each still against all n documents) and scaled by n / rows"
    )
    ex = result["exponent"]
    growth = ", ".join(
        f"{name} n^{ex[key]:.2f}"
        for key, name in (("exact", "exact"), ("grouped", "grouped IVF"), ("ivf", "IndexIVFFlat"),
                          ("blocked", "blocked"), ("rescale", "whole rescale"))
        if ex.get(key) is not None
    )  # fmt: skip
    text = f"""# Corpus prior at scale: approximate k-NN hub scores

Command: `{result["command"]}`

Machine: {result["machine"]}; 2 threads (BLAS and FAISS). k = {K}.
*grouped IVF* (the default above {EXACT_MAX:,} documents, `method="auto"`): spherical k-means
(FAISS, ≤ {TRAIN_PER_LIST} random training vectors per list, 10 iterations) into
≈{LISTS_PER_SQRT_N}√n lists; every document probes its {NPROBE} nearest lists (the candidates
of an IndexIVFFlat search with nprobe = {NPROBE}), and the documents probing a list meet its
members in one matrix product. *IndexIVFFlat search* (`method="ivf"`, the default before):
the same lists searched per document by FAISS. *blocked* (`method="blocked"`):
≈{BLOCKED_LISTS_PER_SQRT_N}√n lists, each list against its {BLOCKED_NPROBE} nearest lists.
Pool: {len(real):,} real all-MiniLM-L6-v2 passages of the shared sets (documents, their
sentences, STS-B sentences; max {max_doc_length} tokens), topped up with synthetic vectors
(each a mix of two random real vectors, weight U(0.5, 1), plus N(0, 0.05²) noise per
coordinate, renormalized); each size is a prefix of one shuffled pool.

{goal_table}

{table}

*exact s* is measured {sampled}. Spearman and |Δz| compare the approximate scores with the
exact ones on the rows the exact path ran on. *grouped IVF s* is the hub score inside the
rescale run below (the same call `fit_corpus` makes).

End to end, each in its own process (peak RSS of that process; the source store is built
beforehand, untimed). *rescale*: `rescale_store` (what `magretrieve rescale --source memory:SRC
--target memory:DST --corpus-prior {RESCALE_BETA}` runs) from a persisted memory store to a new
one: read, check, hub score, write, persist. *fit-prior*: `fit_prior(..., method="hub")` (what
`magretrieve fit-prior --method hub` runs after encoding) on the scifact train queries over the
5,183 scifact documents plus pool vectors up to the size, vectors encoded beforehand (encoding
a million texts is the encoder's cost, not the prior's): 9 β candidates and cosine, each
ranking the whole corpus, with one hub score.

{e2e}

![time vs n](corpus_prior_scale.png)

Growth over the sizes above (log-log slope): {growth}.

{sci_table}

β chosen on scifact train queries with exact z; by default (`method="auto"`) corpora under
{EXACT_MAX:,} documents take the exact path, so scifact itself is unaffected.
"""
    (folder / "corpus_prior_scale.md").write_text(text)
    click.echo(text)


if __name__ == "__main__":
    main()
