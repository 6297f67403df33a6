"""What the pydantic-based integrations (LangChain, LlamaIndex) share: one field validator
driven by a table of checks, and the embedding model's source fields (an export folder or a
server), checked once and opened lazily.

Imported only by those integrations, whose frameworks bring pydantic.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, ClassVar

from magretrieve.core.extras import require

require(
    "pydantic",
    what="the LangChain and LlamaIndex integrations",
    extra="langchain",
    hint="or 'magretrieve[llama-index]'",
)

from pydantic import (  # noqa: E402
    BaseModel,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from magretrieve.core.env import API_KEY_ENV  # noqa: E402
from magretrieve.integrations._encoder import (  # noqa: E402
    DEFAULT_TIMEOUT,
    LazyEncoder,
    check_source,
    check_threads,
    check_timeout,
)

__all__ = ["CheckedFields", "EncoderSource", "key_from_env"]


class CheckedFields:
    """A mixin for a pydantic model: each field named in ``_field_checks`` is checked (and
    normalised) by its function before pydantic validates it; the others pass as given."""

    _field_checks: ClassVar[dict[str, Callable[[Any], Any]]] = {}

    @field_validator("*", mode="before")
    @classmethod
    def _check_field(cls, value: Any, info: ValidationInfo) -> Any:
        check = cls._field_checks.get(info.field_name or "")
        return value if check is None else check(value)


def key_from_env() -> SecretStr | None:
    """``$MAGRETRIEVE_API_KEY`` as a secret, None when unset or empty."""
    value = os.environ.get(API_KEY_ENV)
    return SecretStr(value) if value else None


def _vectors(vectors: Any) -> list[list[float]]:
    return [[float(x) for x in v] for v in vectors]


class EncoderSource(CheckedFields, BaseModel):
    """The source of a framework embedding model: ``export_dir`` (encoded in this process by
    the export's shared engine; ``threads``, ``runtime`` as for ``OnnxEncoder``) or ``url`` (a
    ``magretrieve serve`` base URL with ``api_key``; ``timeout`` seconds per request).

    ``api_key`` is never serialized: not by ``model_dump``/``to_dict``, and not by pickle (a
    framework that pickles the model for worker processes gets one without the key, which
    reads ``$MAGRETRIEVE_API_KEY`` in the process that unpickles it).
    """

    _field_checks = {"threads": check_threads, "timeout": check_timeout}

    export_dir: str | None = Field(default=None, description="An export folder (in-process).")
    url: str | None = Field(default=None, description="A magretrieve serve base URL (remote).")
    api_key: SecretStr | None = Field(
        default_factory=key_from_env,
        exclude=True,
        description="The server's key; default $MAGRETRIEVE_API_KEY.",
    )
    threads: int | None = Field(default=None, description="onnxruntime threads (in-process).")
    runtime: str | None = Field(default=None, description="The graphs' runtime (in-process).")
    timeout: float = Field(default=DEFAULT_TIMEOUT, description="Seconds per request (remote).")

    _encoder: LazyEncoder = PrivateAttr()

    @model_validator(mode="after")
    def _check_source(self) -> Any:
        self.export_dir, self.url = check_source(self.export_dir, self.url)
        return self

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        self._open_source()

    def __getstate__(self) -> dict[Any, Any]:
        state = super().__getstate__()
        state["__dict__"] = {k: v for k, v in state["__dict__"].items() if k != "api_key"}
        return state

    def __setstate__(self, state: dict[Any, Any]) -> None:
        super().__setstate__(state)
        if "api_key" not in self.__dict__:  # the default: $MAGRETRIEVE_API_KEY, read here
            field = type(self).model_fields["api_key"]
            self.__dict__["api_key"] = field.get_default(call_default_factory=True)
        self._open_source()

    def _open_source(self) -> None:
        """The lazily opened encoder of these fields (the key resolved when it opens)."""
        key = self.api_key
        self._encoder = LazyEncoder(
            self.export_dir,
            self.url,
            api_key=(lambda: key.get_secret_value()) if key is not None else None,
            threads=self.threads,
            runtime=self.runtime,
            timeout=self.timeout,
        )

    def _embed(
        self, texts: list[str], side: str, batch_size: int | None = None
    ) -> list[list[float]]:
        """Vectors of ``texts`` by the ``side`` graph, as lists of floats."""
        return _vectors(self._encoder.encode(texts, side, batch_size=batch_size))

    async def _aembed(
        self, texts: list[str], side: str, batch_size: int | None = None
    ) -> list[list[float]]:
        """:meth:`_embed` for asyncio: concurrent calls share the engine's batches."""
        return _vectors(await self._encoder.aencode(texts, side, batch_size=batch_size))
