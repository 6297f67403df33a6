"""The PyTorch encoder: a transformer, its pooling, and the magnitude-aware similarity.

It reads a plain Hugging Face folder, a sentence-transformers folder (pooling from its
``1_Pooling/config.json``; a ``Normalize`` stage is dropped, with a warning when the mode
is not cosine, because it would erase the magnitude this project trains), or a folder it
saved itself (``magretrieve_config.json`` next to safetensors weights).

``embed`` returns *raw* pooled vectors; ``encode_queries``/``encode_documents`` apply the
query/document side of :mod:`magretrieve.core.similarity` and return what a store holds.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from magretrieve.core import similarity
from magretrieve.core.batching import DEFAULT_BATCH_TOKENS, token_budget_batches
from magretrieve.core.config import (  # noqa: F401  (re-exported: the encoder's config lives there)
    CONFIG_NAME,
    CONFIG_VERSION,
    POOLINGS,
    SIDES,
    EncoderConfig,
    read_sentence_transformers,
)
from magretrieve.core.errors import ConfigError
from magretrieve.core.model_paths import resolve_model_path
from magretrieve.train import torch_similarity
from magretrieve.train.model_check import check_config_matches_weights

logger = logging.getLogger(__name__)


def _gamma_logit(gamma: float) -> float:
    g = min(max(gamma, 1e-4), 1 - 1e-4)
    return math.log(g / (1 - g))


def _is_corrupt_file_error(exc: BaseException) -> bool:
    """A load error caused by a file's content (truncated safetensors, broken JSON)."""
    module = type(exc).__module__ or ""
    return module.startswith(("safetensors", "tokenizers", "json")) or isinstance(
        exc, (ValueError, UnicodeDecodeError)
    )


