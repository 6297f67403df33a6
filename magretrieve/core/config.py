"""The encoder's configuration, torch-free: one home that the encoder, the exporter, the
manifest and ``rescale`` all read (sentence-transformers' "each module owns its config").

``EncoderConfig`` is what ``magretrieve_config.json`` holds beside a run's weights and what an
export's ``magretrieve.json`` embeds under ``"encoder"``; ``read_sentence_transformers`` reads a
sentence-transformers folder's modules, pooling, max length and **prompts** (E5's
``query: ``/``passage: ``, BGE's query instruction) without importing torch.
"""

from __future__ import annotations

import copy
import json
import logging
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from magretrieve.core import similarity
from magretrieve.core.errors import ConfigError
from magretrieve.core.field_view import FieldView
from magretrieve.core.norm_head import FROZEN_KEY, NormHeadSpec

logger = logging.getLogger(__name__)

__all__ = [
    "CONFIG_NAME",
    "CONFIG_VERSION",
    "POOLINGS",
    "SIDES",
    "EncoderConfig",
    "read_sentence_transformers",
    "prompt_prefixes",
]

CONFIG_NAME = "magretrieve_config.json"
CONFIG_VERSION = 1
POOLINGS = ("mean", "cls", "last")
SIDES = ("query", "document")
#: The norm head's fields as configuration files spell them.
HEAD_FIELDS = ("norm_head", "norm_head_hidden", "norm_head_bound")


def _with_frozen_flag(extra: dict[str, Any], head: NormHeadSpec) -> dict[str, Any]:
    """``extra`` as written on disk: ``frozen_encoder`` after ``removed_normalize`` (the order
    ``train --freeze-encoder`` has always produced), absent when False."""
    if not head.frozen_encoder:
        return extra
    out: dict[str, Any] = {}
    if "removed_normalize" in extra:
        out["removed_normalize"] = extra.pop("removed_normalize")
    out[FROZEN_KEY] = True
    out.update(extra)
    return out


