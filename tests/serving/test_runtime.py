"""OnnxEncoder: export → load → encode equals the PyTorch encoder, without torch at serving time."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from magretrieve.core.errors import ConfigError, ManifestError

TEXTS = [
    "what does statin cause",
    "a",
    "Brain protein levels in mice lacking the gene: a study of 20 patients " * 8,  # truncated
    "Wing flow, boundary layer & pressure?",
    "lung",
    "vitamin dose and cancer cell risk in human trial data",
    "ÜNÏCÖDÉ heart",
]


@pytest.fixture(scope="module")
def exported(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """A qnorm export with prefixes and short max lengths, plus its PyTorch encoder."""
    from magretrieve.export import export_model
    from magretrieve.train.encoder import Encoder

    encoder = Encoder.load(
        tiny_model_dir,
        mode="qnorm",
        query_prefix="query: ",
        document_prefix="passage: ",
        max_query_length=12,
        max_document_length=40,
        device="cpu",
    )
    out = export_model(encoder, tmp_path_factory.mktemp("rt") / "export", exporter="torchscript")
    return out, encoder


def test_round_trip_equals_pytorch(exported) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    folder, encoder = exported
    onnx = OnnxEncoder.load(folder)
    assert onnx.dim == encoder.dim == 32
    assert onnx.manifest.query_prefix == "query: " and onnx.manifest.max_document_length == 40
    np.testing.assert_allclose(onnx.encode_queries(TEXTS), encoder.encode_queries(TEXTS), atol=1e-5)
    np.testing.assert_allclose(
        onnx.encode_documents(TEXTS), encoder.encode_documents(TEXTS), atol=1e-5
    )


def test_prefix_and_truncation_come_from_the_manifest(exported) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    folder, encoder = exported
    onnx = OnnxEncoder.load(folder)
    q = onnx.tokenize(["lung"], "query")[0]
    ref = encoder.tokenizer("query: lung")["input_ids"]
    assert q.ids == ref
    long_doc = onnx.tokenize([TEXTS[2]], "document")[0]
    assert len(long_doc.ids) == 40  # max_document_length, with [CLS] ... [SEP]
    # The query side of a qnorm export is unit-norm, the document side keeps its magnitude.
    np.testing.assert_allclose(np.linalg.norm(onnx.encode_queries(TEXTS), axis=1), 1.0, atol=1e-5)
    raw = encoder.embed(TEXTS, "document")
    np.testing.assert_allclose(
        np.linalg.norm(onnx.encode_documents(TEXTS), axis=1),
        np.linalg.norm(raw, axis=1),
        rtol=1e-5,
    )


def test_batching_does_not_change_vectors_or_order(exported) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    onnx = OnnxEncoder.load(exported[0])
    one = onnx.encode_documents(TEXTS, batch_size=1)
    three = onnx.encode_documents(TEXTS, batch_size=3)
    reversed_ = onnx.encode_documents(TEXTS[::-1], batch_size=4)[::-1]
    np.testing.assert_allclose(one, three, atol=1e-5)
    np.testing.assert_allclose(one, reversed_, atol=1e-5)
    assert onnx.encode_queries([]).shape == (0, 32)
    assert onnx.encode_queries([]).dtype == np.float32


def test_bad_arguments(exported) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    onnx = OnnxEncoder.load(exported[0])
    with pytest.raises(ConfigError, match="list of texts"):
        onnx.encode_queries("one string")
    with pytest.raises(ConfigError, match="batch_size"):
        onnx.encode_queries(["x"], batch_size=0)
    with pytest.raises(ConfigError, match="threads"):
        OnnxEncoder.load(exported[0], threads=0)


def test_threads_and_lazy_sessions(exported) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    onnx = OnnxEncoder.load(exported[0], threads=1)
    onnx.encode_queries(["lung"])
    assert set(onnx._sessions) == {"query"}  # the document graph is never loaded for queries
    assert onnx.session("query").get_session_options().intra_op_num_threads == 1


def test_a_graph_that_fails_its_probe_is_refused_on_every_call(exported) -> None:
    """A session is kept only after its probe passed: the second call must not get it."""
    from dataclasses import replace

    from magretrieve.core.manifest import Manifest
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    manifest = replace(Manifest.load(exported[0]), dimension=31)  # the graph gives 32
    onnx = OnnxEncoder(manifest, threads=1)
    for _ in range(2):
        with pytest.raises(ManifestError, match=r"query\.onnx: the graph gives vectors of shape"):
            onnx.session("query")
    assert onnx._sessions == {}


def test_tampered_graph_refused(exported, tmp_path: Path) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    copy = shutil.copytree(exported[0], tmp_path / "copy")
    data = bytearray((copy / "query.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / "query.onnx").write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=r"query\.onnx: sha256 does not match"):
        OnnxEncoder.load(copy)


def test_unknown_version_refused(exported, tmp_path: Path) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    copy = shutil.copytree(exported[0], tmp_path / "copy")
    manifest = json.loads((copy / "magretrieve.json").read_text())
    manifest["format_version"] = 99
    (copy / "magretrieve.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match="unknown format_version 99"):
        OnnxEncoder.load(copy)


TORCH_FREE = """
import json, sys
sys.modules["torch"] = None          # any `import torch` now raises ImportError
sys.modules["transformers"] = None
import magretrieve
from magretrieve import OnnxEncoder
enc = OnnxEncoder.load(sys.argv[1], threads=1)
texts = json.loads(sys.argv[2])
out = {"q": enc.encode_queries(texts).tolist(), "d": enc.encode_documents(texts).tolist(),
       "sim": enc.similarity.mode}
print(json.dumps(out))
"""


def test_serving_imports_neither_torch_nor_transformers(exported) -> None:
    """A subprocess where torch/transformers cannot be imported encodes the same vectors."""
    folder, encoder = exported
    proc = subprocess.run(
        [sys.executable, "-c", TORCH_FREE, str(folder), json.dumps(TEXTS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["sim"] == "qnorm"
    np.testing.assert_allclose(np.array(out["q"]), encoder.encode_queries(TEXTS), atol=1e-5)
    np.testing.assert_allclose(np.array(out["d"]), encoder.encode_documents(TEXTS), atol=1e-5)
