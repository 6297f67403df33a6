"""Weak-supervision pair mining: title → abstract and sentence → rest of the abstract."""

from __future__ import annotations

import pytest

from magretrieve.core.errors import ConfigError
from magretrieve.data.readers import Document
from magretrieve.data.weak_pairs import (
    mine_weak_pairs,
    sentence_pairs,
    split_sentences,
    title_pairs,
)

ABSTRACT = (
    "Statins lower cholesterol in most adults. We followed 2,000 patients for 5 years. "
    "Mortality fell by 12 percent (p < 0.01). Short one. Effects on cancer were not seen."
)
CORPUS = {
    "a": Document("a", ABSTRACT, "Statins and mortality in adults"),
    "b": Document("b", "Only one sentence here about wings.", "Wing flow at high speed"),
    "c": Document(
        "c", "Text without a usable title. It has two more sentences. Third one here ok.", "Hi"
    ),
}


def test_split_sentences_keeps_decimals_and_numbers() -> None:
    assert split_sentences(ABSTRACT) == [
        "Statins lower cholesterol in most adults.",
        "We followed 2,000 patients for 5 years.",
        "Mortality fell by 12 percent (p < 0.01).",
        "Short one.",
        "Effects on cancer were not seen.",
    ]


def test_title_pairs() -> None:
    pairs = title_pairs(CORPUS)
    assert [(p.query, p.positive, p.positive_id) for p in pairs] == [
        ("Statins and mortality in adults", ABSTRACT, "a"),
        ("Wing flow at high speed", "Only one sentence here about wings.", "b"),
    ]  # "Hi" is too short a title


def test_title_pairs_skip_titles_and_texts_with_nothing_to_encode() -> None:
    """Zero-width characters are words to ``str.split`` but nothing to a tokenizer."""
    corpus = {
        "z": Document("z", "A real abstract.", title="\u200b \u2060 \ufeff"),
        "t": Document("t", "\u200b\u2060", title="A title of words"),
        "ok": Document("ok", "A real abstract.", title="A title of words"),
    }
    assert [p.positive_id for p in title_pairs(corpus)] == ["ok"]


def test_sentence_pairs_remove_the_query_sentence() -> None:
    pairs = sentence_pairs(CORPUS, seed=3)
    assert [p.positive_id for p in pairs] == ["a", "c"]  # b has one sentence
    for p in pairs:
        doc = CORPUS[p.positive_id]
        assert p.query in split_sentences(doc.text)
        assert p.query not in p.positive
        assert len(p.query.split()) >= 5
        assert p.positive.startswith(doc.title)
        # every other sentence is kept, in order
        rest = [s for s in split_sentences(doc.text) if s != p.query]
        assert p.positive == f"{doc.title} " + " ".join(rest)
    assert [p.query for p in sentence_pairs(CORPUS, seed=3)] == [p.query for p in pairs]


def test_mine_weak_pairs_kinds_exclusion_and_limit() -> None:
    both = mine_weak_pairs(CORPUS, seed=1)
    assert len(both) == 4
    only_titles = mine_weak_pairs(CORPUS, ["title"], exclude_ids=["a"])
    assert [p.positive_id for p in only_titles] == ["b"]
    assert len(mine_weak_pairs(CORPUS, limit=2)) == 2
    with pytest.raises(ConfigError, match="unknown weak pair"):
        mine_weak_pairs(CORPUS, ["question"])
