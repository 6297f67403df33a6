"""``export_model``: encoder → staged export folder → parity check → atomic publish.

Everything is built in a hidden temporary folder beside the target. Only when both graphs
pass parity (fp32) is the folder put in place (:mod:`magretrieve.export.publish`: a rename,
or an atomic swap with an existing export), so a failed or killed export leaves the old
export or the new one, and an existing export is replaced only with ``overwrite=True``.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from magretrieve.core.errors import ConfigError, MagRetrieveError
from magretrieve.core.manifest import MANIFEST_NAME, GraphSpec, Manifest, hash_folder
from magretrieve.export.publish import make_staging, publish, recover
from magretrieve.export.quantize import INT8_OPERATORS, quantize_int8
from magretrieve.stores.base import fsync_dir

if TYPE_CHECKING:  # pragma: no cover
    from magretrieve.export.static_int8 import Calibration
    from magretrieve.train.encoder import Encoder

logger = logging.getLogger(__name__)

GRAPH_FILES = {"query": "query.onnx", "document": "document.onnx"}
#: Static int8 graphs are OpenVINO IR (each ``.xml`` has its weights in a ``.bin`` beside it).
STATIC_INT8_FILES = {"query": "query.xml", "document": "document.xml"}
#: ``quantize=`` values: onnxruntime's dynamic int8, NNCF's static int8 for OpenVINO.
QUANTIZATIONS = ("int8", "int8-static")
TOKENIZER_FILE = "tokenizer.json"
EXPORTER_CHOICES = ("auto", "dynamo", "torchscript")
#: What ``exporter="auto"`` tries, in order. TorchScript first, by measurement
#: (docs/export.md): its trace of eager attention fuses into onnxruntime's Attention and
#: EmbedLayerNormalization operators, dynamo's graph only into layer norm / GELU.
AUTO_ORDER = ("torchscript", "dynamo")


def _versions(exporter: str) -> dict[str, str]:
    import onnx
    import onnxruntime
    import torch
    import transformers

    import magretrieve

    versions = {
        "magretrieve": magretrieve.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
    }
    if exporter == "dynamo":
        import onnxscript

        versions["onnxscript"] = onnxscript.__version__
    return versions


def _fsync_file(path: Path) -> None:
    if path.is_file():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _check_target(target: Path, overwrite: bool) -> None:
    """Refuse an existing target (unless overwrite) and an unwritable location, before any work."""
    if target.exists() or target.is_symlink():
        if not target.is_dir():
            raise ConfigError(f"{target}: exists and is not a folder; choose another target")
        if not overwrite:
            raise ConfigError(f"{target}: already exists; pass --overwrite to replace it")
        if not (target / MANIFEST_NAME).is_file() and any(target.iterdir()):
            raise ConfigError(
                f"{target}: exists and is not an export folder (no {MANIFEST_NAME}); "
                "refusing to replace it even with --overwrite"
            )
    ancestor = target.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(f"{target}: cannot write there ({ancestor} is not writable)")


def _load_encoder(
    model: Any, mode: str | None, gamma_q: float | None, gamma_d: float | None
) -> Encoder:
    from magretrieve.train.encoder import Encoder

    if isinstance(model, Encoder):
        if mode is not None and mode != model.config.mode:
            raise ConfigError(
                f"the encoder is in mode {model.config.mode!r}; load it with mode={mode!r} instead"
            )
        encoder = model
    else:
        encoder = Encoder.load(model, mode=mode, gamma_q=gamma_q, gamma_d=gamma_d, device="cpu")
    if str(encoder.device) != "cpu":
        raise ConfigError(
            f"export runs on CPU; move the encoder to 'cpu' (it is on {encoder.device})"
        )
    if not getattr(encoder.tokenizer, "is_fast", False):
        raise ConfigError(
            "export needs a fast (Rust) tokenizer with a tokenizer.json: serving tokenizes with the "
            "`tokenizers` library; this model only has a slow Python tokenizer"
        )
    encoder.clamp_max_lengths()  # also done at load; an Encoder object may have been edited
    encoder.eval()
    return encoder


def _write_manifest(
    folder: Path,
    encoder: Encoder,
    *,
    dimension: int,
    exporter: dict[str, Any],
    versions: dict[str, str],
    parity: dict[str, Any],
    quantization: str | None = None,
    quantization_report: dict[str, Any] | None = None,
    graph_files: dict[str, str] = GRAPH_FILES,
    runtimes: tuple[str, ...] | None = None,
) -> Manifest:
    """Hash every file in ``folder`` and write its manifest.

    ``save`` seals it: ``model_fingerprint`` from the file hashes and settings, and the
    manifest's own ``manifest_sha256``.
    """
    from magretrieve.core import similarity
    from magretrieve.export.graphs import OUTPUT_NAME, input_names

    sim = encoder.similarity
    cfg = encoder.config
    inputs = input_names(encoder)
    files = hash_folder(folder)
    graphs = {
        side: GraphSpec(
            file=graph_files[side],
            inputs=list(inputs),
            output=OUTPUT_NAME,
            gamma=gamma,
            contract=similarity.vector_contract(gamma),
            head=encoder.head_manifest(side) if hasattr(encoder, "head_manifest") else None,
        )
        for side, gamma in (("query", sim.gamma_q), ("document", sim.gamma_d))
    }
    # the exported settings: γ as trained (learnable γ lives in the weights, not the config)
    exported = replace(
        cfg,
        mode=sim.mode,
        gamma_q=sim.gamma_q,
        gamma_d=sim.gamma_d,
        max_query_length=int(cfg.max_query_length),
        max_document_length=int(cfg.max_document_length),
        norm_scale=float(cfg.norm_scale),
        extra=dict(cfg.extra),
    )
    exported.validate()
    manifest = Manifest(
        encoder=exported,
        dimension=dimension,
        graphs=graphs,
        tokenizer=TOKENIZER_FILE,
        files=files,
        model_fingerprint="",  # computed from the content by Manifest.save
        quantization=quantization,
        pad_token_id=int(encoder.tokenizer.pad_token_id or 0),
        exporter=exporter,
        versions=versions,
        parity=parity,
        quantization_report=quantization_report,
        runtimes=list(runtimes) if runtimes else None,
        folder=folder,
    )
    manifest.save(folder)
    return manifest


def _parity(
    encoder: Encoder, folder: Path, reference: dict[str, Any], strict: bool
) -> dict[str, Any]:
    from magretrieve.export import parity
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    report = parity.measure(reference, OnnxEncoder.load(folder))
    if strict:
        parity.check(report, str(folder))
    return report


def _fuse(encoder: Encoder, folder: Path, backup: Path, say: Callable[[str], None]) -> dict:
    """Fuse both graphs in place with onnxruntime's transformer optimizer; return what applied.

    The unfused graphs are kept in ``backup`` so that a fused graph that misses parity can be
    replaced by its unfused original. A model the optimizer does not know, or an optimizer
    crash, leaves the graphs unfused and says why (the export still succeeds).
    """
    from magretrieve.export.quantize import optimize_bert, optimizer_model_type

    tcfg = encoder.transformer.config
    model_type = str(getattr(tcfg, "model_type", ""))
    facts: dict[str, Any] = {"tool": "onnxruntime.transformers.optimizer"}
    if optimizer_model_type(model_type) is None:
        reason = f"model type {model_type!r} is not BERT-like; graphs exported unfused"
        say(f"not fusing: {reason}")
        return facts | {"applied": False, "reason": reason}
    backup.mkdir(parents=True, exist_ok=True)
    fused_ops: dict[str, dict[str, int]] = {}
    try:
        for side, name in GRAPH_FILES.items():
            say(f"fusing the {side} graph (onnxruntime transformer optimizer)")
            shutil.copy2(folder / name, backup / name)
            fused = folder / f"{name}.fused"
            done = optimize_bert(
                folder / name,
                fused,
                model_type=model_type,
                num_heads=int(tcfg.num_attention_heads),
                hidden_size=int(tcfg.hidden_size),
            )
            fused_ops[side] = done["fused_operators"]
            fused.replace(folder / name)
    except Exception as exc:  # the optimizer is best effort: an unfused graph is still right
        _restore_unfused(folder, backup)
        reason = f"optimizer failed ({type(exc).__name__}: {str(exc)[:200]}); graphs unfused"
        say(f"not fusing: {reason}")
        return facts | {"applied": False, "reason": reason}
    ops = fused_ops["document"]
    attention = any("Attention" in op for op in ops)
    if not attention:
        say("note: attention was not fused (layer norm / GELU fusions only)")
    return facts | {
        "applied": True,
        "model_type": optimizer_model_type(model_type),
        "fused_operators": ops,
        "attention_fused": attention,
    }


def _restore_unfused(folder: Path, backup: Path) -> None:
    for name in GRAPH_FILES.values():
        (folder / f"{name}.fused").unlink(missing_ok=True)
        if (backup / name).is_file():
            shutil.copy2(backup / name, folder / name)


def _build_fp32(
    encoder: Encoder,
    folder: Path,
    exporter: str,
    optimize: bool,
    reference: dict[str, Any],
    say: Callable[[str], None],
) -> Manifest:
    """Export both sides with one exporter into ``folder`` and prove parity (raises otherwise).

    With ``optimize`` the graphs are fused and the *fused* graphs must pass parity; if they
    do not, the unfused graphs are checked instead and the manifest says why they are unfused.
    """
    from magretrieve.export.graphs import export_side

    folder.mkdir(parents=True, exist_ok=False)
    facts: dict[str, Any] = {}
    for side, name in GRAPH_FILES.items():
        say(f"exporting the {side} graph ({exporter} exporter)")
        facts = export_side(encoder, side, folder / name, exporter=exporter)
    encoder.tokenizer.save_pretrained(str(folder))
    if not (folder / TOKENIZER_FILE).is_file():
        raise ConfigError("the tokenizer did not save a tokenizer.json; serving cannot tokenize")
    backup = folder.parent / f"{folder.name}.unfused"
    if optimize:
        facts["optimizer"] = _fuse(encoder, folder, backup, say)
    else:
        facts["optimizer"] = {"applied": False, "reason": "not requested (--no-optimize)"}
    dim = int(reference["query"].shape[1])
    try:
        manifest = _write_manifest(
            folder, encoder, dimension=dim, exporter=facts, versions=_versions(exporter), parity={}
        )
        say("checking parity against PyTorch")
        try:
            report = _parity(encoder, folder, reference, strict=True)
        except MagRetrieveError as exc:
            if not facts["optimizer"].get("applied"):
                raise
            say(f"the fused graphs missed parity ({exc}); checking the unfused graphs")
            _restore_unfused(folder, backup)
            facts["optimizer"] = facts["optimizer"] | {
                "applied": False,
                "reason": f"fused graphs missed parity: {str(exc)[:200]}",
            }
            manifest = _write_manifest(
                folder,
                encoder,
                dimension=dim,
                exporter=facts,
                versions=_versions(exporter),
                parity={},
            )
            report = _parity(encoder, folder, reference, strict=True)
    finally:
        shutil.rmtree(backup, ignore_errors=True)
    manifest.parity = {
        "max_abs_diff": report["max_abs_diff"],
        "max_rel_norm_err": report["max_rel_norm_err"],
        "query": report["query"],
        "document": report["document"],
    }
    manifest.save(folder)
    return manifest


def export_model(
    model: Any,
    out_dir: str | Path,
    *,
    mode: str | None = None,
    gamma_q: float | None = None,
    gamma_d: float | None = None,
    quantize: str | None = None,
    optimize: bool = True,
    overwrite: bool = False,
    exporter: str = "auto",
    eval_data: str | Path | None = None,
    echo: Callable[[str], None] | None = None,
    device: str = "cpu",
    calibration_data: str | Path | None = None,
    calibration_size: int | None = None,
) -> Path:
    """Export an encoder (an :class:`Encoder` or a model folder/alias) to ``out_dir``.

    Writes ``query.onnx``, ``document.onnx``, the tokenizer files and ``magretrieve.json``.
    ``exporter="auto"`` tries the TorchScript exporter (its graph fuses fully) and falls back
    to dynamo if it fails or misses parity. ``optimize`` (default on) fuses BERT-like graphs
    with onnxruntime's transformer optimizer; the fused graphs are what parity checks, and
    the manifest's ``exporter.optimizer`` records the fusions (or why there are none).

    ``quantize="int8"`` keeps only int8 graphs (onnxruntime dynamic int8), after the fp32
    graphs passed parity, and records int8-vs-fp32 agreement (and NDCG@10 on ``eval_data``,
    ``DIR[:split]``) in the manifest. ``quantize="int8-static"`` does the same with NNCF's
    static int8, calibrated on ``calibration_size`` documents and queries of
    ``calibration_data`` (a BEIR folder), written as OpenVINO IR that only the ``openvino``
    runtimes run (:mod:`magretrieve.export.static_int8`). ``device="cuda"`` also checks the fp32 graphs' parity
    on onnxruntime's CUDA provider (export itself traces on the CPU). Returns the folder.
    """
    say = echo or (lambda msg: logger.info(msg))
    target = Path(out_dir).expanduser()
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ConfigError(
            f"unknown quantization {quantize!r}; choose one of {', '.join(QUANTIZATIONS)}"
        )
    calibration = _check_calibration(quantize, calibration_data, calibration_size)
    if exporter not in EXPORTER_CHOICES:
        raise ConfigError(
            f"unknown exporter {exporter!r}; choose one of {', '.join(EXPORTER_CHOICES)}"
        )
    if eval_data is not None and quantize is None:
        raise ConfigError("--eval-data compares int8 with fp32; use it together with --quantize")
    recover(target, say)  # what an earlier, killed export to this target left behind
    _check_target(target, overwrite)
    if device != "cpu":
        from magretrieve.serving.onnx_encoder import check_device

        check_device(device)  # no CUDA provider: refuse before the slow part
    dataset = None
    if eval_data is not None:
        from magretrieve.data.readers import load_beir

        dataset = load_beir(eval_data)  # fail on bad data before the slow part
    encoder = _load_encoder(model, mode, gamma_q, gamma_d)

    from magretrieve.export import parity

    reference = parity.reference_vectors(encoder, parity.PARITY_TEXTS)

    created: list[Path] = []
    parent = target.parent
    while not parent.exists():
        created.append(parent)
        parent = parent.parent
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = make_staging(target)
    except OSError as exc:
        raise ConfigError(f"{target}: cannot create the export folder ({exc})") from None
    try:
        fp32_dir = staging / "fp32"
        attempts: list[dict[str, str]] = []
        manifest: Manifest | None = None
        for name in AUTO_ORDER if exporter == "auto" else (exporter,):
            try:
                manifest = _build_fp32(encoder, fp32_dir, name, optimize, reference, say)
                break
            except MagRetrieveError as exc:
                if exporter != "auto" or isinstance(exc, ConfigError):
                    raise
                attempts.append({"exporter": name, "error": str(exc)})
            except OSError:
                raise  # disk full, read-only folder: the other exporter would fail the same way
            except Exception as exc:  # an exporter crash is not the user's fault: try the other
                if exporter != "auto":
                    raise
                attempts.append({"exporter": name, "error": f"{type(exc).__name__}: {exc}"})
            logger.warning(
                "%s exporter failed (%s); trying the next one", name, attempts[-1]["error"]
            )
            say(f"{name} exporter failed: {attempts[-1]['error'][:300]}")
            shutil.rmtree(fp32_dir, ignore_errors=True)
        if manifest is None:
            raise MagRetrieveError(
                "no exporter produced a graph that passes parity: "
                + "; ".join(f"{a['exporter']}: {a['error'][:200]}" for a in attempts)
            )
        if attempts:
            manifest.exporter["failed_attempts"] = attempts
            manifest.save(fp32_dir)
        if device != "cpu":
            _device_parity(encoder, fp32_dir, manifest, reference, device, say)
        final_dir = fp32_dir
        if quantize is not None:
            final_dir = _build_int8(
                encoder,
                fp32_dir,
                staging / "int8",
                manifest,
                reference,
                dataset,
                say,
                scheme=quantize,
                calibration=calibration,
            )
        for item in final_dir.iterdir():  # durable before it becomes visible
            _fsync_file(item)
        fsync_dir(final_dir)
        publish(final_dir, target, staging)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in created:  # parents this call created, deepest first
            try:
                folder.rmdir()
            except OSError:
                break
        if isinstance(exc, OSError):  # disk full, read-only: one line, the target untouched
            where = exc.filename or staging
            raise ConfigError(
                f"{where}: {exc.strerror or exc} while writing the export; {target} was not changed"
            ) from None
        raise
    shutil.rmtree(staging, ignore_errors=True)
    say(f"wrote {target}")
    return target


def _device_parity(
    encoder: Encoder,
    folder: Path,
    manifest: Manifest,
    reference: dict[str, Any],
    device: str,
    say: Callable[[str], None],
) -> None:
    """Check the fp32 graphs on ``device`` against the same PyTorch reference (same limits)."""
    from magretrieve.export import parity
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    say(f"checking parity on {device} (onnxruntime {device} provider) against PyTorch")
    report = parity.measure(reference, OnnxEncoder.load(folder, device=device))
    parity.check(report, f"{folder} on {device}")
    manifest.parity[device] = {
        "max_abs_diff": report["max_abs_diff"],
        "max_rel_norm_err": report["max_rel_norm_err"],
    }
    manifest.save(folder)


def _copy_non_graph_files(fp32_dir: Path, int8_dir: Path) -> None:
    """Copy the tokenizer files (everything but the ONNX graphs and the manifest) to ``int8_dir``."""
    for item in fp32_dir.iterdir():
        if item.is_file() and item.suffix != ".onnx" and item.name != MANIFEST_NAME:
            shutil.copy2(item, int8_dir / item.name)


def quantize_folder(
    fp32_dir: Path,
    int8_dir: Path,
    operators: tuple[str, ...] | None = INT8_OPERATORS,
    say: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Quantize an export's graphs into ``int8_dir`` and copy its other files (not the manifest).

    ``operators`` as in :func:`~magretrieve.export.quantize.quantize_int8` (None: every type the
    quantizer knows). Returns the quantizer's facts.
    """
    facts: dict[str, Any] = {}
    for name in GRAPH_FILES.values():
        say(f"quantizing {name} to int8 (dynamic)")
        facts = quantize_int8(fp32_dir / name, int8_dir / name, operators)
    _copy_non_graph_files(fp32_dir, int8_dir)
    return facts


