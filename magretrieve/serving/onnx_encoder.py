"""Serving-side encoder: the exported ONNX graphs run by onnxruntime, tokenized by ``tokenizers``.

No torch, no transformers: an export folder (``magretrieve export``) plus
``pip install 'magretrieve[serve]'`` is all a serving process needs. The graphs already
contain pooling and the side's partial normalization, so the vectors come out exactly as
a store keeps them (documents) or searches with them (queries).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from magretrieve.core.batching import DEFAULT_BATCH_TOKENS, token_budget_batches
from magretrieve.core.config import SIDES
from magretrieve.core.errors import ConfigError, ManifestError, first_line
from magretrieve.core.extras import require
from magretrieve.core.manifest import Manifest
from magretrieve.core.similarity import Similarity

#: Most documents per batch by default; the token budget usually closes a batch first.
DEFAULT_DOCUMENT_BATCH = 128
#: Query lengths (tokens) an OpenVINO query session runs once when it opens, so that the first
#: query of each length does not pay OpenVINO's per-shape preparation (see _warm_query_lengths).
WARM_QUERY_TOKENS = 64
#: Environment knob: onnxruntime intra-op threads when ``threads`` is not given.
THREADS_ENV = "MAGRETRIEVE_ONNX_THREADS"
#: onnxruntime's session config key for intra-op thread spinning (:attr:`OnnxEncoder.spinning`).
SPINNING_KEY = "session.intra_op.allow_spinning"
#: Devices an OnnxEncoder runs on, and the onnxruntime provider each one needs.
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
#: Runtimes that run the export's graphs: name → (engine, inference precision). ``openvino``
#: reads the same ONNX files (:mod:`magretrieve.serving.openvino_session`, extra ``openvino``); its
#: ``-bf16`` form computes in bfloat16 on CPUs that have it natively (docs/export.md, "Runtimes").
#: An export may name the runtimes its graphs need (``Manifest.runtimes``): dynamic int8 is
#: onnxruntime's, static int8 (OpenVINO IR) OpenVINO's.
RUNTIMES = {
    "onnxruntime": ("onnxruntime", "fp32"),
    "openvino": ("openvino", "fp32"),
    "openvino-bf16": ("openvino", "bf16"),
}


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, which containers and ``taskset`` set)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """Intra-op threads: ``$MAGRETRIEVE_ONNX_THREADS``, else every core this process may use.

    onnxruntime's own default counts the machine's cores, not the process's affinity, so in
    a container limited to 2 of 64 cores it would start 64 threads that fight over 2.
    """
    env = os.environ.get(THREADS_ENV, "").strip()
    if env:
        try:
            value = int(env)
        except ValueError:
            raise ConfigError(f"{THREADS_ENV}={env!r}: not an integer") from None
        if value < 1:
            raise ConfigError(f"{THREADS_ENV}={env!r}: must be at least 1")
        return value
    return available_cores()


def check_runtime(runtime: str | None, device: str, manifest: Manifest) -> str:
    """The runtime to use: ``runtime``, or (None) the export's own default; refuse misfits.

    Refused: an unknown runtime, OpenVINO asked to use CUDA (it runs on the CPU here), and a
    runtime the export does not list in ``Manifest.runtimes``. onnxruntime's dynamic int8
    operators run slower on OpenVINO than on onnxruntime (and than OpenVINO's own fp32), so a
    dynamic int8 export lists only onnxruntime; static int8 exports are OpenVINO IR, which
    onnxruntime cannot read.
    """
    if runtime is None:
        runtime = manifest.runtimes[0] if manifest.runtimes else "onnxruntime"
    if runtime not in RUNTIMES:
        raise ConfigError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    if RUNTIMES[runtime][0] == "openvino" and device != "cpu":
        raise ConfigError(f"runtime {runtime!r} runs on the CPU; use --device cpu with it")
    if manifest.runtimes is not None and runtime not in manifest.runtimes:
        raise ConfigError(
            f"runtime {runtime!r} cannot run {manifest.folder}: it is a "
            f"{manifest.quantization or 'fp32'} export whose graphs run on "
            f"{' or '.join(repr(r) for r in manifest.runtimes)}"
        )
    return runtime


def _onnxruntime() -> Any:
    """onnxruntime, or one line naming the ``serve`` extra that installs it."""
    return require("onnxruntime", what="ONNX serving")


def check_device(device: str) -> str:
    """Refuse an unknown device, or ``cuda`` when onnxruntime has no CUDA provider here."""
    if device not in PROVIDERS:
        raise ConfigError(f"unknown device {device!r}; choose one of {', '.join(PROVIDERS)}")
    ort = _onnxruntime()

    if PROVIDERS[device] not in ort.get_available_providers():
        raise ConfigError(
            f"--device {device}: this onnxruntime has no {PROVIDERS[device]} "
            f"(available: {', '.join(ort.get_available_providers())}); install onnxruntime-gpu "
            "on a machine with a CUDA GPU"
        )
    return device


class OnnxEncoder:
    """Encodes queries and documents with an export folder's ``query.onnx``/``document.onnx``.

    Sessions are opened lazily, so a process that only encodes queries never loads the
    document graph (and its copy of the weights).

    Knobs (docs/export.md, "Speed"): ``threads`` (intra-op threads; default every core the
    process may use, or ``$MAGRETRIEVE_ONNX_THREADS``), ``device`` (``cpu`` or ``cuda``),
    ``runtime`` (:data:`RUNTIMES`: onnxruntime, or OpenVINO in fp32 or bf16; None: the
    export's own, onnxruntime unless its manifest names another), and per call
    ``batch_size`` (most texts per batch) and ``max_batch_tokens`` (padded tokens per batch
    over length-sorted texts).
    """

    #: Whether onnxruntime's intra-op threads spin-wait after each parallel section
    #: (onnxruntime's own default). On cores of its own that is faster: the batcher runs graph
    #: after graph, and awake threads start the next one at once (measured in
    #: ``benchmarks/results/serve_load.md``, docs/serve.md). Where other processes share the
    #: cores, spinning threads take their time slices; False (``--no-onnx-spinning``) lets
    #: them sleep between runs. Set before the sessions open.
    spinning: bool = True

    def __init__(
        self,
        manifest: Manifest,
        threads: int | None = None,
        device: str = "cpu",
        runtime: str | None = None,
    ) -> None:
        Tokenizer = require("tokenizers", what="ONNX serving").Tokenizer

        if manifest.folder is None:
            raise ManifestError("OnnxEncoder needs a manifest loaded from a folder")
        if threads is not None and threads < 1:
            raise ConfigError(f"threads must be at least 1, got {threads}")
        self.manifest = manifest
        self.threads = threads if threads is not None else default_threads()
        self.runtime = check_runtime(runtime, device, manifest)
        self.device = check_device(device)
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
    def load(
        cls,
        folder: str | Path,
        threads: int | None = None,
        device: str = "cpu",
        runtime: str | None = None,
    ) -> OnnxEncoder:
        """Open an export folder, verifying every file's sha256 against the manifest.

        ``threads`` sets the runtime's intra-op thread count (None: :func:`default_threads`);
        ``device="cuda"`` runs the graphs with onnxruntime's CUDA provider; ``runtime`` picks
        the engine that runs the graphs (:data:`RUNTIMES`; None: the export's default).
        """
        return cls(
            Manifest.load(folder, verify=True), threads=threads, device=device, runtime=runtime
        )

    # ------------------------------------------------------------------ properties

    @property
    def dim(self) -> int:
        return self.manifest.dimension

    @property
    def similarity(self) -> Similarity:
        return self.manifest.similarity

    # ------------------------------------------------------------------ sessions

    def session(self, side: str) -> Any:
        """The runtime session of a side, created and probed on first use.

        Only a session that passed :meth:`_probe` is kept, so a graph that disagrees with the
        manifest is refused on every call, not only the first.
        """
        if side not in SIDES:
            raise ConfigError(f"side must be 'query' or 'document', got {side!r}")
        if side not in self._sessions:
            session = self._open_session(side)
            self._probe(side, session)
            self._warm_query_lengths(side, session)
            self._sessions[side] = session
        return self._sessions[side]

    def _warm_query_lengths(self, side: str, session: Any) -> None:
        """On OpenVINO, run one batch-1 query of every length up to :data:`WARM_QUERY_TOKENS`.

        OpenVINO prepares its kernels per input shape the first time it sees one, so a query
        of a length not seen before takes several times the usual latency. Paying that for
        every length at open keeps it out of the first real queries' latency. Lengths past
        :data:`WARM_QUERY_TOKENS` are rare in queries and costlier to warm.
        Documents are not warmed: their batches are long enough that preparation is a small
        share.
        """
        if side != "query" or RUNTIMES[self.runtime][0] != "openvino":
            return
        output = self.manifest.graphs[side].output
        for length in range(1, min(self._max_length(side), WARM_QUERY_TOKENS) + 1):
            session.run([output], self._pad_feed(side, length))

    def _pad_feed(self, side: str, length: int) -> dict[str, np.ndarray]:
        """The side's graph inputs for one text of ``length`` pad tokens, all attended to."""
        ids = np.full((1, length), self.manifest.pad_token_id, dtype=np.int64)
        feed = {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "token_type_ids": np.zeros_like(ids),
        }
        return {name: feed[name] for name in self.manifest.graphs[side].inputs}

    def _open_session(self, side: str) -> Any:
        """A new session of the side's graph on :attr:`runtime` (see :data:`RUNTIMES`)."""
        engine, precision = RUNTIMES[self.runtime]
        path = self.manifest.path(side)
        if engine == "openvino":
            from magretrieve.serving.openvino_session import OpenVinoSession

            return OpenVinoSession(path, threads=self.threads, precision=precision)
        ort = _onnxruntime()

        options = self._session_options()
        providers: list[Any] = [PROVIDERS["cpu"]]
        if self.device == "cuda":
            # TF32 matmuls (onnxruntime's CUDA default on Ampere+) round to ~1e-3, which
            # would break fp32 parity; the CPU provider runs the few operators CUDA lacks.
            providers.insert(0, (PROVIDERS["cuda"], {"use_tf32": 0}))
        try:
            return ort.InferenceSession(str(path), sess_options=options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ManifestError(f"{path}: onnxruntime cannot load the graph ({exc})") from None

    def _session_options(self) -> Any:
        """The onnxruntime ``SessionOptions`` every session of this encoder opens with."""
        ort = _onnxruntime()

        options = ort.SessionOptions()
        # One graph runs at a time per call: parallelism inside operators (intra-op), none
        # between them (the encoder graphs are a chain; inter-op threads only contend).
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry(SPINNING_KEY, "1" if self.spinning else "0")
        return options

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
        try:
            out = session.run([spec.output], self._pad_feed(side, length))[0]
        except Exception as exc:  # onnxruntime's own error types
            raise ManifestError(
                f"{path}: the graph does not run with the manifest's settings "
                f"(max_{side}_length={length}, pad_token_id={m.pad_token_id}): {first_line(exc)}"
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
            encodings: list[Any] = self._tokenizers[side].encode_batch([prefix + t for t in texts])
            return encodings
        except TypeError:  # tokenizers refuses non-str items and lone surrogates alike
            from magretrieve.data.readers import check_text

            for n, t in enumerate(texts):
                if not isinstance(t, str):
                    raise ConfigError(
                        f"{side} text #{n} is a {type(t).__name__}, not a string"
                    ) from None
                check_text(t, f"{side} text #{n}")
            raise

    def feed(self, encodings: Sequence[Any], side: str) -> dict[str, np.ndarray]:
        """The side's graph inputs for a batch of :meth:`tokenize` encodings.

        Padded to the batch's longest text (right padding, as the torch encoder does); what
        the graph is run with, so calibration and benchmarks can feed the graph exactly so.
        """
        inputs = self.manifest.graphs[side].inputs
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
        self,
        texts: Sequence[str],
        side: str,
        batch_size: int,
        progress: bool | str = False,
        max_batch_tokens: int | None = DEFAULT_BATCH_TOKENS,
    ) -> np.ndarray:
        if isinstance(texts, str):
            raise ConfigError("pass a list of texts, not a single string")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        if max_batch_tokens is not None and max_batch_tokens < 1:
            raise ConfigError(f"max_batch_tokens must be at least 1, got {max_batch_tokens}")
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self.encode_tokenized(
            self.tokenize(texts, side), side, batch_size, progress, max_batch_tokens
        )

    def encode_tokenized(
        self,
        encodings: Sequence[Any],
        side: str,
        batch_size: int = DEFAULT_DOCUMENT_BATCH,
        progress: bool | str = False,
        max_batch_tokens: int | None = DEFAULT_BATCH_TOKENS,
    ) -> np.ndarray:
        """Vectors of texts already tokenized by :meth:`tokenize` (in their order).

        Tokenizing and running the graph are separate steps so that an indexing pipeline
        can tokenize the next batch while this one runs (:mod:`magretrieve.serving.indexing`).
        """
        out = np.zeros((len(encodings), self.dim), dtype=np.float32)
        if not len(encodings):
            return out
        spec = self.manifest.graphs[side]
        session = self.session(side)
        # a truncated encoding keeps the cut-off tokens in ``overflowing``
        truncated = sum(1 for e in encodings if e.overflowing)
        with self._count_lock:
            self.last_truncated = truncated
            self.truncated_counts[side] += truncated
        # Longest first, batches closed at the token budget: each batch pads to a similar
        # length, so little compute goes to padding, and short texts share bigger batches.
        batches = token_budget_batches(
            [len(e.ids) for e in encodings], max_tokens=max_batch_tokens, max_rows=batch_size
        )
        desc = progress if isinstance(progress, str) else f"encoding {side}s (onnx)"
        with tqdm(
            total=len(encodings), desc=desc, unit="text", disable=not progress, leave=False
        ) as bar:
            for idx in batches:
                feed = self.feed([encodings[i] for i in idx], side)
                out[idx] = session.run([spec.output], feed)[0]
                bar.update(len(idx))
        return out

    def encode_queries(
        self,
        texts: Sequence[str],
        batch_size: int = 32,
        progress: bool | str = False,
        max_batch_tokens: int | None = DEFAULT_BATCH_TOKENS,
    ) -> np.ndarray:
        """float32 (n, dim) query vectors ``q / ‖q‖^γq``, ready to search a store by inner product."""
        return self._encode(texts, "query", batch_size, progress, max_batch_tokens)

    def encode_documents(
        self,
        texts: Sequence[str],
        batch_size: int = DEFAULT_DOCUMENT_BATCH,
        progress: bool | str = False,
        max_batch_tokens: int | None = DEFAULT_BATCH_TOKENS,
    ) -> np.ndarray:
        """float32 (n, dim) document vectors ``d / ‖d‖^γd``: exactly what a store keeps.

        Texts are sorted by token count and batched so that ``rows × longest`` stays within
        ``max_batch_tokens`` (``None``: fixed ``batch_size`` batches), at most ``batch_size``
        texts each; the vectors come back in input order.
        """
        return self._encode(texts, "document", batch_size, progress, max_batch_tokens)

    def __repr__(self) -> str:
        m = self.manifest
        return (
            f"OnnxEncoder({m.folder}, mode={m.mode}, γq={m.gamma_q:g}, γd={m.gamma_d:g}, "
            f"dim={m.dimension}, quantization={m.quantization}, threads={self.threads}, "
            f"device={self.device}, runtime={self.runtime})"
        )
