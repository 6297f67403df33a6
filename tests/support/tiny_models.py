"""Tiny models and data built on the spot, for the tests and the benchmarks' smoke runs.

Nothing is downloaded: the tokenizer is a WordPiece vocabulary written here, the weights are
random. ``build_tiny_bert`` needs torch and transformers (the ``train`` extra) and imports them
only when called; ``write_tiny_beir`` needs nothing. Benchmarks load this file by its path
(``benchmarks/_common.py``, ``tiny_models``).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = [
    "RUNTIME_TEXTS",
    "TINY_TOPICS",
    "build_tiny_bert",
    "build_tiny_sentence_transformer",
    "write_tiny_beir",
]

#: Texts both runtimes encode in the OpenVINO and static-int8 tests: short, long, one word,
#: non-ASCII.
RUNTIME_TEXTS = [
    "magnitude as a relevance prior",
    "a much longer document about boundary layers, pressure gradients and the flow over a wing",
    "short",
    "ÜNÏCÖDÉ heart rate and vitamin dose",
    "cosine throws the length of each vector away",
]

WORDS = (
    "the a of and to in is for on with statin statins mortality heart risk cancer cell cells "
    "protein gene brain blood drug trial patients reduce increase effect study wing flow "
    "pressure air speed boundary layer plane engine heat what does cause causes how why "
    "low high dose vitamin aspirin smoking lung liver kidney mouse mice human model data"
).split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_tiny_bert(folder: Path, seed: int = 0) -> Path:
    """Write a random 2-layer BERT (hidden 32) with a WordPiece tokenizer into ``folder``."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    chars = list("abcdefghijklmnopqrstuvwxyz0123456789.,-?")
    tokens = SPECIALS + WORDS + chars + ["##" + c for c in chars]
    tokenizer = BertTokenizerFast(vocab={t: i for i, t in enumerate(tokens)}, do_lower_case=True)
    tokenizer.save_pretrained(str(folder))
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    BertModel(config).eval().save_pretrained(str(folder), safe_serialization=True)
    return folder


def build_tiny_sentence_transformer(
    folder: Path, pooling: str = "mean", normalize: bool = True
) -> Path:
    """A sentence-transformers folder (Transformer + Pooling [+ Normalize]) around a tiny BERT."""
    build_tiny_bert(folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
        (folder / "2_Normalize").mkdir(exist_ok=True)
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": 32,
                "pooling_mode_cls_token": pooling == "cls",
                "pooling_mode_mean_tokens": pooling == "mean",
                "pooling_mode_lasttoken": pooling == "last",
            }
        )
    )
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 48}))
    return folder


#: The six topics of the tiny BEIR set (two documents each).
TINY_TOPICS = (
    "statins heart",
    "cancer cell",
    "brain protein",
    "wing flow",
    "lung smoking",
    "vitamin dose",
)


def write_tiny_beir(folder: Path) -> Path:
    """A 12-document BEIR folder with train and test qrels."""
    folder.mkdir(parents=True, exist_ok=True)
    docs, queries, train, test = [], [], [], []
    for i, topic in enumerate(TINY_TOPICS):
        for j in range(2):
            docs.append(
                {
                    "_id": f"d{i}{j}",
                    "title": topic,
                    "text": f"{topic} study {j} of the effect on patients",
                }
            )
        queries.append({"_id": f"q{i}", "text": f"what does {topic} cause"})
        queries.append({"_id": f"t{i}", "text": f"how {topic} risk"})
        train.append((f"q{i}", f"d{i}0", 1))
        test.append((f"t{i}", f"d{i}1", 1))
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (folder / "qrels").mkdir(exist_ok=True)
    for name, rows in (("train", train), ("test", test)):
        body = "".join(f"{q}\t{d}\t{s}\n" for q, d, s in rows)
        (folder / "qrels" / f"{name}.tsv").write_text("query-id\tcorpus-id\tscore\n" + body)
    return folder
