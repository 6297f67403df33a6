"""``magretrieve export SRC DEST``: ONNX query/document graphs + manifest, parity-checked."""

from __future__ import annotations

import json

import click

from magretrieve.cli._common import device_option
from magretrieve.cli._group import main
from magretrieve.core.similarity import MODES


def _print_report(dest: str) -> None:
    from magretrieve.core.manifest import Manifest

    manifest = Manifest.load(dest, verify=False)
    parity = manifest.parity
    click.echo(
        f"mode {manifest.mode} (γq={manifest.gamma_q:.4g}, γd={manifest.gamma_d:.4g}), "
        f"dim {manifest.dimension}, exporter {manifest.exporter.get('name')} "
        f"opset {manifest.exporter.get('opset')}"
    )
    opt = manifest.exporter.get("optimizer") or {}
    if opt.get("applied"):
        ops = ", ".join(f"{n} {k}" for k, n in sorted(opt.get("fused_operators", {}).items()))
        click.echo(f"fused: {ops}")
    elif opt:
        click.echo(f"not fused: {opt.get('reason', 'unknown reason')}")
    click.echo(
        f"fp32 parity vs PyTorch: max abs diff {parity.get('max_abs_diff', float('nan')):.2e}, "
        f"max relative norm error {parity.get('max_rel_norm_err', float('nan')):.2e}"
    )
    report = manifest.quantization_report
    label = manifest.quantization or "int8"
    if manifest.runtimes:
        click.echo(f"runs on: {', '.join(manifest.runtimes)}")
    if report:
        for side in ("query", "document"):
            r = report[side]
            click.echo(
                f"{label} {side} vs fp32: cosine min {r['min_cosine']:.5f} mean {r['mean_cosine']:.5f}; "
                f"relative norm error max {r['max_rel_norm_err']:.4f} mean {r['mean_rel_norm_err']:.4f}"
            )
        if "eval" in report:
            ev = report["eval"]
            click.echo(
                f"NDCG@10 on {ev['data']}: fp32 {ev['fp32']['ndcg@10']:.4f}, "
                f"{label} {ev['int8']['ndcg@10']:.4f} (Δ {ev['ndcg@10_delta'] * 100:+.2f} points)"
            )
        worst = min(report["query"]["min_cosine"], report["document"]["min_cosine"])
        if worst < 0.99:
            click.secho(
                f"warning: {label} vectors agree with fp32 only to cosine {worst:.4f}; "
                "check retrieval quality (--eval-data) before serving them",
                fg="yellow",
                err=True,
            )


@main.command("export")
@click.argument("src")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option(
    "--mode",
    type=click.Choice(MODES),
    default=None,
    help="Similarity mode (default: the run's own mode, or cosine for a plain model folder).",
)
@click.option("--gamma-q", type=float, default=None, help="γq for --mode learnable.")
@click.option("--gamma-d", type=float, default=None, help="γd for --mode learnable.")
@click.option(
    "--quantize",
    type=click.Choice(["int8", "int8-static"]),
    default=None,
    help="After the fp32 graphs pass parity: int8 = onnxruntime dynamic int8 (ONNX); "
    "int8-static = NNCF static int8 for OpenVINO (IR, needs --calibration-data and "
    "magretrieve[openvino-int8]; faster, docs/export.md).",
)
@click.option(
    "--calibration-data",
    default=None,
    metavar="DIR",
    help="BEIR folder (corpus.jsonl, queries.jsonl) whose texts calibrate --quantize int8-static.",
)
@click.option(
    "--calibration-size",
    type=int,
    default=None,
    help="Calibration documents and queries each for int8-static (default 320).",
)
@click.option(
    "--optimize/--no-optimize",
    default=True,
    show_default=True,
    help="Fuse BERT-like graphs (attention, layer norm, GELU) with onnxruntime's transformer "
    "optimizer; the fused graphs are parity-checked. Other models export unfused.",
)
@click.option(
    "--exporter",
    type=click.Choice(["auto", "dynamo", "torchscript"]),
    default="auto",
    show_default=True,
    help="torch.onnx exporter; auto tries TorchScript (fuses fully), then dynamo.",
)
@click.option(
    "--eval-data",
    default=None,
    metavar="DIR[:split]",
    help="BEIR folder (and split) on which to report NDCG@10 of fp32 vs int8.",
)
@device_option("Also check the graphs' parity on onnxruntime's CUDA provider (cuda).")
@click.option("--overwrite", is_flag=True, help="Replace an existing export folder at DEST.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON at the end.")
def export_cmd(
    src: str,
    dest: str,
    mode: str | None,
    gamma_q: float | None,
    gamma_d: float | None,
    quantize: str | None,
    optimize: bool,
    exporter: str,
    eval_data: str | None,
    calibration_data: str | None,
    calibration_size: int | None,
    device: str,
    overwrite: bool,
    as_json: bool,
) -> None:
    """Export SRC (a magretrieve run, a Hugging Face or sentence-transformers folder, or the
    alias all-MiniLM-L6-v2) to DEST: query.onnx, document.onnx, tokenizer and magretrieve.json.

    Every export is checked against PyTorch (max abs diff ≤ 1e-4, relative norm error ≤ 1e-5)
    and nothing is written when the check fails.
    """
    from magretrieve.cli._common import require_torch

    require_torch("magretrieve export")
    from magretrieve.export import export_model

    export_model(
        src,
        dest,
        mode=mode,
        gamma_q=gamma_q,
        gamma_d=gamma_d,
        quantize=quantize,
        optimize=optimize,
        overwrite=overwrite,
        exporter=exporter,
        eval_data=eval_data,
        echo=lambda msg: click.echo(msg, err=True),
        device=device,
        calibration_data=calibration_data,
        calibration_size=calibration_size,
    )
    _print_report(dest)
    if as_json:
        from magretrieve.core.manifest import Manifest

        click.echo(json.dumps(Manifest.load(dest, verify=False).to_dict(), indent=2))
