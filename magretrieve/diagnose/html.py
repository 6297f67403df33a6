"""``diagnose.html``: the report as one self-contained page (verdict first, figures inline).

It is written beside ``diagnose.json`` and the PNGs and needs nothing else to open from disk:
the style sheet is in the file and every figure is a ``data:`` URI, so it can be mailed or
attached to a ticket as it is. Every text that comes from the report (encoder names, paths,
verdict sentences) is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

from magretrieve.diagnose.magnitude import ANTI_D, CARRIES_D
from magretrieve.diagnose.report import headline, verdict_lines

HTML_NAME = "diagnose.html"

#: Plot files of one encoder (prefixed with ``<run>-`` for a ``--run``), in report order.
MAGNITUDE_PLOTS = (
    ("norms_relevant_vs_nonrelevant.png", "Raw document norms, relevant vs non-relevant"),
    ("norm_vs_length.png", "Document norm against length"),
    ("score_decomposition.png", "Top hits by cosine and document norm"),
    ("training.png", "Training: γ and mean norms over steps"),
)

STYLE = """
:root { --ink:#1b2430; --muted:#5b6878; --line:#dde3ea; --accent:#1f4e8c; --bg:#f5f7fa; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
  font:15px/1.55 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif; }
header { background:var(--accent); color:#fff; padding:14px clamp(12px,4vw,32px); }
header h1 { margin:0; font-size:1.25rem; }
header p { margin:2px 0 0; opacity:.85; font-size:.9rem; overflow-wrap:anywhere; }
main { max-width:980px; margin:0 auto; padding:16px clamp(10px,3vw,24px) 40px; }
section { background:#fff; border:1px solid var(--line); border-radius:10px; padding:14px 18px;
  margin-bottom:16px; }
h2 { font-size:1.1rem; margin:0 0 8px; }
h3 { font-size:1rem; margin:18px 0 6px; }
.verdict { border-left:6px solid var(--accent); }
.verdict .mode { font-size:1.35rem; font-weight:700; margin:0 0 8px; }
.verdict ul { margin:6px 0; padding-left:20px; }
.warn { color:#8a4b00; }
pre { background:#f3f5f8; border-radius:8px; padding:10px 12px; overflow-x:auto; font-size:.85rem; }
code, pre, td.num { font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace; }
table { border-collapse:collapse; margin:6px 0 10px; font-size:.9rem; display:block; overflow-x:auto; }
th, td { border-bottom:1px solid var(--line); padding:4px 10px; text-align:left; vertical-align:top; }
th { color:var(--muted); font-weight:600; }
td.num { text-align:right; font-variant-numeric:tabular-nums; }
figure { margin:10px 0 16px; }
figure img { display:block; max-width:100%; height:auto; border:1px solid var(--line); border-radius:6px; }
figcaption { margin-top:6px; color:#37414d; }
figcaption strong { color:var(--ink); }
.muted { color:var(--muted); font-size:.88rem; }
"""


def esc(value: Any) -> str:
    """HTML-escaped text of ``value`` (quotes too: it may land in an attribute)."""
    return html.escape(str(value), quote=True)


def num(value: Any, digits: int = 3) -> str:
    """A figure as text: ``–`` for a missing or non-finite one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "–" if value is None else esc(value)
    if not math.isfinite(value):
        return "–"
    if isinstance(value, int):
        return str(value)
    return (
        f"{value:.{digits}g}"
        if abs(value) >= 1e4 or 0 < abs(value) < 1e-3
        else f"{value:.{digits}f}"
    )


def _finite(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def data_uri(path: Path) -> str:
    """The PNG at ``path`` as a ``data:image/png;base64,…`` URI."""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


# ----------------------------------------------------------------------------- readings


def read_norms(m: Mapping[str, Any]) -> str:
    d = m.get("cohens_d")
    means = f"(mean ‖d‖ relevant {num(m.get('mean_norm_relevant'))} vs non-relevant {num(m.get('mean_norm_nonrelevant'))})"
    if not _finite(d):
        return f"Cohen's d is undefined: too few relevant documents were retrieved {means}."
    if d > CARRIES_D:
        what = "relevant documents are longer vectors: magnitude carries relevance"
    elif d <= ANTI_D:
        what = "relevant documents are shorter vectors: raw norms point away from relevance"
    else:
        what = "the two distributions overlap: magnitude carries little relevance yet"
    return f"Cohen's d {d:+.2f}: {what} {means}."


def read_length(m: Mapping[str, Any]) -> str:
    r, rho = m.get("pearson_norm_length"), m.get("spearman_norm_length")
    if not _finite(r):
        return "The correlation is undefined: length or norm is constant."
    if abs(r) < 0.1:
        what = "the norm does not follow length"
    elif r > 0:
        what = "longer documents get larger norms, so a raw-norm score favours long documents"
    else:
        what = "longer documents get smaller norms, so a raw-norm score favours short documents"
    return f"Pearson r {r:+.2f}, Spearman ρ {num(rho, 2)}: {what}."


def read_scores(m: Mapping[str, Any]) -> str:
    nd = m.get("ndcg_at_10") or {}
    cos, dot = nd.get("cosine"), nd.get("dot")
    if not (_finite(cos) and _finite(dot)):
        return "Scores grow with both cos θ and ‖d‖ along the dashed lines of equal ‖d‖·cos θ."
    if dot > cos + 0.005:
        what = "ranking with the raw norm helps"
    elif dot < cos - 0.005:
        what = "ranking with the raw norm costs quality"
    else:
        what = "the raw norm hardly changes the ranking"
    return f"NDCG@10 as it is: cosine {cos:.3f}, dot {dot:.3f}: {what}."


def read_training(t: Mapping[str, Any] | None) -> str:
    if not t:
        return "γq, γd and the mean raw norms over the training steps."
    return (
        f"After {num(t.get('total_steps'))} {esc(t.get('mode') or '')} steps γq = "
        f"{num(t.get('final_gamma_q'), 2)}, γd = {num(t.get('final_gamma_d'), 2)}; mean ‖d⁺‖ "
        f"{num(t.get('first_mean_doc_norm'))} → {num(t.get('last_mean_doc_norm'))}, mean ‖q‖ "
        f"{num(t.get('first_mean_query_norm'))} → {num(t.get('last_mean_query_norm'))}."
    )


READINGS = {
    "norms_relevant_vs_nonrelevant.png": read_norms,
    "norm_vs_length.png": read_length,
    "score_decomposition.png": read_scores,
}


# ----------------------------------------------------------------------------- sections


def _figure(path: Path, title: str, reading: str) -> str:
    # the reading functions escape what they quote from the report; the rest are numbers
    return (
        f'<figure><img src="{data_uri(path)}" alt="{esc(title)}">'
        f"<figcaption><strong>{esc(title)}.</strong> {reading}</figcaption></figure>"
    )


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["<table><thead><tr>", *(f"<th>{esc(h)}</th>" for h in head), "</tr></thead><tbody>"]
    for row in rows:
        cells = (
            f'<td class="num">{num(v)}</td>'
            if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
            else f"<td>{esc(v)}</td>"
            for v in row
        )
        out += ["<tr>", *cells, "</tr>"]
    out.append("</tbody></table>")
    return "".join(out)


def _verdict(report: Mapping[str, Any]) -> str:
    rec = report.get("recommendation") or {}
    lines = verdict_lines(rec)
    parts = [
        '<section class="verdict" aria-labelledby="verdict-title">',
        '<h2 id="verdict-title">Verdict</h2>',
        f'<p class="mode">Recommended: {esc(headline(rec))}</p>',
    ]
    reasons = [text for kind, text in lines if kind == "reason"]
    if reasons:
        parts.append("<ul>" + "".join(f"<li>{esc(r)}</li>" for r in reasons) + "</ul>")
    steps = [text for kind, text in lines if kind == "step"]
    if steps:
        parts.append("<h3>Recipe</h3><pre><code>")
        parts.append("\n".join(f"$ {esc(s)}" for s in steps))
        parts.append("</code></pre>")
    parts += [f"<p>{esc(text[:1].upper() + text[1:])}.</p>" for kind, text in lines if kind == "if"]
    warnings = [text for kind, text in lines if kind == "warn"]
    if warnings:
        parts.append(
            '<ul class="warn">' + "".join(f"<li>{esc(w)}</li>" for w in warnings) + "</ul>"
        )
    mag = (report.get("magnitude") or {}).get("verdict")
    if mag:
        parts.append(f"<p><strong>Magnitude:</strong> {esc(mag)}</p>")
    if report.get("symmetry_verdict"):
        parts.append(f"<p><strong>Symmetry:</strong> {esc(report['symmetry_verdict'])}</p>")
    parts.append("</section>")
    return "".join(parts)


def _magnitude_rows(rows: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    return _table(
        [
            "encoder",
            "mode",
            "Cohen's d ‖d‖",
            "CV ‖d‖",
            "r(‖d‖, len)",
            "ρ(‖d‖, len)",
            "NDCG@10 cos",
            "NDCG@10 dot",
        ],
        [
            (
                name,
                m.get("mode"),
                m.get("cohens_d"),
                m.get("norm_cv"),
                m.get("pearson_norm_length"),
                m.get("spearman_norm_length"),
                (m.get("ndcg_at_10") or {}).get("cosine"),
                (m.get("ndcg_at_10") or {}).get("dot"),
            )
            for name, m in rows
        ],
    )


def _model_figures(
    plots: Mapping[str, Path], prefix: str, m: Mapping[str, Any], training: Any
) -> str:
    out = []
    for name, title in MAGNITUDE_PLOTS:
        path = plots.get(prefix + name)
        if path is None:
            continue
        reading = read_training(training) if name == "training.png" else READINGS[name](m)
        out.append(_figure(path, title, reading))
    return "".join(out)


def _side(report: Mapping[str, Any]) -> str:
    side = report.get("side") or {}
    head = '<section aria-labelledby="side-title"><h2 id="side-title">Which side to normalize</h2>'
    if side.get("skipped") and "delta_cv" not in side:
        return (
            head
            + "<p>Probes skipped (<code>--skip-probes</code>): no side predictor ran.</p></section>"
        )
    dcv, fis = side.get("delta_cv") or {}, side.get("fisher") or {}
    kappa = fis.get("kappa") or {}
    rows: list[tuple[Any, ...]] = []
    if dcv.get("skipped"):
        rows.append(("ΔCV probes", "–", f"skipped: {dcv.get('reason', '')}"))
    else:
        rows.append(
            (
                f"ΔCV = CV‖q‖ dnorm {num(dcv.get('cv_query_norm_dnorm'))} / dot "
                f"{num(dcv.get('cv_query_norm_dot'))} ({dcv.get('steps')} steps)",
                dcv.get("delta_cv"),
                dcv.get("prediction") or "–",
            )
        )
    if fis.get("skipped"):
        rows.append(("Fisher κ (experimental)", "–", f"skipped: {fis.get('reason', '')}"))
    else:
        rows.append(
            (
                f"Fisher κ qnorm / dnorm (experimental, N={fis.get('n_examples')})",
                f"{num(kappa.get('qnorm'))} / {num(kappa.get('dnorm'))}",
                fis.get("prediction") or "–",
            )
        )
    table = _table(["predictor", "value", "picks"], rows)
    reading = []
    if not dcv.get("skipped"):
        reading.append(
            f"ΔCV {num(dcv.get('delta_cv'), 2)} against the threshold "
            f"{num(dcv.get('threshold'), 2)} picks {esc(dcv.get('prediction') or '–')}"
        )
    if not fis.get("skipped"):
        reading.append(
            f"the smaller Fisher κ picks {esc(fis.get('prediction') or '–')} (experimental)"
        )
    rec = report.get("recommendation") or {}
    if rec.get("mode") == "cosine":
        reading.append(
            "these matter only if you fine-tune one-sided anyway: the recommendation is cosine"
        )
    text = "; ".join(reading)
    return head + table + f"<p>{text[:1].upper() + text[1:]}.</p></section>"


def _symmetry(report: Mapping[str, Any], plots: Mapping[str, Path]) -> str:
    rows = report.get("sts") or []
    if not rows:
        return ""
    out = [
        '<section aria-labelledby="sts-title"><h2 id="sts-title">Task symmetry</h2>',
        _table(
            ["mode", "Spearman s(a,b)", "Spearman s(b,a)", "mean |s(a,b)−s(b,a)|", "max"],
            [
                (
                    r.get("mode"),
                    r.get("spearman_ab"),
                    r.get("spearman_ba"),
                    r.get("mean_asymmetry"),
                    r.get("max_asymmetry"),
                )
                for r in rows
            ],
        ),
    ]
    reading = esc(report.get("symmetry_verdict") or "")
    if "sts_symmetry.png" in plots:
        out.append(_figure(plots["sts_symmetry.png"], "STS Spearman in both orders", reading))
    else:
        out.append(f"<p>{reading}</p>")
    out.append("</section>")
    return "".join(out)


def _validation(report: Mapping[str, Any]) -> str:
    rows = report.get("validation")
    if rows is None:
        return ""
    head = '<section aria-labelledby="val-title"><h2 id="val-title">Predictors against measured runs</h2>'
    if not rows:
        return head + "<p>No qnorm/dnorm results found yet.</p></section>"
    table = _table(
        ["data", "NDCG@10 qnorm", "NDCG@10 dnorm", "better", "ΔCV picks", "κ picks"],
        [
            (
                r.get("data"),
                r.get("qnorm"),
                r.get("dnorm"),
                r.get("better"),
                r.get("delta_cv") or "–",
                r.get("kappa") or "–",
            )
            for r in rows
        ],
    )
    agree = sum(bool(r.get("delta_cv_agrees")) for r in rows)
    return head + table + f"<p>ΔCV picked the better side on {agree} of {len(rows)}.</p></section>"


def _timing(report: Mapping[str, Any]) -> str:
    seconds = report.get("seconds")
    estimate = (report.get("plan") or {}).get("estimate_seconds")
    said = f" (estimated {num(estimate, 1)} s before it started)" if _finite(estimate) else ""
    return f"Measured in {num(seconds, 1)} s{said}."


def render_html(report: Mapping[str, Any], plot_paths: Sequence[str | Path] = ()) -> str:
    """The page for ``report`` (a :func:`~magretrieve.diagnose.diagnose` dict) with its plots."""
    plots = {Path(p).name: Path(p) for p in plot_paths if Path(p).is_file()}
    enc = report.get("encoder") or {}
    subtitle = (
        f"{esc(report.get('model', ''))} on {esc(report.get('data', ''))} · mode "
        f"{esc(enc.get('mode', ''))}, γq {num(enc.get('gamma_q'), 2)}, γd {num(enc.get('gamma_d'), 2)}"
    )
    mag = report.get("magnitude") or {}
    runs = report.get("runs") or []
    body = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>magretrieve diagnose: {esc(report.get('model', ''))}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<header><h1>magretrieve diagnose</h1><p>{subtitle}</p></header><main>",
        _verdict(report),
        '<section aria-labelledby="mag-title"><h2 id="mag-title">Magnitude signal</h2>',
        _magnitude_rows(
            [(report.get("name") or "encoder", mag)]
            + [(str(r.get("name") or r.get("model", "")), r) for r in runs]
        ),
        _model_figures(plots, "", mag, report.get("training")),
        "</section>",
    ]
    for run in runs:
        name = Path(str(run.get("model", ""))).name
        figures = _model_figures(plots, f"{name}-", run, run.get("training"))
        if figures:
            body.append(f"<section><h2>Trained run {esc(name)}</h2>{figures}</section>")
    body += [_side(report), _symmetry(report, plots), _validation(report)]
    body.append(
        f'<p class="muted">{_timing(report)} The figures are also in diagnose.json beside this '
        "file; the diagnose guide of the magretrieve documentation explains each one.</p>"
    )
    body.append("</main></body></html>\n")
    return "".join(body)


def write_html(report: Mapping[str, Any], out: str | Path) -> Path:
    """Write ``diagnose.html`` into ``out`` from the report and the PNGs it lists."""
    path = Path(out) / HTML_NAME
    path.write_text(render_html(report, report.get("plots") or []), encoding="utf-8")
    return path
