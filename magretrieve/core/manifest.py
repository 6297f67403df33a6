"""The export manifest (``magretrieve.json``): what an export folder holds and promises.

An export folder is self-describing: the manifest names the similarity mode and its γ
values, the tokenizer settings (prefixes, max lengths), the output contract of each graph
(unit-norm or magnitude-keeping), the index metric every store must use, and a sha256 of
every file so that a tampered or half-copied folder is refused before it serves a query.

The manifest covers itself too: ``manifest_sha256`` is the sha256 of its own canonical
content (every other key), verified by :meth:`Manifest.load`, so a hand-edited field is
refused. ``model_fingerprint`` is a hash of everything that decides a vector (the hashes of
the graphs and tokenizer files, prefixes, max lengths, mode, γ, dimension, ...), so a store
built by one export refuses an export whose tokenizer or prompts were swapped. Neither is a
signature: whoever can write the folder can recompute both; the runtime also checks the
fields against the graphs themselves (:class:`~magretrieve.serving.onnx_encoder.OnnxEncoder`).

This module is torch-free: serving reads it without training dependencies.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from magretrieve.core import similarity
from magretrieve.core.config import SIDES, EncoderConfig
from magretrieve.core.errors import ConfigError, ManifestError
from magretrieve.core.field_view import FieldView
from magretrieve.core.files import is_plain_file_name, sha256_file, sha256_hex

MANIFEST_NAME = "magretrieve.json"
FORMAT = "magretrieve-export"
#: 2: sealed (manifest_sha256), and the encoder's configuration is embedded whole under
#: "encoder" (magretrieve.core.config) instead of its fields being re-listed at the top level.
FORMAT_VERSION = 2
#: The fields of the embedded encoder configuration that the Manifest exposes as attributes.
ENCODER_FIELDS = (
    "mode",
    "gamma_q",
    "gamma_d",
    "pooling",
    "max_query_length",
    "max_document_length",
    "query_prefix",
    "document_prefix",
    "norm_scale",
    "base_model",
)
CONTRACTS = ("unit_norm", "magnitude_keeping")
#: Key of the manifest's hash of its own content.
CHECKSUM_KEY = "manifest_sha256"
#: Keys that describe how an export was made and checked, not what its vectors are: left out
#: of ``model_fingerprint`` (re-running parity must not make a store "another model's").
NOT_FINGERPRINTED = (
    CHECKSUM_KEY,
    "model_fingerprint",
    "exporter",
    "versions",
    "parity",
    "quantization_report",
    "base_model",
    "runtimes",
)
#: Runtimes of an export that predates the ``runtimes`` field, by its quantization (None: any
#: runtime that reads ONNX). onnxruntime's dynamic int8 operators are onnxruntime's own.
LEGACY_RUNTIMES = {"int8": ["onnxruntime"]}


def _canonical(data: dict[str, Any], leave_out: tuple[str, ...]) -> bytes:
    body = {k: v for k, v in data.items() if k not in leave_out}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def content_checksum(data: dict[str, Any]) -> str:
    """sha256 of a manifest's canonical JSON without its own ``manifest_sha256``."""
    return sha256_hex(_canonical(data, (CHECKSUM_KEY,)))


def model_fingerprint(data: dict[str, Any]) -> str:
    """sha256 of everything in a manifest that changes a vector (file hashes, settings)."""
    encoder = data.get("encoder")
    if isinstance(encoder, dict):  # where the weights came from is provenance, not a setting
        data = {**data, "encoder": {k: v for k, v in encoder.items() if k != "base_model"}}
    return sha256_hex(_canonical(data, NOT_FINGERPRINTED))


def seal(data: dict[str, Any]) -> dict[str, Any]:
    """Fill in ``model_fingerprint`` and ``manifest_sha256`` of a manifest dict (in place)."""
    data["model_fingerprint"] = model_fingerprint(data)
    data[CHECKSUM_KEY] = content_checksum(data)
    return data


def check_file_name(name: str, source: str, what: str) -> str:
    """A file entry must be a plain name inside the export folder: no ``/``, ``..`` or absolute path.

    A manifest is data from wherever the folder came from; an entry such as ``../x`` or
    ``/etc/passwd`` would make loading read (and hash, and hand to onnxruntime) a file
    outside the folder the user chose.
    """
    if not is_plain_file_name(name):
        raise ManifestError(
            f"{source}: {what} {name!r} is not a plain file name inside the export folder "
            "(paths with '/', '..' or absolute paths are refused)"
        )
    return name


