"""Where the framework embeddings get their vectors: an export folder or a running server.

Every framework class here is built from either ``export_dir`` (the process's
:class:`~magretrieve.serving.engine.EmbeddingEngine` of that export, shared by every component
over it, so their concurrent calls share batches) or ``url`` (+ API key, a
:class:`~magretrieve.serving.remote.RemoteEncoder` talking to ``magretrieve serve``); both
encode queries with the query graph and documents with the document graph, so one object
gives each side its own vectors. :class:`LazyEncoder` opens either on first use, once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.core.errors import ConfigError
from magretrieve.integrations._common import check_top_k
from magretrieve.serving.remote import DEFAULT_TIMEOUT, check_texts, check_url

__all__ = ["DEFAULT_TIMEOUT", "LazyEncoder", "check_source"]


def check_source(export_dir: Any, url: Any) -> tuple[str | None, str | None]:
    """Exactly one of an export folder path and a server URL, checked."""
    if (export_dir is None) == (url is None):
        raise ConfigError(
            "give either export_dir (an export folder, encoded in this process) or url "
            "(a magretrieve serve base URL, with api_key), not "
            + ("both" if export_dir is not None else "neither")
        )
    if export_dir is not None:
        if not isinstance(export_dir, (str, Path)) or not str(export_dir):
            raise ConfigError(f"export_dir must be an export folder path, got {export_dir!r}")
        return str(export_dir), None
    return None, check_url(url)


def check_threads(value: Any) -> int | None:
    return None if value is None else check_top_k(value, "threads")


def check_timeout(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"timeout must be a positive number of seconds, got {value!r}")
    return float(value)


class LazyEncoder:
    """The export's shared ``EmbeddingEngine`` or the server's ``RemoteEncoder``, opened once
    on first use.

    ``api_key`` is called when the remote encoder opens (a Haystack ``Secret`` or a pydantic
    ``SecretStr`` is resolved then, not kept as text by the framework object). A pickle holds
    the source without the key or the opened encoder: the framework object that owns this one
    builds it anew from its own key when unpickled. A deep copy keeps the key, unopened.
    """

    def __init__(
        self,
        export_dir: str | None = None,
        url: str | None = None,
        api_key: Callable[[], str | None] | None = None,
        threads: int | None = None,
        runtime: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.export_dir, self.url = check_source(export_dir, url)
        self.api_key = api_key
        self.threads, self.runtime, self.timeout = threads, runtime, timeout
        self._encoder: Any = None
        self._lock = threading.Lock()

    @property
    def remote(self) -> bool:
        return self.url is not None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "api_key": None, "_encoder": None, "_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __deepcopy__(self, memo: dict[int, Any]) -> LazyEncoder:
        return LazyEncoder(
            self.export_dir,
            self.url,
            api_key=self.api_key,
            threads=self.threads,
            runtime=self.runtime,
            timeout=self.timeout,
        )

    def get(self, side: str) -> Any:
        """The opened encoder; in local mode the side's graph is loaded and checked once."""
        with self._lock:
            if self._encoder is None:
                if self.url is not None:
                    from magretrieve.serving.remote import RemoteEncoder

                    key = self.api_key() if self.api_key is not None else None
                    self._encoder = RemoteEncoder(self.url, key, timeout=self.timeout)
                else:
                    from magretrieve.serving.engine import shared_engine

                    self._encoder = shared_engine(
                        str(self.export_dir), threads=self.threads, runtime=self.runtime
                    )
            if self.url is None:
                self._encoder.session(side)  # checks the graph against the manifest once
            return self._encoder

    def warm_up(self, side: str) -> None:
        """Open the encoder (local: the side's graph; remote: the server's ``/info``)."""
        encoder = self.get(side)
        if self.url is not None:
            encoder.info()

    def encode(self, texts: Sequence[str], side: str, batch_size: int | None = None) -> np.ndarray:
        """float32 (n, dim) vectors of ``texts`` by the ``side`` graph; blank texts refused.

        ``batch_size`` is the most texts per request to a server, or per call to this
        process's engine (whose batcher may merge concurrent calls within its token budget).
        """
        texts = check_texts(texts, side)  # one message for local and remote alike
        encoder = self.get(side)
        if self.url is None:
            return np.asarray(encoder.encode(texts, side, batch_size), dtype=np.float32)
        fn = encoder.encode_queries if side == "query" else encoder.encode_documents
        if batch_size is None:
            return np.asarray(fn(texts), dtype=np.float32)
        return np.asarray(fn(texts, batch_size=batch_size), dtype=np.float32)

    async def aencode(
        self, texts: Sequence[str], side: str, batch_size: int | None = None
    ) -> np.ndarray:
        """:meth:`encode` for asyncio: in this process the engine's batches are awaited (no
        thread held per call); a server is called from a worker thread."""
        if self.url is not None:
            return await asyncio.to_thread(self.encode, texts, side, batch_size)
        texts = check_texts(texts, side)
        engine = await asyncio.to_thread(self.get, side)  # the first call opens the export
        return np.asarray(await engine.aencode(texts, side, batch_size), dtype=np.float32)
