"""Serving-side encoder: the exported ONNX graphs run by onnxruntime, tokenized by ``tokenizers``.

No torch, no transformers: an export folder (``magretrieve export``) plus
``pip install 'magretrieve[serve]'`` is all a serving process needs. The graphs already
contain pooling and the side's partial normalization, so the vectors come out exactly as
a store keeps them (documents) or searches with them (queries).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from magretrieve.errors import ConfigError, ManifestError
from magretrieve.manifest import SIDES, Manifest
from magretrieve.similarity import Similarity


class OnnxEncoder:
    """Encodes queries and documents with an export folder's ``query.onnx``/``document.onnx``.

    Sessions are opened lazily, so a process that only encodes queries never loads the
    document graph (and its copy of the weights).
    """

    def __init__(self, manifest: Manifest, threads: int | None = None) -> None:
        from tokenizers import Tokenizer

        if manifest.folder is None:
            raise ManifestError("OnnxEncoder needs a manifest loaded from a folder")
        if threads is not None and threads < 1:
            raise ConfigError(f"threads must be at least 1, got {threads}")
        self.manifest = manifest
        self.threads = threads
        tokenizer_path = manifest.folder / manifest.tokenizer
        # One tokenizer per side, configured once and never mutated afterwards: switching one
        # shared tokenizer's truncation per call let a concurrent search and document encode
        # truncate each other's texts at the wrong length (and PyO3 can raise "Already
        # borrowed"). Padding is done here, per length-sorted batch.
        self._tokenizers: dict[str, Any] = {}
        for side in SIDES:
            try:
                tok = Tokenizer.from_file(str(tokenizer_path))
            except Exception as exc:  # tokenizers raises a bare Exception on a bad file
                raise ManifestError(
                    f"{tokenizer_path}: cannot read the tokenizer ({exc})"
                ) from None
            tok.no_padding()
            tok.enable_truncation(max_length=self._max_length(side))
            self._tokenizers[side] = tok
        self._sessions: dict[str, Any] = {}
        #: Texts cut at the side's max length in the most recent encode call (any thread).
        self.last_truncated = 0
        #: Texts cut at the max length since this encoder was opened, per side.
        self.truncated_counts = {side: 0 for side in SIDES}
        self._count_lock = threading.Lock()

    @classmethod
    def load(cls, folder: str | Path, threads: int | None = None) -> OnnxEncoder:
        """Open an export folder, verifying every file's sha256 against the manifest.

        ``threads`` sets onnxruntime's intra-op thread count (None: onnxruntime's default).
        """
        return cls(Manifest.load(folder, verify=True), threads=threads)

    # ------------------------------------------------------------------ properties

    @property
    def dim(self) -> int:
        return self.manifest.dimension

    @property
    def similarity(self) -> Similarity:
        return self.manifest.similarity

    # ------------------------------------------------------------------ sessions

    def session(self, side: str) -> Any:
        """The onnxruntime session of a side, created on first use."""
        if side not in SIDES:
            raise ConfigError(f"side must be 'query' or 'document', got {side!r}")
        if side not in self._sessions:
            import onnxruntime as ort

            options = ort.SessionOptions()
            if self.threads is not None:
                options.intra_op_num_threads = self.threads
                options.inter_op_num_threads = 1
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            path = self.manifest.path(side)
            try:
                self._sessions[side] = ort.InferenceSession(
                    str(path), sess_options=options, providers=["CPUExecutionProvider"]
                )
            except Exception as exc:  # onnxruntime raises its own exception types
                raise ManifestError(f"{path}: onnxruntime cannot load the graph ({exc})") from None
            self._probe(side, self._sessions[side])
        return self._sessions[side]

    def _probe(self, side: str, session: Any) -> None:
        """Check the manifest's fields against the graph itself before it serves anything.

        Inputs and output must be the graph's, and one batch of the side's max length made
        of pad tokens must run and give one finite vector of ``dimension``: an edited
        dimension, max length, pad id or output name is refused here, naming the graph,
        instead of failing mid-indexing (or writing a store of the wrong dimension).
        """
        m = self.manifest
        spec = m.graphs[side]
        path = m.path(side)
        graph_inputs = {i.name for i in session.get_inputs()}
        graph_outputs = [o.name for o in session.get_outputs()]
        if set(spec.inputs) != graph_inputs:
            raise ManifestError(
                f"{path}: the graph's inputs are {sorted(graph_inputs)}, the manifest says "
                f"{sorted(spec.inputs)}"
            )
        if spec.output not in graph_outputs:
            raise ManifestError(
                f"{path}: the graph has no output {spec.output!r} (its outputs: {graph_outputs})"
            )
        length = self._max_length(side)
        ids = np.full((1, length), m.pad_token_id, dtype=np.int64)
        ones = np.ones((1, length), dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": ones, "token_type_ids": np.zeros_like(ids)}
        try:
            out = session.run([spec.output], {k: feed[k] for k in spec.inputs})[0]
        except Exception as exc:  # onnxruntime's own error types
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ManifestError(
                f"{path}: the graph does not run with the manifest's settings "
                f"(max_{side}_length={length}, pad_token_id={m.pad_token_id}): {first[:300]}"
            ) from None
        if out.shape != (1, m.dimension):
            raise ManifestError(
                f"{path}: the graph gives vectors of shape {tuple(out.shape)[1:]}, the manifest "
                f"says dimension {m.dimension}"
            )
        if not np.isfinite(out).all():
            raise ManifestError(f"{path}: the graph outputs NaN or inf (corrupt weights)")

    # ------------------------------------------------------------------ encoding

    def _prefix(self, side: str) -> str:
        return self.manifest.query_prefix if side == "query" else self.manifest.document_prefix

    def _max_length(self, side: str) -> int:
        m = self.manifest
        return m.max_query_length if side == "query" else m.max_document_length

    def tokenize(self, texts: Sequence[str], side: str) -> list[Any]:
        """``tokenizers`` encodings with the side's prefix and truncation (no padding)."""
        if side not in SIDES:
            raise ConfigError(f"side must be 'query' or 'document', got {side!r}")
        prefix = self._prefix(side)
        try:
            return self._tokenizers[side].encode_batch([prefix + t for t in texts])
        except TypeError:  # tokenizers refuses non-str items and lone surrogates alike
            from magretrieve.data import check_text

            for n, t in enumerate(texts):
                if not isinstance(t, str):
                    raise ConfigError(
                        f"{side} text #{n} is a {type(t).__name__}, not a string"
                    ) from None
                check_text(t, f"{side} text #{n}")
            raise

    def _feed(self, encodings: Sequence[Any], inputs: Sequence[str]) -> dict[str, np.ndarray]:
        """Pad a batch to its longest text (right padding, as the torch encoder does)."""
        width = max(len(e.ids) for e in encodings)
        n = len(encodings)
        ids = np.full((n, width), self.manifest.pad_token_id, dtype=np.int64)
        mask = np.zeros((n, width), dtype=np.int64)
        types = np.zeros((n, width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            length = len(enc.ids)
            ids[row, :length] = enc.ids
            mask[row, :length] = 1
            types[row, :length] = enc.type_ids
        arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return {name: arrays[name] for name in inputs}

    def _encode(
        self, texts: Sequence[str], side: str, batch_size: int, progress: bool | str = False
    ) -> np.ndarray:
        if isinstance(texts, str):
            raise ConfigError("pass a list of texts, not a single string")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        texts = list(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        spec = self.manifest.graphs[side]
        session = self.session(side)
        encodings = self.tokenize(texts, side)
        # a truncated encoding keeps the cut-off tokens in ``overflowing``
        truncated = sum(1 for e in encodings if e.overflowing)
        with self._count_lock:
            self.last_truncated = truncated
            self.truncated_counts[side] += truncated
        # Longest first, so each batch pads to a similar length and little compute is wasted.
        order = np.argsort([-len(e.ids) for e in encodings], kind="stable")
        desc = progress if isinstance(progress, str) else f"encoding {side}s (onnx)"
        with tqdm(
            total=len(texts), desc=desc, unit="text", disable=not progress, leave=False
        ) as bar:
            for start in range(0, len(texts), batch_size):
                idx = order[start : start + batch_size]
                feed = self._feed([encodings[i] for i in idx], spec.inputs)
                out[idx] = session.run([spec.output], feed)[0]
                bar.update(len(idx))
        return out

    def encode_queries(
        self, texts: Sequence[str], batch_size: int = 32, progress: bool | str = False
    ) -> np.ndarray:
        """float32 (n, dim) query vectors ``q / ‖q‖^γq``, ready to search a store by inner product."""
        return self._encode(texts, "query", batch_size, progress)

    def encode_documents(
        self, texts: Sequence[str], batch_size: int = 32, progress: bool | str = False
    ) -> np.ndarray:
        """float32 (n, dim) document vectors ``d / ‖d‖^γd``: exactly what a store keeps."""
        return self._encode(texts, "document", batch_size, progress)

    def __repr__(self) -> str:
        m = self.manifest
        return (
            f"OnnxEncoder({m.folder}, mode={m.mode}, γq={m.gamma_q:g}, γd={m.gamma_d:g}, "
            f"dim={m.dimension}, quantization={m.quantization})"
        )
