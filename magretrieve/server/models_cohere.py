"""Cohere's embed bodies (``POST /v1/embed``, ``POST /v2/embed``), as the ``cohere`` SDK sends
and parses them.

Cohere's ``input_type`` is required and names the side per call (``search_query`` /
``search_document``), so one framework object (LangChain ``CohereEmbeddings``, LlamaIndex and
Haystack Cohere embedders) gets query vectors from its query method and document vectors from
its document method. Only what the graphs can do is accepted: text, float vectors, truncation
at the end; the rest is refused by the handler in one line.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class CohereEmbedRequest(BaseModel):
    """``POST /v1/embed``."""

    model_config = ConfigDict(extra="forbid")

    texts: list[str] | None = Field(None, description="The texts (required: text only).")
    images: list[str] | None = Field(None, description="Refused: this server embeds text.")
    model: str | None = Field(
        None, description="A served id (GET /v1/models); ID:query / ID:document name a side."
    )
    input_type: str | None = Field(
        None,
        description="search_query (query graph) or search_document (document graph, magnitude "
        "kept); query/document too. Required unless the model id names the side.",
    )
    embedding_types: list[str] | None = Field(
        None, description="['float'] only (other types are refused)."
    )
    truncate: Literal["NONE", "START", "END"] | None = Field(
        None,
        description="END (default): cut at the side's max length; NONE: a too-long text is a "
        "413; START is refused (the graphs cut at the end only).",
    )


class CohereEmbedV2Request(CohereEmbedRequest):
    """``POST /v2/embed``: v1's fields and v2's."""

    inputs: list[Any] | None = Field(None, description="Refused: send texts.")
    max_tokens: int | None = Field(
        None, description="Refused: texts are cut at the side's max length."
    )
    output_dimension: int | None = Field(None, description="Refused: a cut vector loses its norm.")
    priority: int | None = Field(None, description="Accepted and ignored.")


class CohereApiVersion(BaseModel):
    version: str


class CohereBilledUnits(BaseModel):
    input_tokens: int


class CohereMeta(BaseModel):
    api_version: CohereApiVersion
    billed_units: CohereBilledUnits


class CohereFloats(BaseModel):
    float_: list[list[float]] = Field(alias="float", description="One float vector per text.")


class _CohereResponse(BaseModel):
    id: str
    texts: list[str]
    meta: CohereMeta
    input_type: Literal["query", "document"] = Field(description="The side that encoded them.")
    truncated: list[bool] = Field(description="Per text: cut at the side's max length.")


class CohereFloatsResponse(_CohereResponse):
    """v1 without ``embedding_types``."""

    response_type: Literal["embeddings_floats"]
    embeddings: list[list[float]]


class CohereByTypeResponse(_CohereResponse):
    """v1 with ``embedding_types``, and every v2 answer."""

    response_type: Literal["embeddings_by_type"]
    embeddings: CohereFloats
