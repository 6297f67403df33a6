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


#: How the verdict cites the figures it quotes: a pip install has no repository paths to open.
SOURCE = "measured by the magretrieve benchmarks"


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
            + f" NDCG@10 under qnorm fine-tuning vs cosine, {SOURCE})"
        )
    return NORMALIZE_LIKE.format(why=why, losses=losses)


def prior_advice(evidence: Mapping[str, Any]) -> tuple[str, str]:
    """(advice, fit-prior method) for the measured best document prior on top of cosine.

    The method is ``""`` when no measured prior helped: then no prior is recommended.
    """
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
    where = f"{evidence.get('encoder', '')}, {len(evidence.get('seeds') or [])} seeds, {SOURCE}"
    if best.get("method") in (None, "", "none"):
        return (
            "no document prior measured beat fine-tuned cosine out of domain without losing in "
            f"domain ({where}); stay with plain cosine",
            "",
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


TRAIN_COSINE = "magretrieve train --mode cosine --model MODEL --train DATA:train --out RUN"


def prior_steps(method: str) -> list[str]:
    """What to run to carry out the prior advice (only the cosine training without a method)."""
    if not method:
        return [TRAIN_COSINE]
    chosen = "" if method == "auto" else f" --method {method}"
    return [
        TRAIN_COSINE,
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
    #: For a cosine recommendation: what the side predictors say, should one train one-sided
    #: anyway (kept apart from ``reasons``, which only ever support ``mode``).
    one_sided: str = ""

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
       expected to hurt — plus the measured best document prior as the magnitude (none when
       no prior helped), with the commands that apply it. The figures quoted come from the
       committed benchmark results (:mod:`magretrieve.diagnose.evidence`), not from this
       module. What the side predictors say goes to ``one_sided``, never to ``reasons``.
    2. Otherwise the side comes from ΔCV (≥ 2.82 → dnorm, else qnorm); without probes from
       the experimental κ (smaller κ wins); without either, qnorm (the paper's most frequent
       winner) with a warning that no predictor ran. A κ that disagrees with ΔCV is a
       warning, not a reason.
    3. STS figures add a warning that one-sided modes break symmetry.
    """
    reasons: list[str] = []
    warnings: list[str] = []
    d = figures.get("cohens_d")
    cv = figures.get("norm_cv")
    ratio = figures.get("delta_cv")
    kappa = figures.get("kappa") or {}

    by_dcv = dcv_text = ""
    if _finite(ratio):
        by_dcv = "dnorm" if ratio >= DELTA_CV_THRESHOLD else "qnorm"
        dcv_text = (
            f"ΔCV {ratio:.2f}× {'≥' if by_dcv == 'dnorm' else '<'} {DELTA_CV_THRESHOLD:.2f} "
            "(paper: dnorm won for RetroMAE at 6.1×, qnorm for Contriever at 1.3×)"
        )
    by_kappa = kappa_text = ""
    if _finite(kappa.get("qnorm")) and _finite(kappa.get("dnorm")):
        by_kappa = "qnorm" if kappa["qnorm"] <= kappa["dnorm"] else "dnorm"
        kappa_text = (
            f"Fisher κ qnorm {kappa['qnorm']:.3g} vs dnorm {kappa['dnorm']:.3g} (experimental)"
        )
    side = by_dcv or by_kappa
    disagree = bool(by_dcv and by_kappa and by_dcv != by_kappa)

    normalize_like = bool(figures.get("removed_normalize")) or (_finite(d) and d <= ANTI_D)
    one_sided = ""
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
        reasons.append(normalize_advice(" (" + "; ".join(why) + ")", evidence))
        advice, method = prior_advice(evidence)
        reasons.append(advice)
        magnitude = "document_prior" if method else ""
        next_steps = prior_steps(method)
        anyway = "if you fine-tune one-sided anyway (not recommended here)"
        if disagree:
            one_sided = (
                f"{anyway}, the side predictors disagree: {dcv_text} picks {by_dcv}; "
                f"{kappa_text} picks {by_kappa}; ΔCV is the paper's validated one"
            )
        elif side:
            texts = "; ".join(t for t in (dcv_text, kappa_text) if t)
            one_sided = f"{anyway}, the side predictors pick {side}: {texts}"
        else:
            one_sided = f"{anyway}, no side predictor ran (probes skipped): run them to choose"
    else:
        mode = side or "qnorm"
        magnitude, next_steps = "", []
        if by_dcv:
            reasons.append(f"{dcv_text} → {by_dcv}")
        if by_kappa and not disagree:
            reasons.append(f"{kappa_text} → {by_kappa}")
        if disagree:
            warnings.append(
                f"the side predictors disagree: {kappa_text} prefers the other side; ΔCV, the "
                "paper's validated predictor, decides"
            )
        if not side:
            warnings.append(
                "no side predictor ran (probes skipped or over the time budget); qnorm is the "
                "default (the paper's most frequent winner): run the probes (without "
                "--skip-probes, with a larger --time-budget) to check"
            )
        if _finite(d):
            if d > CARRIES_D:
                reasons.append(f"magnitude already carries relevance here (Cohen's d {d:.2f})")
            elif d > ANTI_D:
                reasons.append(f"magnitude carries little relevance yet (Cohen's d {d:.2f})")
        if _finite(cv) and cv >= 0.1:
            reasons.append(f"document norms vary (CV {cv:.3f} ≥ 0.1)")

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
        side_if_one_sided=side or "qnorm",
        magnitude=magnitude,
        next_steps=next_steps,
        one_sided=one_sided,
    )


def headline(rec: Mapping[str, Any]) -> str:
    """The recommended configuration: ``qnorm``, ``cosine``, ``cosine + document prior``."""
    extra = " + document prior" if rec.get("magnitude") == "document_prior" else ""
    return f"{rec.get('mode', '?')}{extra}"


def verdict_lines(rec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The verdict as (kind, text): ``reason``, ``step``, ``if`` and ``warn`` lines, in order.

    The text and the HTML report both render these, so what they say is the one decision
    :func:`recommend` took: reasons support the recommended mode only, and what the side
    predictors say about one-sided training appears once, marked as conditional.
    """
    lines = [("reason", r) for r in rec.get("reasons") or []]
    lines += [("step", c) for c in rec.get("next_steps") or []]
    if rec.get("one_sided"):
        lines.append(("if", rec["one_sided"]))
    lines += [("warn", w) for w in rec.get("warnings") or []]
    return lines


def verdict_text(report: Mapping[str, Any]) -> str:
    """The few lines the CLI prints first."""
    rec = report["recommendation"]
    marks = {"reason": "  -", "step": "  $", "if": "  -", "warn": "  !"}
    lines = [f"recommended: {headline(rec)}"]
    lines += [f"{marks[kind]} {text}" for kind, text in verdict_lines(rec)]
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
