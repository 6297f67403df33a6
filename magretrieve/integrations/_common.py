"""What the framework retrievers share: checking the wrapped retriever and its options, the
search with its filter, hit -> text + metadata."""

from __future__ import annotations

from typing import Any

from magretrieve.core.errors import ConfigError

#: Metadata keys every framework result carries (the contract), besides the payload's fields.
SCORE_KEYS = ("id", "score", "doc_norm", "cosine", "query_norm", "rank")


def check_retriever(retriever: Any) -> Any:
    """The wrapped object must search like a :class:`~magretrieve.serving.retriever.Retriever`."""
    if not callable(getattr(retriever, "search", None)):
        raise ConfigError(
            f"retriever must be a magretrieve Retriever (Retriever.load(EXPORT, store=SPEC)), "
            f"got {type(retriever).__name__}"
        )
    return retriever


def check_top_k(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def hit_text(hit: Any) -> str:
    """The text a framework shows for a hit: the stored text, else the title."""
    payload = hit.payload or {}
    return str(payload.get("text") or payload.get("title") or "")


def hit_metadata(hit: Any) -> dict[str, Any]:
    """The payload's fields (except the text itself), the score decomposition, and the payload.

    Score keys win over payload fields of the same name; the full payload stays under
    ``"payload"``.
    """
    payload = dict(hit.payload or {})
    meta = {k: v for k, v in payload.items() if k != "text"}
    meta.update(
        {
            "id": hit.id,
            "score": float(hit.score),
            "doc_norm": float(hit.doc_norm),
            "cosine": float(hit.cosine),
            "query_norm": float(hit.query_norm),
            "rank": int(hit.rank),
            "payload": payload,
        }
    )
    return meta


def check_where_option(where: Any) -> dict[str, Any] | None:
    """A payload filter for :meth:`Retriever.search <magretrieve.serving.retriever.Retriever.search>`
    (``{field: value}``, the syntax of the server's ``/search`` filter), checked when given."""
    from magretrieve.serving.retriever import check_where

    return check_where(where)


def search_kwargs(where: dict[str, Any] | None) -> dict[str, Any]:
    """The ``where`` keyword of a search, only when a filter is set (a retriever-like object
    that takes no filter still works without one)."""
    return {"where": where} if where else {}


def search_hits(
    retriever: Any, query: str, k: int, where: Any, default: dict[str, Any] | None
) -> list[Any]:
    """The top-``k`` hits of ``query``, filtered by ``where`` (checked) when given, else by the
    framework object's ``default`` filter (None: no filter)."""
    wanted = default if where is None else check_where_option(where)
    return list(retriever.search(query, k=k, **search_kwargs(wanted)))
