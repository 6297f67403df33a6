"""Check the side predictors against measured fine-tuning: the better of qnorm vs dnorm.

Reads per-run result JSON files named ``<mode>-s<seed>.json`` (as written by
``benchmarks/quality.py``: ``{"eval": {"<data>:<split>": {"ndcg_at_10": …}}}``), averages
NDCG@10 over seeds for qnorm and dnorm, and says for each data set whether ΔCV and κ picked
the winner. A difference below ``tie`` NDCG@10 counts as a tie (neither prediction is wrong).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: NDCG@10 gap below which qnorm and dnorm count as tied.
TIE = 0.005
_NAME = re.compile(r"^(qnorm|dnorm)-s(\d+)\.json$")


def measured_ndcg(results_dir: str | Path) -> dict[str, dict[str, list[float]]]:
    """{data set: {mode: [NDCG@10 per seed]}} for the qnorm and dnorm runs found."""
    found: dict[str, dict[str, list[float]]] = {}
    folder = Path(results_dir)
    if not folder.is_dir():
        return found
    for path in sorted(folder.iterdir()):
        match = _NAME.match(path.name)
        if not match:
            continue
        record = json.loads(path.read_text())
        for data, figures in (record.get("eval") or {}).items():
            value = figures.get("ndcg_at_10") if isinstance(figures, Mapping) else None
            if isinstance(value, (int, float)):
                found.setdefault(data, {}).setdefault(match.group(1), []).append(float(value))
    return found


def validation_rows(
    predictions: Mapping[str, str], results_dir: str | Path, tie: float = TIE
) -> list[dict[str, Any]]:
    """One row per data set: measured NDCG@10 of qnorm/dnorm, the winner, each predictor's hit.

    ``predictions`` maps a predictor name (e.g. "ΔCV", "κ") to the side it picked. A data set
    with only one of the two modes measured is reported as pending.
    """
    rows = []
    for data, modes in sorted(measured_ndcg(results_dir).items()):
        row: dict[str, Any] = {"data": data}
        for mode in ("qnorm", "dnorm"):
            vals = modes.get(mode, [])
            row[mode] = sum(vals) / len(vals) if vals else None
            row[f"{mode}_seeds"] = len(vals)
        if row["qnorm"] is None or row["dnorm"] is None:
            row["better"] = "pending"
        elif abs(row["qnorm"] - row["dnorm"]) < tie:
            row["better"] = "tie"
        else:
            row["better"] = "qnorm" if row["qnorm"] > row["dnorm"] else "dnorm"
        for name, side in predictions.items():
            row[name] = side
            row[f"{name}_agrees"] = (
                None if row["better"] in ("pending", "tie") or not side else side == row["better"]
            )
        rows.append(row)
    return rows
