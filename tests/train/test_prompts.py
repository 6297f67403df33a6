"""sentence-transformers prompts become the query/document prefixes, end to end.

E5 (``query: `` / ``passage: ``) and BGE (a query instruction) ship their prefixes as
``prompts`` in ``config_sentence_transformers.json``; a loader that ignores them silently
produces the wrong vectors.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from magretrieve.core.config import prompt_prefixes, read_sentence_transformers
from magretrieve.core.errors import ConfigError
from tests.support.tiny_models import build_tiny_sentence_transformer


def st_folder_with_prompts(folder: Path, prompts: dict, default: str | None = None) -> Path:
    build_tiny_sentence_transformer(folder)
    config = {"prompts": prompts, "default_prompt_name": default, "similarity_fn_name": "cosine"}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    ("prompts", "default", "query", "document"),
    [
        ({"query": "query: ", "passage": "passage: "}, None, "query: ", "passage: "),  # E5
        ({"query": "Represent this sentence for searching relevant passages: "}, None,
         "Represent this sentence for searching relevant passages: ", ""),  # BGE
        ({"query": "q: ", "document": "d: ", "corpus": "c: "}, None, "q: ", "d: "),
        ({"retrieval": "r: "}, "retrieval", "r: ", "r: "),  # default applies to both sides
        ({"query": "q: ", "retrieval": "r: "}, "retrieval", "q: ", "r: "),
        ({}, None, "", ""),
    ],
)  # fmt: skip
def test_prompt_prefixes_follow_sentence_transformers(prompts, default, query, document) -> None:
    got = prompt_prefixes({"prompts": prompts, "default_prompt_name": default}, "cfg.json")
    assert got == {"query_prefix": query, "document_prefix": document}


def test_unused_prompts_are_named_in_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="magretrieve.core.config"):
        prompt_prefixes({"prompts": {"query": "q: ", "clustering": "c: "}}, "cfg.json")
    assert "clustering" in caplog.text


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"prompts": ["query: "]}, "'prompts' must map"),
        ({"prompts": {"query": 1}}, "'prompts' must map"),
        ({"prompts": {"query": "q"}, "default_prompt_name": "nope"}, "default_prompt_name 'nope'"),
    ],
)
def test_malformed_prompts_refused(config: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        prompt_prefixes(config, "cfg.json")


def test_prompts_reach_encoder_manifest_and_onnx_encoder(tmp_path: Path) -> None:
    from magretrieve.core.manifest import Manifest
    from magretrieve.export import export_model
    from magretrieve.serving.onnx_encoder import OnnxEncoder
    from magretrieve.train.encoder import Encoder

    folder = st_folder_with_prompts(tmp_path / "st", {"query": "query: ", "passage": "passage: "})
    assert read_sentence_transformers(folder)[1]["query_prefix"] == "query: "
    encoder = Encoder.load(folder, mode="cosine", device="cpu")
    assert (encoder.config.query_prefix, encoder.config.document_prefix) == ("query: ", "passage: ")

    plain = Encoder.load(build_tiny_sentence_transformer(tmp_path / "plain"), device="cpu")
    texts = ["statins heart risk", "wing flow"]
    # the prefix changes the vectors: same weights, with and without the prompt
    assert not np.allclose(encoder.encode_queries(texts), plain.encode_queries(texts), atol=1e-4)
    np.testing.assert_allclose(
        encoder.encode_queries(texts),
        plain.encode_queries(["query: " + t for t in texts]),
        atol=1e-6,
    )

    export = export_model(encoder, tmp_path / "export", exporter="torchscript")
    manifest = Manifest.load(export)
    assert manifest.encoder.query_prefix == "query: "
    assert manifest.encoder.document_prefix == "passage: "
    onnx = OnnxEncoder.load(export, threads=1)
    np.testing.assert_allclose(onnx.encode_queries(texts), encoder.encode_queries(texts), atol=1e-5)
    np.testing.assert_allclose(
        onnx.encode_documents(texts), encoder.encode_documents(texts), atol=1e-5
    )


def test_explicit_prefix_overrides_the_prompt(tmp_path: Path) -> None:
    from magretrieve.train.encoder import Encoder

    folder = st_folder_with_prompts(tmp_path / "st", {"query": "query: "})
    encoder = Encoder.load(folder, query_prefix="", device="cpu")
    assert encoder.config.query_prefix == ""
