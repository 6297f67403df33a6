"""Query vectors an ANN store tunes its search setting on: the user's, or made from the corpus.

An ANN store asked for a recall (``--target-recall``) raises its search knob until a sample of
queries reaches it (:mod:`magretrieve.stores._ann_recall`). The sample decides whether the
promise holds on real traffic, so it should look like real queries for the model at hand:

- :func:`read_query_texts` reads the user's queries (``--tuning-queries FILE``): query texts,
  one per line, or a BEIR ``queries.jsonl``;
- :class:`PseudoQuerySampler` keeps a uniform sample of the documents being indexed and makes
  pseudo-queries from them (a title, a first sentence or a span of text), each held out of the
  ground truth of its own query;

and :func:`encode` turns either into :class:`~magretrieve.stores._ann_recall.TuningQueries`
with the export's **query** graph (plus the prior's offset coordinate when the store holds
one), so the tuning queries are encoded exactly as searches are.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from magretrieve.core.errors import DataError
from magretrieve.core.text import blank
from magretrieve.data.readers import Document, check_text, load_queries, read_error
from magretrieve.stores._ann_recall import PSEUDO, QUERIES, USER, TuningQueries

if TYPE_CHECKING:
    from magretrieve.serving.retriever import Retriever

#: Pseudo-queries made per index run (both halves of the tuning sample).
PSEUDO_QUERIES = 2 * QUERIES
#: Words in a span pseudo-query (a first sentence is cut to the longer bound).
SPAN_WORDS = (6, 16)
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def read_query_texts(path: str | Path) -> list[str]:
    """Query texts from ``path``: a BEIR ``queries.jsonl`` (``_id``, ``text`` per line; by
    the ``.jsonl``/``.json`` suffix) or plain text, one query per line.

    An empty line (nothing, or spaces and tabs only) is skipped; a line holding characters
    but nothing to encode (zero-width spaces, joiners, a BOM: :func:`~magretrieve.core.text.blank`)
    is refused, as a search refuses that text. Every problem is a one-line
    :class:`DataError` naming the file and line.
    """
    path = Path(path)
    if path.suffix.lower() in (".jsonl", ".json"):
        return list(load_queries(path).values())
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise read_error(path, exc) from None
    texts = []
    for lineno, line in enumerate(raw.split(b"\n"), start=1):
        try:
            text = line.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{path}:{lineno}: not valid UTF-8 ({exc.reason} at byte {exc.start})"
            ) from None
        if "\0" in text:
            raise DataError(f"{path}:{lineno}: a NUL byte in a query text (a binary file?)")
        if not text:
            continue
        texts.append(check_query(text, f"{path}:{lineno}"))
    if not texts:
        raise DataError(f"{path}: no queries (one query text per line, or a BEIR queries.jsonl)")
    return texts


def check_query(text: str, where: str) -> str:
    """``text`` if it is valid Unicode with something to encode; a DataError naming ``where``
    if not."""
    if blank(text):
        raise DataError(
            f"{where}: the query is only whitespace and invisible characters (zero-width "
            "spaces, joiners, a BOM): nothing to encode"
        )
    return check_text(text, where)


def pseudo_query(doc: Document, rng: random.Random) -> str | None:
    """A query-like text from one document: its title, its first sentence, or a span of its
    text (chosen at random among those it has); None for a document with no words."""
    choices: list[str] = []
    if not blank(doc.title):
        choices.append(doc.title.strip())
    words = doc.text.split()
    if words:
        first = _SENTENCE.split(doc.text.strip(), maxsplit=1)[0].split()
        choices.append(" ".join(first[: SPAN_WORDS[1]]))
        size = rng.randint(*SPAN_WORDS)
        start = rng.randrange(max(1, len(words) - size + 1))
        choices.append(" ".join(words[start : start + size]))
    choices = [c for c in choices if not blank(c)]  # words of zero-width characters only
    return rng.choice(choices) if choices else None


class PseudoQuerySampler:
    """A uniform (reservoir) sample of ``size`` documents seen while indexing, and the
    pseudo-queries made from them (see the module)."""

    def __init__(self, size: int = PSEUDO_QUERIES, seed: int = 0) -> None:
        self.size = size
        self.seen = 0
        self.docs: list[Document] = []
        self._rng = random.Random(seed)

    def add(self, docs: Sequence[Document]) -> None:
        for doc in docs:
            self.seen += 1
            if len(self.docs) < self.size:
                self.docs.append(doc)
            else:
                j = self._rng.randrange(self.seen)
                if j < self.size:
                    self.docs[j] = doc

    def texts(self) -> tuple[list[str], list[str]]:
        """(pseudo-query texts, the id of the document each was made from)."""
        texts, sources = [], []
        for doc in self.docs:
            text = pseudo_query(doc, self._rng)
            if text:
                texts.append(text)
                sources.append(doc.id)
        return texts, sources


def encode(
    retriever: Retriever,
    texts: Sequence[str],
    kind: str,
    sources: Sequence[str | None] | None = None,
    progress: bool | str = False,
) -> TuningQueries:
    """``texts`` through the retriever's query graph (with ``[q ; 1]`` for a store holding a
    prior's offset coordinate), as :class:`TuningQueries` of ``kind``; ``progress`` (a label)
    shows the encoder's progress bar, for a query file of many lines."""
    if progress:
        # the encoders Retriever.load makes (ONNX, torch) draw a bar; callers of a remote or
        # engine encoder leave progress off
        encoder: Any = retriever.encoder
        encoded = encoder.encode_queries(list(texts), progress=progress)
    else:
        encoded = retriever.encoder.encode_queries(list(texts))
    q = np.asarray(encoded, dtype=np.float32)
    if retriever.offset:
        q = np.hstack([q, np.ones((len(q), 1), dtype=np.float32)])
    return TuningQueries(q, kind, sources)


def user_queries(retriever: Retriever, given: Any) -> TuningQueries:
    """The user's tuning queries: a file (see :func:`read_query_texts`), a list of texts, or
    :class:`TuningQueries` / query vectors already made."""
    if isinstance(given, TuningQueries):
        return given
    if isinstance(given, np.ndarray):
        return TuningQueries(given, USER)
    if isinstance(given, str | Path):
        texts = read_query_texts(given)
    elif isinstance(given, Sequence) and all(isinstance(t, str) for t in given):
        texts = [check_query(t, f"tuning_queries[{n}]") for n, t in enumerate(given)]
        if not texts:
            raise DataError("tuning_queries: no query texts given")
    else:
        raise DataError(
            "tuning_queries: give a file of query texts (one per line, or a BEIR "
            f"queries.jsonl), a list of texts, or query vectors; got {type(given).__name__}"
        )
    return encode(retriever, texts, USER)


def pseudo_queries(retriever: Retriever, sampler: PseudoQuerySampler) -> TuningQueries | None:
    """Pseudo-queries from the sampled documents (None when there is none)."""
    texts, sources = sampler.texts()
    if not texts:
        return None
    return encode(retriever, texts, PSEUDO, sources)
