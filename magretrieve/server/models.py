"""Request and response bodies (pydantic), in the shapes clients already speak.

``/v1/embeddings`` is OpenAI's shape plus ``input_type`` (the asymmetric-encoder convention,
Cohere's ``search_query``/``search_document`` included) and Voyage's request fields; ``/embed``
is text-embeddings-inference's (Cohere's ``/v1/embed`` lives in :mod:`.models_cohere`);
``/search`` answers what ``magretrieve search --json`` prints. Response models document the
answers in the OpenAPI schema; the handlers write the bytes themselves (orjson) for speed.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator
from pydantic_core import PydanticCustomError

#: Accepted ``input_type`` values and the side each one names.
INPUT_TYPES = {
    "query": "query",
    "search_query": "query",
    "document": "document",
    "search_document": "document",
}
InputType = Literal["query", "document", "search_query", "search_document"]
Scalar = str | int | float | bool | None


#: What a request of token ids is told (LangChain's OpenAIEmbeddings sends them by default).
TOKEN_IDS = (
    "token ids are refused: send text (this server tokenizes with the export's own tokenizer; "
    "LangChain OpenAIEmbeddings: set check_embedding_ctx_length=False)"
)


def refuse_token_ids(value: Any) -> Any:
    """A list of ints or of int lists (pre-tokenized input) is a 422 that says to send text."""
    if isinstance(value, list) and any(
        (isinstance(v, int) and not isinstance(v, bool)) or isinstance(v, list) for v in value
    ):
        raise PydanticCustomError("token_ids", TOKEN_IDS)
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EmbeddingsRequest(_Strict):
    input: str | list[str] = Field(description="One text or a list of texts (not token ids).")
    model: str | None = Field(
        None,
        description="A served id (GET /v1/models): ID:query or ID:document names the side; the "
        "bare ID names none; another model is a 404. Echoed back.",
    )
    input_type: InputType | None = Field(
        None,
        description="Which graph encodes the texts: query (query graph) or document (document "
        "graph, magnitude kept). The side is required, here, in the model id or in the route: "
        "the two sides are different functions.",
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="float: JSON numbers; base64: little-endian float32 bytes."
    )
    dimensions: int | None = Field(
        None, description="Refused: cutting a vector changes its norm, which carries relevance."
    )
    normalize: bool | None = Field(
        None, description="Refused for documents (it would drop their magnitude)."
    )
    truncate: bool | None = Field(
        None,
        description="Cut texts past the side's max length (reported per item; the default), "
        "or refuse them (false).",
    )
    user: str | None = Field(None, description="Accepted and ignored (OpenAI compatibility).")
    truncation: bool | None = Field(None, description="Voyage's name of truncate.")
    output_dtype: str | None = Field(
        None, description="Voyage's field: null or 'float' (quantized types are refused)."
    )
    output_dimension: int | None = Field(
        None, description="Voyage's field: refused like dimensions."
    )

    _no_token_ids = field_validator("input", mode="before")(refuse_token_ids)


class EmbeddingItem(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str
    norm: float = Field(description="L2 norm of the vector as returned (its magnitude).")
    truncated: bool = Field(description="The text was cut at the side's max length.")


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingItem]
    model: str
    input_type: Literal["query", "document"]
    usage: Usage


class EmbedRequest(_Strict):
    """text-embeddings-inference's ``/embed`` body, plus the side."""

    inputs: str | list[str] = Field(description="One text or a list of texts (not token ids).")
    truncate: bool = Field(
        False, description="TEI's default: a text past the max length is refused (413)."
    )
    normalize: bool | None = Field(
        None,
        description="Unset: vectors as the side's graph gives them. true is refused for "
        "documents; for queries it only rescales every score of a query alike.",
    )
    input_type: InputType | None = Field(None, description="query or document (required).")
    prompt_name: InputType | None = Field(None, description="Alias of input_type (TEI's field).")
    truncation_direction: Literal["right", "Right"] | None = Field(
        None, description="Only right truncation, as the graphs' tokenizer cuts."
    )

    _no_token_ids = field_validator("inputs", mode="before")(refuse_token_ids)


class SearchRequest(_Strict):
    query: str | None = Field(None, description="One query text (answer: one result).")
    queries: list[str] | None = Field(None, description="Several queries (answer: a list).")
    k: StrictInt = Field(
        10, ge=1, description='Hits per query: a JSON integer (not true, 5.0 or "5").'
    )
    filter: dict[str, Scalar] | None = Field(
        None,
        description="Keep only hits whose payload field equals the value, for every field "
        "given (applied to the store's exact candidates; see docs/serve.md).",
    )


class Hit(BaseModel):
    """One hit and its score's parts: ``score = query_norm · doc_norm · cosine + offset``."""

    rank: int
    id: str
    score: float
    doc_norm: float = Field(
        description="The stored vector's norm: the document's magnitude, or in a store with a "
        "document prior (GET /info: store.prior) that prior's multiplier m(d)."
    )
    cosine: float
    query_norm: float
    multiplier: float = Field(description="doc_norm, named as a prior's multiplier m(d).")
    offset: float = Field(description="A document prior's offset b(d); 0 without one.")
    payload: dict[str, Any]


class SearchResult(BaseModel):
    query: str
    truncated: bool
    hits: list[Hit]


class DocumentsRequest(_Strict):
    documents: list[dict[str, Any]] = Field(
        description="Corpus JSONL lines, read as `magretrieve index` reads them: _id, title, "
        "text; every other field (id and payload included) is kept as payload."
    )


class DocumentsResponse(BaseModel):
    upserted: int
    ids: list[str]
    truncated: list[str] = Field(description="Ids whose text was cut at max_document_length.")


class DeleteRequest(_Strict):
    ids: list[str]


class DeleteResponse(BaseModel):
    deleted: int


class Status(BaseModel):
    status: str


class ErrorDetail(BaseModel):
    message: str
    type: str
    code: int


class ErrorResponse(BaseModel):
    error: ErrorDetail
