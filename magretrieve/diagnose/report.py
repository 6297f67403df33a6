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
from typing import Any, TypeGuard

from magretrieve.diagnose.evidence import load_evidence
from magretrieve.diagnose.magnitude import ANTI_D, CARRIES_D
from magretrieve.diagnose.side import DELTA_CV_THRESHOLD

REPORT_NAME = "diagnose.json"

NORMALIZE_LIKE = (
    "this encoder behaves like one pretrained through a Normalize stage{why}: raw-norm one-sided "
    "modes are expected to hurt on such encoders{losses} and a few hundred training pairs do not "
    "turn raw lengths around - use cosine (fine-tune under cosine if you have pairs)"
)


def _pct(new: float, old: float) -> str:
    return f"{100 * (new / old - 1):+.1f} %" if old else "n/a"


def normalize_advice(why: str, evidence: Mapping[str, Any]) -> str:
    """The Normalize-like verdict, quoting the measured qnorm losses when they are on file."""
    losses = ""
    cos, qn = evidence.get("cosine") or {}, evidence.get("qnorm") or {}
    sets = [s for s in (evidence.get("in_domain"), evidence.get("out_of_domain")) if s]
    if sets and all(s in cos and s in qn for s in sets):
        parts = [f"{cos[s] - qn[s]:.2f} on {s.split(':')[0]}" for s in sets]
        losses = (
            f" ({evidence.get('encoder', 'the measured encoder')} lost "
            + " and ".join(parts)
            + f" NDCG@10 under qnorm fine-tuning vs cosine, {evidence.get('quality_source', '')})"
        )
    return NORMALIZE_LIKE.format(why=why, losses=losses)


def prior_advice(evidence: Mapping[str, Any]) -> tuple[str, str]:
    """(advice, fit-prior method) for the measured best document prior on top of cosine."""
    best = evidence.get("best_prior") or {}
    sets = [s for s in (evidence.get("in_domain"), evidence.get("out_of_domain")) if s]
    nd, base = best.get("ndcg") or {}, best.get("cosine") or {}
    if not best or not all(s in nd and s in base for s in sets):
        return (
            "for a document magnitude, add a document prior on top of the cosine model "
            "(magretrieve fit-prior chooses one on your training queries, plain cosine always a "
            "candidate)",
            "auto",
        )
    figures = ", ".join(
        f"{s.split(':')[0]} {base[s]:.3f} -> {nd[s]:.3f} ({_pct(nd[s], base[s])})" for s in sets
    )
    where = f"{evidence.get('encoder', '')}, {len(evidence.get('seeds') or [])} seeds, " + str(
        best.get("source", "")
    )
    if best.get("method") in (None, "", "none"):
        return (
            "no document prior measured beat fine-tuned cosine out of domain without losing in "
            f"domain ({where}); stay with plain cosine - fit-prior keeps cosine unless your own "
            "training queries say otherwise",
            "auto",
        )
    goal = (
        ""
        if evidence.get("goal_met")
        else "; the gain is below the +2 % out-of-domain mark the project set, so expect little"
    )
    return (
        f"for a document magnitude, add the measured best document prior, {best.get('row')}, on "
        f"top of the cosine model (NDCG@10 over fine-tuned cosine: {figures}; {where}){goal}. "
        "Its parameters are chosen on your training queries with plain cosine always a "
        "candidate, so it stays off when it does not help them",
        str(best.get("method")),
    )


def prior_steps(method: str) -> list[str]:
    """What to run to carry out the prior advice."""
    chosen = "" if method == "auto" else f" --method {method}"
    return [
        "magretrieve train --mode cosine --model MODEL --train DATA:train --out RUN",
        f"magretrieve fit-prior --model RUN --data DATA:train --out prior.json{chosen}",
        "magretrieve rescale --source STORE --target NEW_STORE --prior-file prior.json",
    ]


@dataclass
class Recommendation:
    """The mode to use, why, and what to watch out for."""

    mode: str
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: The side each predictor picks if one-sided training is done anyway.
    side_if_one_sided: str = ""
    #: A magnitude to add on top of ``mode`` ("document_prior"), or "" for none.
    magnitude: str = ""
    #: Commands that carry the advice out, in order.
    next_steps: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _finite(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and math.isfinite(x)


def recommend(figures: Mapping[str, Any]) -> Recommendation:
    """Advice from measured figures.

    Keys read (all optional): ``removed_normalize`` (bool), ``cohens_d``, ``norm_cv``,
    ``delta_cv`` (ratio), ``kappa`` ({"qnorm": κ, "dnorm": κ}), ``sts`` (rows of
    :func:`~magretrieve.diagnose.symmetry.symmetry_check`).

    Rules, in order:
    1. An encoder that behaves like a normalization-pretrained one (a removed Normalize stage,
       or Cohen's d ≤ −0.2): cosine — raw norms point away from relevance, one-sided modes are
       expected to hurt — plus the measured best document prior as the magnitude, with the
       commands that apply it. The figures quoted come from the committed benchmark results
       (:mod:`magretrieve.diagnose.evidence`), not from this module.
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

    normalize_like = bool(figures.get("removed_normalize")) or (_finite(d) and d <= ANTI_D)
    if normalize_like:
        why = []
        if figures.get("removed_normalize"):
            why.append("its sentence-transformers folder ends in Normalize")
        if _finite(d) and d <= ANTI_D:
            why.append(
                f"its raw norms carry a negative Cohen's d ({d:.2f}): relevant documents are shorter vectors"
            )
        mode = "cosine"
        evidence = load_evidence()
        reasons.insert(0, normalize_advice(" (" + "; ".join(why) + ")", evidence))
        advice, method = prior_advice(evidence)
        reasons.insert(1, advice)
        magnitude, next_steps = "document_prior", prior_steps(method)
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
    extra = " + document prior" if rec.get("magnitude") == "document_prior" else ""
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
