"""``magretrieve recall EXPORT --store SPEC --queries FILE [--target 0.99]``: check a store's
recall on your own queries.

The queries are encoded with the export's query graph and searched in the store as it is
opened (its current search setting); the truth is exact inner product over every stored vector,
computed here. With ``--target`` the store's search knob (``ef_search``, ``nprobe`` or
``leaves_to_search``) is raised step by step on one half of the queries until the target plus
half the remaining gap is reached, and the recall of that setting is measured on the other half
(:mod:`magretrieve.stores._ann_recall`); the store is not changed.
"""

from __future__ import annotations

import json
from typing import Any

import click

from magretrieve.cli._common import collect_store_options, search_store_options, store_spec_option
from magretrieve.cli._group import main

K = 10


def store_vectors(store: Any, chunk: int = 8192) -> tuple[list[str], Any]:
    """Every stored id and vector (the exact search's corpus)."""
    import numpy as np

    ids = list(store.iter_ids())
    parts = [store.get_vectors(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    return ids, (np.concatenate(parts) if parts else np.zeros((0, store.dimension), np.float32))


def knob_for(store: Any, spec: str) -> tuple[str, list[int], int] | None:
    """(option name, candidate values, current value) of the store's search knob, or None."""
    from magretrieve.stores import _ann_recall
    from magretrieve.stores.registry import backend_for

    accepted = backend_for(spec)[0].option_names
    params = store.describe()["parameters"]
    for key, option in (
        ("ef_search", "ef_search"),
        ("hnsw_ef", "ef_search"),
        ("nprobe", "nprobe"),
        ("leaves_to_search", "leaves_to_search"),
    ):
        if key not in params or option not in accepted:
            continue
        current = params[key]
        if current is None:  # the library's default (Qdrant's hnsw_ef): the tuned one, if any
            current = (params.get("recall") or {}).get(key) or (params.get("recall") or {}).get(
                "hnsw_ef"
            )
        if current is None and params.get("index") != "hnsw":
            continue
        if option == "ef_search":
            values = list(_ann_recall.HNSW_EF)
        else:
            size = params.get("nlist") or params.get("num_leaves") or params.get("lists") or 4096
            values = _ann_recall.nprobe_values(int(size))
        return option, values, int(current if current is not None else values[0])
    return None


@main.command("recall")
@click.argument("export_dir", type=click.Path(file_okay=False))
@store_spec_option
@click.option(
    "--queries",
    "queries_file",
    required=True,
    type=click.Path(dir_okay=False),
    help="Your queries: one text per line, or a BEIR queries.jsonl.",
)
@click.option(
    "--target",
    type=click.FloatRange(0.0, 1.0, min_open=True),
    default=None,
    help="Also find the lowest search setting that reaches this recall@10 on these queries.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--force", is_flag=True, help="Check a store built by another model.")
@search_store_options
def recall_cmd(
    export_dir: str,
    store_spec: str,
    queries_file: str,
    target: float | None,
    as_json: bool,
    force: bool,
    **store_kw: object,
) -> None:
    """recall@10 of the store against exact inner product on your queries."""
    from magretrieve.core.topk import exact_search
    from magretrieve.serving.retriever import Retriever
    from magretrieve.serving.tuning_queries import encode, read_query_texts
    from magretrieve.stores import _ann_recall

    texts = read_query_texts(queries_file)  # a bad file is refused before anything opens
    options = collect_store_options(**store_kw)
    with Retriever.load(
        export_dir, store=store_spec, force=force, create=False, **options
    ) as retriever:
        store = retriever.store
        q = encode(retriever, texts, _ann_recall.USER, progress=not as_json and "queries")
        ids, vectors = store_vectors(store)
        k = min(K, len(ids))
        if k < 1:
            raise click.ClickException(f"{store.location}: the store is empty")
        found = [[h.id for h in row] for row in store.search(q.vectors, k, with_vectors=False)]
        rows = exact_search(q.vectors, vectors, k)[0]
        truth = [[ids[r] for r in row] for row in rows]
        out: dict[str, Any] = {
            "store": store.location,
            "queries": len(texts),
            "k": k,
            f"recall_at_{k}": round(_ann_recall.recall_at_k(found, truth), 4),
            "ground_truth": "exact inner product over the stored vectors",
        }
        knob = knob_for(store, store_spec)
        params = store.describe()["parameters"]
        if knob is not None and any(params.get(n) is not None for n in (knob[0], "hnsw_ef")):
            out[knob[0]] = knob[2]  # the setting searched with (unless the library's default)
        stored = params.get("recall") or {}
        if stored:
            out["store_measured"] = {
                key: stored[key]
                for key in (f"recall_at_{k}", "query_kind", "target")
                if key in stored
            }
    if target is not None:
        out["target"] = target
        if knob is None:
            out["tuning"] = "the store has no search setting to tune (exact, or not an ANN index)"
        else:
            out.update(_sweep(store_spec, options, force, knob, target, q, ids, vectors))
    _print(out, as_json, k)


def _sweep(
    spec: str,
    options: dict[str, Any],
    force: bool,
    knob: tuple[str, list[int], int],
    target: float,
    q: Any,
    ids: list[str],
    vectors: Any,
) -> dict[str, Any]:
    """Tune the knob on half the queries (reopening the store at each value), measure on the
    other half; the store on disk is not changed."""
    from magretrieve.stores import _ann_recall, open_store

    name, values, current = knob
    opened: list[Any] = []

    def set_value(value: int) -> None:
        for s in opened:
            s.close()
        opened.clear()
        opened.append(open_store(spec, **{**options, name: int(value)}))

    def search(queries: Any, kk: int) -> list[list[str]]:
        return [[h.id for h in row] for row in opened[0].search(queries, kk, with_vectors=False)]

    try:
        set_value(current)
        result = _ann_recall.measure(
            search,
            ids,
            vectors,
            knob=_ann_recall.Knob(name, values, set_value, current),
            target=target,
            queries=q,
            where=spec,
            warn=False,
        )
    finally:
        for s in opened:
            s.close()
    return {
        "setting": {name: result[name]},
        "reached": bool(result.get("target_met_on_tuning_queries")),
        "held_out_recall": result[f"recall_at_{result['k']}"],
        "held_out_queries": result["queries"],
    }


def _print(out: dict[str, Any], as_json: bool, k: int) -> None:
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    setting = next(
        (f" ({n}={out[n]})" for n in ("ef_search", "nprobe", "leaves_to_search") if n in out), ""
    )
    click.echo(
        f"{out['store']}: recall@{k} {out[f'recall_at_{k}']:.4f} against exact inner product "
        f"on {out['queries']} queries{setting}"
    )
    measured = out.get("store_measured")
    if measured and f"recall_at_{k}" in measured:
        click.echo(
            f"the store measured {measured[f'recall_at_{k}']:.4f} on its own tuning sample "
            f"({measured.get('query_kind', '?')})"
        )
    if "tuning" in out:
        click.echo(out["tuning"])
    elif "setting" in out:
        ((name, value),) = out["setting"].items()
        verdict = "reaches" if out["reached"] else "is the largest tried and does NOT reach"
        click.echo(
            f"{name}={value} {verdict} {out['target']} on half the queries; recall@{k} on the "
            f"other {out['held_out_queries']}: {out['held_out_recall']:.4f} (open the store "
            f"with {name}={value}, or let it tune itself on these queries: --tuning-queries)"
        )