#: Inputs the runtime knows how to feed a graph.
GRAPH_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _check_format(data: Any, source: str) -> None:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ManifestError(f"{source}: not a magretrieve export manifest (format != {FORMAT!r})")
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise ManifestError(
            f"{source}: unknown format_version {version!r} (this magretrieve reads "
            f"{FORMAT_VERSION}); re-export the model or upgrade magretrieve"
        )


def _check_seal(data: dict[str, Any], source: str) -> None:
    """The manifest's own checksum and fingerprint must match its content."""
    recorded = data.get(CHECKSUM_KEY)
    if not isinstance(recorded, str):
        raise ManifestError(
            f"{source}: no {CHECKSUM_KEY} (written by an older magretrieve, or edited); "
            "re-export the model"
        )
    if recorded != content_checksum(data):
        raise ManifestError(
            f"{source}: content does not match its {CHECKSUM_KEY} (edited by hand or corrupt); "
            "re-export the model"
        )
    if data.get("model_fingerprint") != model_fingerprint(data):
        raise ManifestError(
            f"{source}: model_fingerprint does not match the files and settings it must cover; "
            "re-export the model"
        )


@dataclass
class GraphSpec:
    """One ONNX graph of the export: its file, inputs, output name and vector contract."""

    file: str
    inputs: list[str]
    output: str
    gamma: float
    contract: str
    #: Extra per-side computation baked into the graph (e.g. a norm head); None today.
    head: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "inputs": list(self.inputs),
            "output": self.output,
            "gamma": self.gamma,
            "contract": self.contract,
            "head": self.head,
        }


