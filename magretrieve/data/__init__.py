"""Reading and validating retrieval data (BEIR folders, pair files) and mining weak pairs.

Every problem is a :class:`~magretrieve.core.errors.DataError` naming the file and line at
fault. The readers live in :mod:`magretrieve.data.readers`; the names below are the public ones.
"""

from magretrieve.data.readers import (
    Document,
    RetrievalDataset,
    SentencePair,
    TrainingData,
    TrainingPair,
    iter_corpus,
    load_beir,
    load_corpus,
    load_pairs,
    load_qrels,
    load_queries,
    load_sentence_pairs,
    load_training_data,
    parse_data_spec,
    read_jsonl,
    read_training_data,
)

__all__ = [
    "Document",
    "RetrievalDataset",
    "SentencePair",
    "TrainingData",
    "TrainingPair",
    "iter_corpus",
    "load_beir",
    "load_corpus",
    "load_pairs",
    "load_qrels",
    "load_queries",
    "load_sentence_pairs",
    "load_training_data",
    "parse_data_spec",
    "read_jsonl",
    "read_training_data",
]
