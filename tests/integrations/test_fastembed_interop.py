"""fastembed runs an export's document graph as a custom model and gets OnnxEncoder's vectors.

The recipe of docs/stores.md ("fastembed"): a folder with ``document.onnx``, the export's
``tokenizer.json`` and a ``tokenizer_config.json`` carrying the document side's max length
and pad token; ``TextEmbedding.add_custom_model(..., pooling=DISABLED, normalization=False,
output_name=<the graph's output>)``; loaded from local files only. fastembed applies no
prefix, so the caller prepends the manifest's document prefix; without it the vectors differ
(checked, so the test shows what fastembed leaves out).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from fastembed import TextEmbedding
from fastembed.common.model_description import ModelSource, PoolingType
from tokenizers import Tokenizer

from magretrieve.core.manifest import Manifest
from magretrieve.serving.onnx_encoder import OnnxEncoder

PREFIX = "the "
TEXTS = [
    "statins reduce heart risk",
    "wing flow",
    "a much longer document about boundary layers, pressure gradients and the flow over a wing "
    * 12,  # longer than the document max length: both sides must truncate alike
    "ÜNÏCÖDÉ heart rate and vitamin dose",
]


@pytest.fixture(scope="module")
def export_dir(tiny_model_dir, tmp_path_factory):
    from magretrieve.export import export_model
    from magretrieve.train.encoder import Encoder

    enc = Encoder.load(
        tiny_model_dir,
        document_prefix=PREFIX,
        max_document_length=48,
        max_query_length=16,
        mode="qnorm",
        device="cpu",
    )
    out = tmp_path_factory.mktemp("export") / "qnorm"
    export_model(enc, out)
    return out


def fastembed_folder(export_dir, dest):
    """The recipe: the document graph, the tokenizer, and a tokenizer_config fastembed reads."""
    manifest = Manifest.load(export_dir)
    graph = manifest.graphs["document"]
    dest.mkdir()
    shutil.copy(export_dir / graph.file, dest / "document.onnx")
    shutil.copy(export_dir / manifest.tokenizer, dest / "tokenizer.json")
    pad = Tokenizer.from_file(str(dest / "tokenizer.json")).id_to_token(manifest.pad_token_id)
    (dest / "tokenizer_config.json").write_text(
        json.dumps({"model_max_length": manifest.max_document_length, "pad_token": pad})
    )
    return manifest, graph


def test_fastembed_custom_model_gives_onnxencoder_document_vectors(export_dir, tmp_path):
    manifest, graph = fastembed_folder(export_dir, tmp_path / "fe")
    assert manifest.document_prefix == PREFIX
    name = "local/magretrieve-tiny-qnorm-document"
    TextEmbedding.add_custom_model(
        model=name,
        pooling=PoolingType.DISABLED,  # pooling and partial normalization are in the graph
        normalization=False,  # unit-normalizing would drop the magnitude
        sources=ModelSource(hf=name),  # never fetched: local_files_only below
        dim=manifest.dimension,
        model_file="document.onnx",
        output_name=graph.output,
    )
    model = TextEmbedding(
        name,
        specific_model_path=str(tmp_path / "fe"),
        local_files_only=True,
        cache_dir=str(tmp_path / "cache"),
        threads=1,
    )
    got = np.stack(list(model.embed([manifest.document_prefix + t for t in TEXTS], batch_size=2)))
    want = OnnxEncoder.load(export_dir, threads=1).encode_documents(TEXTS)
    assert got.shape == want.shape == (len(TEXTS), manifest.dimension)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    norms = np.linalg.norm(got, axis=1)
    assert not np.allclose(norms, 1.0, atol=1e-3)  # magnitude kept, not unit vectors
    # what fastembed leaves out: without the prefix the vectors are not the export's
    bare = np.stack(list(model.embed(TEXTS)))
    assert np.abs(bare - want).max() > 1e-3