def _check_calibration(
    quantize: str | None, folder: str | Path | None, size: int | None
) -> Calibration | None:
    """Calibration texts for ``int8-static`` (refused for the other schemes), before any work."""
    if quantize != "int8-static":
        if folder is not None or size is not None:
            raise ConfigError(
                "--calibration-data/--calibration-size calibrate static int8; use them "
                "with --quantize int8-static"
            )
        return None
    from magretrieve.export.static_int8 import (
        DEFAULT_CALIBRATION_SIZE,
        calibration_texts,
        import_nncf,
    )

    if folder is None:
        raise ConfigError(
            "--quantize int8-static needs --calibration-data DIR: a BEIR folder whose "
            "documents and queries look like what will be served"
        )
    import_nncf()  # a missing extra is refused before the slow export
    return calibration_texts(folder, DEFAULT_CALIBRATION_SIZE if size is None else size)


def _quantize_static_folder(
    fp32_dir: Path,
    int8_dir: Path,
    calibration: Calibration,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """NNCF static int8 of both graphs into OpenVINO IR in ``int8_dir``; copy the other files."""
    from magretrieve.export.static_int8 import quantize_side
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    fp32 = OnnxEncoder.load(fp32_dir)
    facts: dict[str, Any] = {"calibration_data": calibration.source}
    for side, name in STATIC_INT8_FILES.items():
        texts = calibration.texts[side]
        say(f"quantizing the {side} graph to static int8 (NNCF, {len(texts)} calibration texts)")
        facts[side] = quantize_side(fp32, side, texts, int8_dir / name)
    _copy_non_graph_files(fp32_dir, int8_dir)
    return facts


def _build_int8(
    encoder: Encoder,
    fp32_dir: Path,
    int8_dir: Path,
    fp32_manifest: Manifest,
    reference: dict[str, Any],
    dataset: Any,
    say: Callable[[str], None],
    scheme: str = "int8",
    calibration: Calibration | None = None,
) -> Path:
    """Quantize the parity-checked fp32 graphs; report agreement (and NDCG@10) vs fp32."""
    from magretrieve.evaluation.retrieval import evaluate_vectors
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    int8_dir.mkdir()
    if scheme == "int8-static":
        from magretrieve.export.static_int8 import STATIC_INT8_RUNTIMES

        assert calibration is not None  # _check_calibration made them
        facts = _quantize_static_folder(fp32_dir, int8_dir, calibration, say)
        files, runtimes = STATIC_INT8_FILES, STATIC_INT8_RUNTIMES
    else:
        facts = quantize_folder(fp32_dir, int8_dir, say=say)
        files, runtimes = GRAPH_FILES, ("onnxruntime",)
    exporter = dict(fp32_manifest.exporter) | {"quantizer": facts}
    manifest = _write_manifest(
        int8_dir,
        encoder,
        dimension=fp32_manifest.dimension,
        exporter=exporter,
        versions=fp32_manifest.versions,
        parity=dict(fp32_manifest.parity),
        quantization=scheme,
        graph_files=files,
        runtimes=runtimes,
    )
    say("measuring int8 agreement with PyTorch fp32")
    agreement = _parity(encoder, int8_dir, reference, strict=False)
    report: dict[str, Any] = {
        "reference": "PyTorch fp32 on the parity texts",
        "query": agreement["query"],
        "document": agreement["document"],
    }
    if dataset is not None:
        say(f"NDCG@10 on {dataset.name}:{dataset.split}: fp32 vs int8 (exact search)")
        fp32 = evaluate_vectors(OnnxEncoder.load(fp32_dir), dataset, label="fp32")
        int8 = evaluate_vectors(OnnxEncoder.load(int8_dir), dataset, label="int8")
        report["eval"] = {
            "data": f"{dataset.name}:{dataset.split}",
            "fp32": fp32,
            "int8": int8,
            "ndcg@10_delta": int8["ndcg@10"] - fp32["ndcg@10"],
        }
    manifest.quantization_report = report
    # The parity section describes the fp32 graphs the int8 ones were quantized from.
    manifest.parity = dict(fp32_manifest.parity) | {"checked": "fp32 graphs before quantization"}
    manifest.save(int8_dir)
    return int8_dir
