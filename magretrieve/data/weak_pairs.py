"""Weak-supervision training pairs mined from a corpus (no labels needed).

Two kinds, both classic for scientific abstracts:

* **title → abstract**: the title is the query, the abstract (without the title) the positive;
* **sentence → rest**: one sentence of an abstract is the query, the abstract without that
  sentence the positive (an inverse-cloze task).

They test the paper's "sufficient data" condition: does raw qnorm start to pay once an
encoder sees thousands of pairs instead of 919? Mining uses corpus texts only, never qrels.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping

from magretrieve.core.errors import ConfigError
from magretrieve.core.text import blank
from magretrieve.data.readers import Document, TrainingPair

KINDS = ("title", "sentence")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\[])")


def split_sentences(text: str) -> list[str]:
    """Split on '.', '!' or '?' followed by space and an upper-case letter, digit or bracket."""
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]


def title_pairs(corpus: Mapping[str, Document], min_words: int = 3) -> list[TrainingPair]:
    """(title, abstract) for every document with a title of ``min_words``+ words and a text."""
    return [
        TrainingPair(doc.title.strip(), doc.text.strip(), positive_id=doc_id)
        for doc_id, doc in corpus.items()
        if len(doc.title.split()) >= min_words and not blank(doc.title) and not blank(doc.text)
    ]


def sentence_pairs(
    corpus: Mapping[str, Document], seed: int = 0, min_words: int = 5, min_sentences: int = 3
) -> list[TrainingPair]:
    """One (sentence, rest of the abstract) pair per document with ``min_sentences``+ sentences.

    The sentence is drawn with a seeded RNG among those of ``min_words``+ words; the positive
    keeps the title (it is part of the document as indexed) but not the drawn sentence.
    """
    rng = random.Random(seed)
    pairs = []
    for doc_id, doc in corpus.items():
        sentences = split_sentences(doc.text)
        if len(sentences) < min_sentences:
            continue
        candidates = [i for i, s in enumerate(sentences) if len(s.split()) >= min_words]
        if not candidates:
            continue
        pick = rng.choice(candidates)
        rest = " ".join(s for i, s in enumerate(sentences) if i != pick)
        positive = f"{doc.title.strip()} {rest}".strip() if doc.title.strip() else rest
        pairs.append(TrainingPair(sentences[pick], positive, positive_id=doc_id))
    return pairs


def mine_weak_pairs(
    corpus: Mapping[str, Document],
    kinds: Iterable[str] = KINDS,
    *,
    exclude_ids: Iterable[str] = (),
    limit: int | None = None,
    seed: int = 0,
) -> list[TrainingPair]:
    """Pairs of the requested ``kinds``, skipping ``exclude_ids``, shuffled, at most ``limit``."""
    kinds = list(kinds)
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ConfigError(f"unknown weak pair kind(s) {unknown}; choose from {', '.join(KINDS)}")
    excluded = set(exclude_ids)
    docs = {i: d for i, d in corpus.items() if i not in excluded}
    pairs: list[TrainingPair] = []
    if "title" in kinds:
        pairs += title_pairs(docs)
    if "sentence" in kinds:
        pairs += sentence_pairs(docs, seed=seed)
    random.Random(seed).shuffle(pairs)
    return pairs[:limit] if limit is not None else pairs