@dataclass
class EncoderConfig:
    """Everything besides the transformer weights that defines the encoder's outputs."""

    mode: str = "cosine"
    gamma_q: float = 1.0
    gamma_d: float = 1.0
    pooling: str = "mean"
    #: 0 (the default) means the model's own limit, resolved when the encoder is built: a
    #: shorter default silently truncated long queries and cost quality.
    max_query_length: int = 0
    max_document_length: int = 256
    query_prefix: str = ""
    document_prefix: str = ""
    #: Raw pooled vectors are divided by this before partial normalization (norm calibration).
    norm_scale: float = 1.0
    #: Document norm head (magretrieve.train.heads): the document vector becomes d̂·exp(g(d̂))
    #: with g zero at init (the model starts as cosine). On disk it is the flat fields
    #: ``norm_head``, ``norm_head_hidden``, ``norm_head_bound`` and ``extra.frozen_encoder``.
    head: NormHeadSpec = field(default_factory=NormHeadSpec)
    #: Where the weights came from (a folder or hub name), for provenance only.
    base_model: str = ""
    version: int = CONFIG_VERSION
    #: Free-form facts about how the weights were made (e.g. ``removed_normalize``,
    #: ``norm_calibration``); nothing that changes a vector is read from here.
    extra: dict[str, Any] = field(default_factory=dict)

    # The head's fields under their on-disk (and ``Encoder.load``/CLI option) names.

    norm_head = FieldView[str]("head", "kind", writable=True)
    norm_head_hidden = FieldView[int]("head", "hidden", writable=True)
    norm_head_bound = FieldView[float]("head", "bound", writable=True)

    def validate(self) -> None:
        sim = similarity.resolve(
            self.mode,
            self.gamma_q if self.mode == "learnable" else None,
            self.gamma_d if self.mode == "learnable" else None,
        )
        self.gamma_q, self.gamma_d = sim.gamma_q, sim.gamma_d
        if self.pooling not in POOLINGS:
            raise ConfigError(
                f"unknown pooling {self.pooling!r}; choose one of {', '.join(POOLINGS)}"
            )
        for name in ("max_query_length", "max_document_length"):
            value = int(getattr(self, name))
            if value < 2 and not (name == "max_query_length" and value == 0):
                raise ConfigError(f"{name} must be at least 2, got {getattr(self, name)}")
        if not (self.norm_scale > 0 and math.isfinite(self.norm_scale)):
            raise ConfigError(f"norm_scale must be a positive number, got {self.norm_scale}")
        self.head.validate()
        if self.head.enabled and self.gamma_d >= 1.0:
            raise ConfigError(
                f"a norm head needs a mode that keeps document magnitude (qnorm, dot or learnable); "
                f"mode {self.mode!r} normalizes documents and would erase what the head learns"
            )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``magretrieve_config.json``, a manifest's ``"encoder"``): flat head
        fields in their historical place, ``frozen_encoder`` under ``extra``."""
        data: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "head":
                data["norm_head"] = self.head.kind
                data["norm_head_hidden"] = self.head.hidden
                data["norm_head_bound"] = self.head.bound
            elif f.name == "extra":
                data["extra"] = _with_frozen_flag(copy.deepcopy(self.extra), self.head)
            else:
                data[f.name] = getattr(self, f.name)
        return data

    @classmethod
    def load(cls, folder: str | Path) -> EncoderConfig:
        """Read ``folder/magretrieve_config.json`` (a run folder); errors name the file."""
        path = Path(folder) / CONFIG_NAME
        if not path.is_file():
            raise ConfigError(f"{path}: missing; not a magretrieve run folder")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a JSON object")
        return cls.from_dict(data, source=str(path))

    def save(self, folder: str | Path) -> Path:
        """Write ``folder/magretrieve_config.json``."""
        path = Path(folder) / CONFIG_NAME
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> EncoderConfig:
        version = data.get("version", CONFIG_VERSION)
        if version != CONFIG_VERSION:
            raise ConfigError(
                f"{source}: unknown config version {version} (this magretrieve reads {CONFIG_VERSION})"
            )
        known = {f for f in cls.__dataclass_fields__} - {"head"} | set(HEAD_FIELDS)
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"{source}: unknown config fields {sorted(unknown)}")
        values = {k: v for k, v in data.items() if k not in HEAD_FIELDS}
        extra = dict(values.get("extra") or {})
        frozen = extra.pop(FROZEN_KEY, False)
        values["extra"] = extra
        defaults = NormHeadSpec()
        values["head"] = NormHeadSpec(
            kind=data.get("norm_head", defaults.kind),
            hidden=data.get("norm_head_hidden", defaults.hidden),
            bound=data.get("norm_head_bound", defaults.bound),
            frozen_encoder=bool(frozen),
        )
        cfg = cls(**values)
        cfg.validate()
        return cfg


#: Prompt names sentence-transformers uses for each side (``encode_query``/``encode_document``).
QUERY_PROMPT_NAMES = ("query",)
DOCUMENT_PROMPT_NAMES = ("document", "passage", "corpus")


def prompt_prefixes(st_config: dict[str, Any], source: str) -> dict[str, str]:
    """Query/document prefixes from ``config_sentence_transformers.json``'s ``prompts``.

    A side-specific prompt wins (``query``; ``document``/``passage``/``corpus``); otherwise
    ``default_prompt_name`` applies to both sides, as sentence-transformers' ``encode`` does.
    Prompts for other tasks (classification, clustering, ...) are named in a warning, since a
    retriever has no use for them.
    """
    prompts = st_config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise ConfigError(f"{source}: 'prompts' must map prompt names to strings")
    default_name = st_config.get("default_prompt_name")
    if default_name is not None and default_name not in prompts:
        raise ConfigError(
            f"{source}: default_prompt_name {default_name!r} is not one of the prompts "
            f"{sorted(prompts)}"
        )
    default = prompts.get(default_name, "") if default_name else ""
    out: dict[str, str] = {}
    query = next((prompts[n] for n in QUERY_PROMPT_NAMES if n in prompts), None)
    document = next((prompts[n] for n in DOCUMENT_PROMPT_NAMES if n in prompts), None)
    out["query_prefix"] = query if query is not None else default
    out["document_prefix"] = document if document is not None else default
    unused = sorted(
        set(prompts) - {*QUERY_PROMPT_NAMES, *DOCUMENT_PROMPT_NAMES, default_name or ""}
    )
    if unused:
        logger.warning("%s: prompts %s are not used for retrieval", source, unused)
    if out["query_prefix"] or out["document_prefix"]:
        logger.info(
            "%s: prompts applied: query prefix %r, document prefix %r",
            source,
            out["query_prefix"],
            out["document_prefix"],
        )
    return out


def read_sentence_transformers(folder: Path) -> tuple[Path, dict[str, Any]]:
    """Return the transformer folder and settings (pooling, max length, normalize) of an ST folder."""
    modules = json.loads((folder / "modules.json").read_text())
    settings: dict[str, Any] = {"normalize": False}
    transformer_dir = folder
    for module in modules:
        kind = module.get("type", "")
        path = folder / module.get("path", "")
        if kind.endswith("Transformer"):
            transformer_dir = path if (path / "config.json").is_file() else folder
            st_cfg = folder / "sentence_bert_config.json"
            if st_cfg.is_file():
                max_len = json.loads(st_cfg.read_text()).get("max_seq_length")
                if max_len:
                    settings["max_seq_length"] = int(max_len)
        elif kind.endswith("Pooling"):
            pool_cfg = json.loads((path / "config.json").read_text())
            named = {
                "mean": "mean",
                "mean_tokens": "mean",
                "cls": "cls",
                "cls_token": "cls",
                "lasttoken": "last",
                "last_token": "last",
            }
            if isinstance(pool_cfg.get("pooling_mode"), str):  # sentence-transformers >= 6
                if pool_cfg["pooling_mode"] not in named:
                    raise ConfigError(
                        f"{path}: unsupported sentence-transformers pooling {pool_cfg}"
                    )
                settings["pooling"] = named[pool_cfg["pooling_mode"]]
            elif pool_cfg.get("pooling_mode_cls_token"):
                settings["pooling"] = "cls"
            elif pool_cfg.get("pooling_mode_lasttoken"):
                settings["pooling"] = "last"
            elif pool_cfg.get("pooling_mode_mean_tokens"):
                settings["pooling"] = "mean"
            else:
                raise ConfigError(f"{path}: unsupported sentence-transformers pooling {pool_cfg}")
        elif kind.endswith("Normalize"):
            settings["normalize"] = True
        else:
            raise ConfigError(f"{folder}: unsupported sentence-transformers module {kind!r}")
    st_json = folder / "config_sentence_transformers.json"
    if st_json.is_file():
        try:
            st_config = json.loads(st_json.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{st_json}: not valid JSON ({exc})") from None
        if not isinstance(st_config, dict):
            raise ConfigError(f"{st_json}: expected a JSON object")
        settings.update(prompt_prefixes(st_config, str(st_json)))
    return transformer_dir, settings
