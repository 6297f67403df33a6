"""The verdict: one recommendation from the measured figures, as text and as JSON.

:func:`recommend` is the only place that turns numbers into advice; it takes a plain dict
of figures so that new evidence (e.g. a norm head's results) can be added in one spot.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from magretrieve.diagnose.magnitude import ANTI_D, CARRIES_D
from magretrieve.diagnose.side import DELTA_CV_THRESHOLD

REPORT_NAME = "diagnose.json"

NORMALIZE_PRETRAINED = (
    "this encoder was pretrained through a Normalize stage{why}: raw-norm one-sided modes are "
    "expected to hurt on it (all-MiniLM-L6-v2 lost 0.04 NDCG@10 in-domain on scifact and 0.16 on "
    "cranfield under qnorm fine-tuning) and a few hundred training pairs do not turn its raw "
    "lengths around - use cosine (fine-tune under cosine if you have pairs)"
)
CORPUS_PRIOR_ADVICE = (
    "for a document magnitude, add the corpus prior on top of the cosine model: of the options "
    "measured on all-MiniLM-L6-v2 (norm heads, calibrated qnorm, warm-started learnable γ, corpus "
    "prior; 2 seeds, docs/norm_head.md) it is the only one not worse than fine-tuned cosine both "
    "in and out of domain, and its gain is small (scifact 0.645 -> 0.649, cranfield 0.397 -> "
    "0.398 NDCG@10). β is chosen on your training queries with β = 0 (plain cosine) always a "
    "candidate, so it stays off when it does not help them"
)
#: What to run for the corpus prior (shown with the recommendation).
CORPUS_PRIOR_STEPS = (
    "magretrieve train --mode cosine --model MODEL --train DATA:train --out RUN",
    "magretrieve fit-prior --model RUN --data DATA:train --out prior.json",
    "magretrieve rescale --source STORE --target NEW_STORE --prior-file prior.json",
)


@dataclass
class Recommendation:
    """The mode to use, why, and what to watch out for."""

    mode: str
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: The side each predictor picks if one-sided training is done anyway.
    side_if_one_sided: str = ""
    #: A magnitude to add on top of ``mode`` ("corpus_prior"), or "" for none.
    magnitude: str = ""
    #: Commands that carry the advice out, in order.
    next_steps: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def recommend(figures: Mapping[str, Any]) -> Recommendation:
    """Advice from measured figures.

    Keys read (all optional): ``removed_normalize`` (bool), ``cohens_d``, ``norm_cv``,
    ``delta_cv`` (ratio), ``kappa`` ({"qnorm": κ, "dnorm": κ}), ``sts`` (rows of
    :func:`~magretrieve.diagnose.symmetry.symmetry_check`).

    Rules, in order:
    1. Normalization-pretrained encoder (a removed Normalize stage, or Cohen's d ≤ −0.2):
       cosine — raw norms point away from relevance, one-sided modes are expected to hurt —
       plus the corpus prior as the magnitude (the only option measured not worse than
       fine-tuned cosine in and out of domain), with the commands that apply it.
    2. Otherwise the side comes from ΔCV (≥ 2.82 → dnorm, else qnorm); without probes from
       the experimental κ (smaller κ wins); without either, qnorm (the paper's most frequent
       winner) with a warning that no predictor ran.
    3. STS figures add a warning that one-sided modes break symmetry.
    """
    reasons: list[str] = []
    warnings: list[str] = []
    d = figures.get("cohens_d")
    cv = figures.get("norm_cv")
    ratio = figures.get("delta_cv")
    kappa = figures.get("kappa") or {}

    by_dcv = ""
    if _finite(ratio):
        by_dcv = "dnorm" if ratio >= DELTA_CV_THRESHOLD else "qnorm"
        reasons.append(
            f"ΔCV {ratio:.2f}× {'≥' if by_dcv == 'dnorm' else '<'} {DELTA_CV_THRESHOLD:.2f} → {by_dcv} "
            "(paper: RetroMAE 6.1× → dnorm, Contriever 1.3× → qnorm)"
        )
    by_kappa = ""
    if _finite(kappa.get("qnorm")) and _finite(kappa.get("dnorm")):
        by_kappa = "qnorm" if kappa["qnorm"] <= kappa["dnorm"] else "dnorm"
        reasons.append(
            f"Fisher κ qnorm {kappa['qnorm']:.3g} vs dnorm {kappa['dnorm']:.3g} → {by_kappa} "
            "(experimental)"
        )
    if by_dcv and by_kappa and by_dcv != by_kappa:
        warnings.append(
            f"the two predictors disagree (ΔCV → {by_dcv}, κ → {by_kappa}); ΔCV is the paper's "
            "validated one, κ is experimental"
        )
    side = by_dcv or by_kappa
    if not side:
        side = "qnorm"
        warnings.append(
            "no side predictor ran (probes skipped); qnorm is the default (the paper's most "
            "frequent winner), run without --skip-probes to check"
        )

    if _finite(d):
        if d > CARRIES_D:
            reasons.append(f"magnitude already carries relevance here (Cohen's d {d:.2f})")
        elif d > ANTI_D:
            reasons.append(f"magnitude carries little relevance yet (Cohen's d {d:.2f})")
    if _finite(cv) and cv >= 0.1:
        reasons.append(f"document norms vary (CV {cv:.3f} ≥ 0.1)")

    pretrained_normalized = bool(figures.get("removed_normalize")) or (_finite(d) and d <= ANTI_D)
    if pretrained_normalized:
        why = []
        if figures.get("removed_normalize"):
            why.append("its sentence-transformers folder ends in Normalize")
        if _finite(d) and d <= ANTI_D:
            why.append(
                f"its raw norms carry a negative Cohen's d ({d:.2f}): relevant documents are shorter vectors"
            )
        mode = "cosine"
        reasons.insert(0, NORMALIZE_PRETRAINED.format(why=" (" + "; ".join(why) + ")"))
        reasons.insert(1, CORPUS_PRIOR_ADVICE)
        magnitude, next_steps = "corpus_prior", list(CORPUS_PRIOR_STEPS)
    else:
        mode, magnitude, next_steps = side, "", []

    for row in figures.get("sts") or []:
        if not row.get("symmetric_mode") and row.get("mean_asymmetry", 0) > 0:
            warnings.append(
                "one-sided modes break symmetry (s(a,b) ≠ s(b,a)): for STS, deduplication or "
                "clustering use cosine or dot"
            )
            break
    return Recommendation(
        mode=mode,
        reasons=reasons,
        warnings=warnings,
        side_if_one_sided=side,
        magnitude=magnitude,
        next_steps=next_steps,
    )


def verdict_text(report: Mapping[str, Any]) -> str:
    """The few lines the CLI prints first."""
    rec = report["recommendation"]
    extra = " + corpus prior" if rec.get("magnitude") == "corpus_prior" else ""
    lines = [f"recommended: {rec['mode']}{extra}"]
    lines += [f"  - {r}" for r in rec["reasons"]]
    lines += [f"  $ {c}" for c in rec.get("next_steps") or []]
    if rec["mode"] == "cosine" and rec.get("side_if_one_sided"):
        lines.append(
            f"  - if you fine-tune one-sided anyway, the predictors pick {rec['side_if_one_sided']}"
        )
    lines += [f"  ! {w}" for w in rec["warnings"]]
    mag = report.get("magnitude")
    if mag:
        lines.append(f"magnitude: {mag['verdict']}")
    sym = report.get("symmetry_verdict")
    if sym:
        lines.append(f"symmetry: {sym}")
    return "\n".join(lines)


def write_report(report: Mapping[str, Any], out: str | Path) -> Path:
    """Write ``diagnose.json`` into ``out`` (NaN written as null)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / REPORT_NAME
    path.write_text(json.dumps(to_jsonable(report), indent=2) + "\n")
    return path


def to_jsonable(obj: Any) -> Any:
    """Plain JSON types, NaN/inf as None, numpy scalars unwrapped."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "item"):  # numpy scalars
        return to_jsonable(obj.item())
    return obj