class Encoder(nn.Module, similarity.SideVectors):
    """Transformer + pooling + (partial) normalization, with its config saved beside its weights."""

    def __init__(self, transformer: nn.Module, tokenizer: Any, config: EncoderConfig) -> None:
        super().__init__()
        config.validate()
        self.transformer = transformer
        self.tokenizer = tokenizer
        self.config = config
        # Learnable γ are two scalars through a sigmoid; fixed modes keep them frozen buffers.
        logits = torch.tensor([_gamma_logit(config.gamma_q), _gamma_logit(config.gamma_d)])
        if config.mode == "learnable":
            self.gamma_logits = nn.Parameter(logits)
        else:
            self.register_buffer("gamma_logits", logits, persistent=False)
        self._uses_token_type_ids = "token_type_ids" in getattr(tokenizer, "model_input_names", [])
        from magretrieve.train.heads import build_head

        self.norm_head = build_head(
            self.dim, config.head.kind, config.head.hidden, config.head.bound
        )
        self.clamp_max_lengths()

    def clamp_max_lengths(self) -> None:
        """Cap max lengths at what the transformer can embed (position table / tokenizer limit).

        A longer max length would make long texts crash the model (and its ONNX graph); the
        config, and so an export's manifest, promises only lengths the model supports.
        """
        tcfg = getattr(self.transformer, "config", None)
        limits = [int(getattr(self.tokenizer, "model_max_length", 0) or 0)]
        positions = getattr(tcfg, "max_position_embeddings", None)
        if positions:
            # RoBERTa-style models offset positions by padding_idx + 1.
            offset = (
                int(tcfg.pad_token_id) + 1
                if "roberta" in str(getattr(tcfg, "model_type", ""))
                else 0
            )
            limits.append(int(positions) - offset)
        usable = [x for x in limits if 0 < x < 1_000_000]
        if not self.config.max_query_length:  # the default: as long as the model supports
            self.config.max_query_length = (
                min(usable) if usable else self.config.max_document_length
            )
        if not usable:
            return
        limit = min(usable)
        for name in ("max_query_length", "max_document_length"):
            value = int(getattr(self.config, name))
            if value > limit:
                logger.warning(
                    "%s %d exceeds the model's limit %d; using %d", name, value, limit, limit
                )
                setattr(self.config, name, limit)

    # ------------------------------------------------------------------ construction

    @classmethod
    def load(
        cls,
        model: str | Path,
        mode: str | None = None,
        *,
        gamma_q: float | None = None,
        gamma_d: float | None = None,
        pooling: str | None = None,
        max_query_length: int | None = None,
        max_document_length: int | None = None,
        query_prefix: str | None = None,
        document_prefix: str | None = None,
        device: str | None = None,
        norm_head: str | None = None,
        norm_head_hidden: int | None = None,
        norm_head_bound: float | None = None,
    ) -> Encoder:
        """Load a magretrieve run, a sentence-transformers folder, or a Hugging Face folder/name.

        Arguments left as ``None`` keep what the folder says (or the defaults). A run folder
        with a norm head loads its weights from ``norm_head.safetensors``; asking for a head
        on a folder without one adds a fresh, zero-output head.
        """
        from transformers import AutoModel, AutoTokenizer

        folder = resolve_model_path(model)
        own = folder / CONFIG_NAME
        has_own = folder.is_dir() and own.is_file()
        if has_own:
            cfg = EncoderConfig.load(folder)
            data = cfg.to_dict()  # as saved: what the norm head was trained as
            transformer_dir = folder
            if mode is not None and mode != cfg.mode:
                cfg.mode = mode
                cfg.gamma_q, cfg.gamma_d = (gamma_q, gamma_d) if mode == "learnable" else (1.0, 1.0)
        else:
            cfg = EncoderConfig(mode=mode or "cosine", base_model=str(model))
            transformer_dir = folder
            if folder.is_dir() and (folder / "modules.json").is_file():
                transformer_dir, st = read_sentence_transformers(folder)
                cfg.pooling = st.get("pooling", cfg.pooling)
                cfg.query_prefix = st.get("query_prefix", cfg.query_prefix)
                cfg.document_prefix = st.get("document_prefix", cfg.document_prefix)
                if "max_seq_length" in st:
                    cfg.max_document_length = st["max_seq_length"]
                    cfg.max_query_length = (
                        min(cfg.max_query_length, st["max_seq_length"])
                        if cfg.max_query_length
                        else st["max_seq_length"]
                    )
                if st["normalize"]:
                    level = logging.INFO if cfg.mode == "cosine" else logging.WARNING
                    logger.log(
                        level,
                        "%s: removed the sentence-transformers Normalize stage (mode %s computes its own "
                        "normalization; a built-in Normalize would erase document magnitude)",
                        folder,
                        cfg.mode,
                    )
                    cfg.extra["removed_normalize"] = True
        if mode == "learnable" or (mode is None and cfg.mode == "learnable"):
            if gamma_q is not None:
                cfg.gamma_q = gamma_q
            if gamma_d is not None:
                cfg.gamma_d = gamma_d
            if mode == "learnable" and not has_own:
                cfg.gamma_q = similarity.PAPER_LEARNABLE_INIT if gamma_q is None else gamma_q
                cfg.gamma_d = similarity.PAPER_LEARNABLE_INIT if gamma_d is None else gamma_d
        elif mode is not None:
            sim = similarity.resolve(mode, gamma_q, gamma_d)
            cfg.mode, cfg.gamma_q, cfg.gamma_d = sim.mode, sim.gamma_q, sim.gamma_d
        for name, value in (
            ("pooling", pooling),
            ("max_query_length", max_query_length),
            ("max_document_length", max_document_length),
            ("query_prefix", query_prefix),
            ("document_prefix", document_prefix),
            ("norm_head", norm_head),
            ("norm_head_hidden", norm_head_hidden),
            ("norm_head_bound", norm_head_bound),
        ):
            if value is not None:
                setattr(cfg, name, value)
        cfg.validate()
        local = Path(str(transformer_dir))
        if local.is_dir() and not (local / "config.json").is_file():
            raise ConfigError(
                f"{local / 'config.json'}: missing; a model folder needs the Hugging Face "
                "config.json beside its weights (copy the whole folder)"
            )
        try:
            if local.is_dir():
                check_config_matches_weights(local)
            tokenizer = AutoTokenizer.from_pretrained(str(transformer_dir))
            transformer = AutoModel.from_pretrained(str(transformer_dir), use_safetensors=True)
        except OSError as exc:
            if exc.filename:  # the OS refused a file (permissions, I/O error)
                raise ConfigError(f"{exc.filename}: cannot read ({exc.strerror})") from None
            raise ConfigError(
                f"{transformer_dir}: cannot load the transformer ({exc}). magretrieve loads safetensors "
                "weights only; a folder with only pytorch_model.bin (a pickle) is refused"
            ) from None
        except Exception as exc:  # safetensors/tokenizers/json errors on a corrupt file
            if not _is_corrupt_file_error(exc):
                raise
            weights = sorted(local.glob("*.safetensors")) if local.is_dir() else []
            where = weights[0] if len(weights) == 1 else transformer_dir
            raise ConfigError(
                f"{where}: cannot load the model: a file is truncated or corrupt "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
            ) from None
        encoder = cls(transformer, tokenizer, cfg)
        if encoder.norm_head is not None and has_own and data.get("norm_head", "none") != "none":
            if (
                data.get("norm_head") != cfg.norm_head
                or data.get("norm_head_hidden") != cfg.norm_head_hidden
            ):
                raise ConfigError(
                    f"{own}: the saved norm head is {data.get('norm_head')!r}; "
                    f"cannot load it as {cfg.norm_head!r}"
                )
            from magretrieve.train.heads import load_head_weights

            weights = load_head_weights(folder)
            try:
                encoder.norm_head.load_state_dict(
                    {k: torch.from_numpy(v) for k, v in weights.items()}
                )
            except RuntimeError as exc:
                raise ConfigError(
                    f"{folder}: norm head weights do not fit the config ({exc})"
                ) from None
        if device is not None and device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(
                f"--device {device}: torch sees no CUDA GPU here (torch.cuda.is_available() "
                f"is False; torch {torch.__version__})"
            )
        encoder.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        encoder.eval()
        return encoder

    def save(self, path: str | Path) -> Path:
        """Write weights (safetensors), tokenizer and ``magretrieve_config.json`` to ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.sync_config()
        self.transformer.save_pretrained(str(path), safe_serialization=True)
        self.tokenizer.save_pretrained(str(path))
        if self.norm_head is not None:
            from magretrieve.train.heads import save_head

            save_head(self.norm_head, path)
        self.config.save(path)
        return path

    def sync_config(self) -> None:
        """Copy the current (possibly trained) γ values into the config."""
        gq, gd = self.gammas()
        if self.config.mode == "learnable":
            self.config.gamma_q, self.config.gamma_d = float(gq.detach()), float(gd.detach())

    # ------------------------------------------------------------------ forward

    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    @property
    def dim(self) -> int:
        return int(self.transformer.config.hidden_size)

    @property
    def uses_token_type_ids(self) -> bool:
        return self._uses_token_type_ids

    def gammas(self) -> tuple[torch.Tensor | float, torch.Tensor | float]:
        """(γq, γd): tensors through a sigmoid when learnable, plain floats otherwise."""
        if self.config.mode == "learnable":
            g = torch.sigmoid(self.gamma_logits)
            return g[0], g[1]
        return self.config.gamma_q, self.config.gamma_d

    @property
    def similarity(self) -> similarity.Similarity:
        gq, gd = self.gammas()
        return (
            similarity.resolve(self.config.mode, float(gq.detach()), float(gd.detach()))
            if self.config.mode == "learnable"
            else similarity.resolve(self.config.mode)
        )

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Pool token states into one vector per text (mean, CLS or last non-padding token)."""
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        if self.config.pooling == "mean":
            return (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
        if self.config.pooling == "cls":
            return hidden[:, 0]
        # last token: index of the last 1 in the mask works for left and right padding alike
        positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        last = (attention_mask * positions).argmax(dim=1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        side: str = "query",
    ) -> torch.Tensor:
        """Raw pooled embedding (divided by ``norm_scale``) of ``side``, before any normalization.

        With a norm head, the document side returns ``d̂·exp(g(d̂))`` instead (see
        :mod:`magretrieve.train.heads`).

        ``side`` lets a side-specific stage (a document norm head) act on one side only; the
        ONNX export passes it, so such a stage flows into that side's graph.
        """
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        hidden = self.transformer(**kwargs).last_hidden_state
        pooled = self.pool(hidden, attention_mask)
        if self.config.norm_scale != 1.0:
            pooled = pooled / self.config.norm_scale
        if side == "document" and self.norm_head is not None:
            pooled = self.norm_head.scale(pooled)  # d̂·exp(g(d̂)): cosine at init
        return pooled

    def head_manifest(self, side: str) -> dict[str, Any] | None:
        """What the export manifest records under ``graphs.<side>.head`` (None: no head)."""
        if side != "document" or self.norm_head is None:
            return None
        return self.norm_head.spec()

    def side_vectors(self, raw: torch.Tensor, side: str) -> torch.Tensor:
        """Apply the side's partial normalization (``x/‖x‖^γ``) to raw embeddings."""
        gq, gd = self.gammas()
        return torch_similarity.partial_normalize_torch(raw, gq if side == "query" else gd)

    # ------------------------------------------------------------------ tokenization

    def prepare(self, texts: Sequence[str], side: str) -> list[str]:
        if side not in SIDES:
            raise ConfigError(f"side must be 'query' or 'document', got {side!r}")
        prefix = self.config.query_prefix if side == "query" else self.config.document_prefix
        return [prefix + t for t in texts]

    def max_length(self, side: str) -> int:
        return self.config.max_query_length if side == "query" else self.config.max_document_length

    def tokenize(self, texts: Sequence[str], side: str) -> dict[str, torch.Tensor]:
        """Tokenize with the side's prefix and max length, padded to the longest text."""
        batch = self.tokenizer(
            self.prepare(texts, side),
            padding=True,
            truncation=True,
            max_length=self.max_length(side),
            return_tensors="pt",
        )
        keep = ("input_ids", "attention_mask") + (
            ("token_type_ids",) if self._uses_token_type_ids else ()
        )
        return {k: v.to(self.device) for k, v in batch.items() if k in keep}

    def token_lengths(self, texts: Sequence[str], side: str) -> list[int]:
        """Token counts after truncation, used to sort texts into length buckets."""
        return self._lengths(texts, side)[0]

    def _lengths(self, texts: Sequence[str], side: str) -> tuple[list[int], int]:
        """Token counts after truncation, and how many texts the max length cuts."""
        limit = self.max_length(side)
        # one token of headroom: a text is cut exactly when it still fills limit + 1
        enc = self.tokenizer(self.prepare(texts, side), truncation=True, max_length=limit + 1)
        lengths = [len(ids) for ids in enc["input_ids"]]
        return [min(n, limit) for n in lengths], sum(n > limit for n in lengths)

    # ------------------------------------------------------------------ inference

    @torch.inference_mode()
    def embed(
        self,
        texts: Sequence[str],
        side: str,
        batch_size: int = 64,
        progress: bool | str = False,
        max_batch_tokens: int | None = DEFAULT_BATCH_TOKENS,
    ) -> np.ndarray:
        """Raw pooled float32 embeddings, batched by length so little compute goes to padding.

        Texts are sorted longest first and a batch closes at ``batch_size`` texts or when
        ``rows × longest`` would pass ``max_batch_tokens`` (None: fixed-size batches).
        """
        from tqdm.auto import tqdm

        texts = list(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        #: Texts cut at the side's max length in the most recent embed call.
        self.last_truncated = 0
        if not texts:
            return out
        was_training = self.training
        self.eval()
        lengths, self.last_truncated = self._lengths(texts, side)
        batches = token_budget_batches(lengths, max_tokens=max_batch_tokens, max_rows=batch_size)
        desc = progress if isinstance(progress, str) else f"encoding {side}s"
        bar = tqdm(total=len(texts), desc=desc, unit="text", disable=not progress, leave=False)
        for idx in batches:
            batch = self.tokenize([texts[i] for i in idx], side)
            out[idx] = self(**batch, side=side).float().cpu().numpy()
            bar.update(len(idx))
        bar.close()
        self.train(was_training)
        return out