@dataclass
class Manifest:
    """Parsed, validated ``magretrieve.json`` of an export folder.

    The encoder's settings (mode, γ, pooling, lengths, prefixes, norm scale, head) have one
    owner, :attr:`encoder`; the attributes of the same names are read-only views of it.
    """

    #: The exported model's configuration (magretrieve.core.config), written under "encoder".
    encoder: EncoderConfig
    dimension: int
    graphs: dict[str, GraphSpec]
    tokenizer: str
    files: dict[str, str]
    model_fingerprint: str
    index_metric: str = similarity.INDEX_METRIC
    quantization: str | None = None
    pad_token_id: int = 0
    exporter: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    parity: dict[str, Any] = field(default_factory=dict)
    #: int8 exports: agreement of int8 vs fp32 vectors (and NDCG@10 when measured).
    quantization_report: dict[str, Any] | None = None
    #: Runtimes (magretrieve.serving.onnx_encoder.RUNTIMES names) that can run these graphs, the default
    #: first; None: any runtime that reads ONNX (fp32 exports). Static int8 is OpenVINO IR.
    runtimes: list[str] | None = None
    folder: Path | None = None

    # ------------------------------------------------------------------ views

    mode = FieldView[str]("encoder")
    gamma_q = FieldView[float]("encoder")
    gamma_d = FieldView[float]("encoder")
    pooling = FieldView[str]("encoder")
    max_query_length = FieldView[int]("encoder")
    max_document_length = FieldView[int]("encoder")
    query_prefix = FieldView[str]("encoder")
    document_prefix = FieldView[str]("encoder")
    norm_scale = FieldView[float]("encoder")
    base_model = FieldView[str]("encoder")

    @property
    def similarity(self) -> similarity.Similarity:
        """The similarity these vectors implement (γ values as exported)."""
        if self.mode == "learnable":
            return similarity.resolve("learnable", self.gamma_q, self.gamma_d)
        return similarity.resolve(self.mode)

    @property
    def query_contract(self) -> str:
        return self.graphs["query"].contract

    @property
    def document_contract(self) -> str:
        return self.graphs["document"].contract

    def path(self, side: str) -> Path:
        """Absolute path of a side's graph file."""
        if self.folder is None:
            raise ManifestError("manifest has no folder; load it with Manifest.load(folder)")
        return self.folder / self.graphs[side].file

    def encoder_config(self) -> EncoderConfig:
        """The exported model's :class:`~magretrieve.core.config.EncoderConfig` (:attr:`encoder`)."""
        return self.encoder

    def to_dict(self) -> dict[str, Any]:
        data = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "encoder": self.encoder.to_dict(),
            "dimension": self.dimension,
            "index_metric": self.index_metric,
            "graphs": {side: spec.to_dict() for side, spec in self.graphs.items()},
            "tokenizer": self.tokenizer,
            "pad_token_id": self.pad_token_id,
            "model_fingerprint": self.model_fingerprint,
            "quantization": self.quantization,
            "quantization_report": self.quantization_report,
            "files": dict(self.files),
            "exporter": dict(self.exporter),
            "versions": dict(self.versions),
            "parity": dict(self.parity),
        }
        if self.runtimes is not None:  # absent for fp32, so their manifests read as before
            data["runtimes"] = list(self.runtimes)
        return data

    def save(self, folder: str | Path) -> Path:
        """Write ``magretrieve.json`` into ``folder`` (file hashes must already be filled in).

        Computes ``model_fingerprint`` from the content and seals it with ``manifest_sha256``.
        """
        path = Path(folder) / MANIFEST_NAME
        data = seal(self.to_dict())
        self.model_fingerprint = data["model_fingerprint"]
        path.write_text(json.dumps(data, indent=2) + "\n")
        return path

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = MANIFEST_NAME) -> Manifest:
        """Validate a manifest dict; every problem is a ManifestError naming ``source``."""
        _check_format(data, source)
        raw_encoder = data.get("encoder")
        if not isinstance(raw_encoder, dict):
            raise ManifestError(f"{source}: missing field 'encoder' (the encoder config)")
        # the strict checks below read the fields as written (EncoderConfig would quietly
        # normalize, e.g. γ of a fixed mode), so a hand-edited value is refused, not repaired
        data = {**data, **{n: raw_encoder[n] for n in ENCODER_FIELDS if n in raw_encoder}}
        try:
            mode = data["mode"]
            gamma_q = float(data["gamma_q"])
            gamma_d = float(data["gamma_d"])
            for name, value in (("gamma_q", gamma_q), ("gamma_d", gamma_d)):
                if not (0.0 <= value <= 1.0) or math.isnan(value):
                    raise ManifestError(f"{source}: {name} must lie in [0, 1], got {value}")
            try:
                sim = similarity.resolve(mode, gamma_q, gamma_d)
            except ConfigError as exc:
                raise ManifestError(f"{source}: {exc}") from None
            graphs: dict[str, GraphSpec] = {}
            for side in SIDES:
                raw = data["graphs"][side]
                spec = GraphSpec(
                    file=check_file_name(str(raw["file"]), source, f"graphs.{side}.file"),
                    inputs=[str(x) for x in raw["inputs"]],
                    output=str(raw["output"]),
                    gamma=float(raw["gamma"]),
                    contract=str(raw["contract"]),
                    head=raw.get("head"),
                )
                expected_gamma = sim.gamma_q if side == "query" else sim.gamma_d
                if not math.isclose(spec.gamma, expected_gamma, abs_tol=1e-6):
                    raise ManifestError(
                        f"{source}: graphs.{side}.gamma={spec.gamma} disagrees with the mode's "
                        f"{expected_gamma}"
                    )
                if spec.contract != similarity.vector_contract(expected_gamma):
                    raise ManifestError(
                        f"{source}: graphs.{side}.contract={spec.contract!r} but γ={expected_gamma} "
                        f"means {similarity.vector_contract(expected_gamma)!r}"
                    )
                graphs[side] = spec
            index_metric = data.get("index_metric", similarity.INDEX_METRIC)
            if index_metric != similarity.INDEX_METRIC:
                raise ManifestError(
                    f"{source}: index_metric {index_metric!r}; magretrieve vectors need "
                    f"{similarity.INDEX_METRIC!r}"
                )
            files = data["files"]
            if not isinstance(files, dict) or not files:
                raise ManifestError(f"{source}: 'files' must map file names to sha256 hashes")
            for name in files:
                check_file_name(str(name), source, "file entry")
            check_file_name(str(data["tokenizer"]), source, "tokenizer")
            for side, spec in graphs.items():
                if not spec.inputs or any(x not in GRAPH_INPUTS for x in spec.inputs):
                    raise ManifestError(
                        f"{source}: graphs.{side}.inputs={spec.inputs} (known inputs: "
                        f"{', '.join(GRAPH_INPUTS)})"
                    )
            for name in ("dimension", "max_query_length", "max_document_length"):
                value = data[name]
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ManifestError(
                        f"{source}: {name} must be a positive integer, got {value!r}"
                    )
            runtimes = data.get("runtimes", LEGACY_RUNTIMES.get(str(data.get("quantization"))))
            if runtimes is not None and (
                not isinstance(runtimes, list)
                or not runtimes
                or not all(isinstance(r, str) and r for r in runtimes)
            ):
                raise ManifestError(
                    f"{source}: runtimes must be a non-empty list of runtime names, got {runtimes!r}"
                )
            pad = data.get("pad_token_id", 0)
            if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
                raise ManifestError(f"{source}: pad_token_id must be an integer ≥ 0, got {pad!r}")
            try:
                encoder = EncoderConfig.from_dict(raw_encoder, source=f"{source}: encoder")
            except ConfigError as exc:
                raise ManifestError(str(exc)) from None
            # one owner, holding the fields as the strict checks above read them (a norm_scale
            # written as 1 is the float 1.0 it always was when the manifest is written again)
            encoder = replace(
                encoder,
                mode=sim.mode,
                gamma_q=sim.gamma_q,
                gamma_d=sim.gamma_d,
                pooling=str(data["pooling"]),
                max_query_length=int(data["max_query_length"]),
                max_document_length=int(data["max_document_length"]),
                query_prefix=str(data.get("query_prefix", "")),
                document_prefix=str(data.get("document_prefix", "")),
                norm_scale=float(data.get("norm_scale", 1.0)),
                base_model=str(data.get("base_model", "")),
            )
            return cls(
                encoder=encoder,
                dimension=int(data["dimension"]),
                graphs=graphs,
                tokenizer=str(data["tokenizer"]),
                files={str(k): str(v) for k, v in files.items()},
                model_fingerprint=str(data["model_fingerprint"]),
                index_metric=index_metric,
                quantization=data.get("quantization"),
                pad_token_id=int(data.get("pad_token_id", 0)),
                exporter=dict(data.get("exporter") or {}),
                versions=dict(data.get("versions") or {}),
                parity=dict(data.get("parity") or {}),
                quantization_report=data.get("quantization_report"),
                runtimes=None if runtimes is None else list(runtimes),
            )
        except KeyError as exc:
            raise ManifestError(f"{source}: missing field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise ManifestError(f"{source}: malformed field ({exc})") from None

    @classmethod
    def load(cls, folder: str | Path, verify: bool = True) -> Manifest:
        """Read ``folder/magretrieve.json``; with ``verify`` check every file's sha256.

        A missing file, a hash mismatch or an unknown version is a :class:`ManifestError`
        naming the file, so a tampered export never serves.
        """
        folder = Path(folder)
        path = folder / MANIFEST_NAME
        if not path.is_file():
            if not folder.exists() and folder.parent.is_dir():
                # an `export --overwrite` killed between its two renames (where the folders
                # cannot be swapped atomically) set the old export aside in its staging folder
                for kept in folder.parent.glob(f".{folder.name}.tmp-*/previous/{MANIFEST_NAME}"):
                    raise ManifestError(
                        f"{folder}: missing: an interrupted `magretrieve export --overwrite` left "
                        f"the previous export in {kept.parent}; run the export again (it puts "
                        "the old one back first) or move that folder back"
                    )
            raise ManifestError(
                f"{path}: no manifest; is {folder} an export folder (magretrieve export)?"
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise ManifestError(f"{path}: not valid JSON ({exc})") from None
        except OSError as exc:
            raise ManifestError(f"{path}: cannot read ({exc.strerror or exc})") from None
        _check_format(data, str(path))
        _check_seal(data, str(path))
        manifest = cls.from_dict(data, source=str(path))
        manifest.folder = folder
        needed = {manifest.tokenizer, *(g.file for g in manifest.graphs.values())}
        missing_hash = sorted(needed - set(manifest.files))
        if missing_hash:
            raise ManifestError(f"{path}: no sha256 recorded for {', '.join(missing_hash)}")
        root = folder.resolve()
        for name, expected in manifest.files.items():
            file = folder / name
            if not file.is_file():
                raise ManifestError(f"{file}: listed in {path} but missing")
            if file.is_symlink() and not file.resolve().is_relative_to(root):
                raise ManifestError(
                    f"{file}: a symlink to {file.resolve()}, outside the export folder {folder}; "
                    "refused (copy the file into the folder instead)"
                )
            try:
                actual = sha256_file(file) if verify else expected
            except OSError as exc:
                raise ManifestError(f"{file}: cannot read ({exc.strerror or exc})") from None
            if actual != expected:
                raise ManifestError(
                    f"{file}: sha256 does not match {path} (file modified or corrupt); "
                    "re-export the model"
                )
        return manifest


def hash_folder(folder: str | Path, exclude: tuple[str, ...] = (MANIFEST_NAME,)) -> dict[str, str]:
    """sha256 of every regular file directly in ``folder`` (sorted by name), minus ``exclude``."""
    folder = Path(folder)
    return {
        p.name: sha256_file(p)
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name not in exclude
    }
