"""OpenVINO as the runtime of an export (``runtime="openvino"`` / ``"openvino-bf16"``).

The same export folder must give the same vectors on OpenVINO as on onnxruntime (fp32), from
one thread or many, through ``OnnxEncoder``, ``Retriever`` and ``magretrieve index``; bf16 must
stay close to fp32 where the CPU has it and be refused in one line where it has not; int8
exports, CUDA and a missing OpenVINO are refused before any work.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from magretrieve.cli import main
from magretrieve.core.errors import ConfigError
from magretrieve.serving.openvino_session import bf16_native
from tests.support.tiny_models import RUNTIME_TEXTS as TEXTS


@pytest.fixture(scope="module")
def exports(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from magretrieve.export import export_model

    root = tmp_path_factory.mktemp("ov")
    return {
        "fp32": export_model(tiny_model_dir, root / "fp32", mode="qnorm"),
        "int8": export_model(tiny_model_dir, root / "int8", mode="qnorm", quantize="int8"),
    }


def test_fp32_vectors_equal_onnxruntime(exports) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    ort_enc = OnnxEncoder.load(exports["fp32"], threads=1)
    ov_enc = OnnxEncoder.load(exports["fp32"], threads=1, runtime="openvino")
    assert "runtime=openvino" in repr(ov_enc)
    for encode in ("encode_queries", "encode_documents"):
        ref = getattr(ort_enc, encode)(TEXTS)
        got = getattr(ov_enc, encode)(TEXTS, batch_size=2)
        np.testing.assert_allclose(got, ref, atol=1e-5)
    # the fused graph really is the one that ran (onnxruntime's operators read by OpenVINO)
    assert "Attention" in ort_enc.manifest.exporter["optimizer"]["fused_operators"]


def test_concurrent_calls_match_serial(exports) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    enc = OnnxEncoder.load(exports["fp32"], threads=1, runtime="openvino")
    serial = [enc.encode_documents([t]) for t in TEXTS * 4]
    with ThreadPoolExecutor(4) as pool:
        parallel = list(pool.map(lambda t: enc.encode_documents([t]), TEXTS * 4))
    for a, b in zip(serial, parallel, strict=True):
        np.testing.assert_array_equal(a, b)


def test_probe_runs_on_openvino_sessions_too(exports) -> None:
    from dataclasses import replace

    from magretrieve.core.errors import ManifestError
    from magretrieve.core.manifest import Manifest
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    manifest = replace(Manifest.load(exports["fp32"]), dimension=31)
    enc = OnnxEncoder(manifest, threads=1, runtime="openvino")
    for _ in range(2):
        with pytest.raises(ManifestError, match=r"document\.onnx: the graph gives vectors"):
            enc.encode_documents(TEXTS)


def test_bf16_close_to_fp32_or_refused(exports) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    ref = OnnxEncoder.load(exports["fp32"], threads=1).encode_documents(TEXTS)
    enc = OnnxEncoder.load(exports["fp32"], threads=1, runtime="openvino-bf16")
    if not bf16_native():
        with pytest.raises(ConfigError, match="no native bf16"):
            enc.encode_documents(TEXTS)
        return
    got = enc.encode_documents(TEXTS)
    assert not np.array_equal(got, ref)  # bf16 did run: it rounds
    cos = np.sum(got * ref, 1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() > 0.999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(ref, axis=1), rtol=0.02)


def test_bf16_refused_without_native_support(exports, monkeypatch) -> None:
    import openvino

    from magretrieve.serving.onnx_encoder import OnnxEncoder

    real = openvino.Core.get_property

    def no_bf16(self, device, name):  # a CPU without AVX512-BF16/AMX
        if name == "OPTIMIZATION_CAPABILITIES":
            return ["FP32", "INT8"]
        return real(self, device, name)

    monkeypatch.setattr(openvino.Core, "get_property", no_bf16)
    enc = OnnxEncoder.load(exports["fp32"], runtime="openvino-bf16")
    with pytest.raises(ConfigError, match=r"^precision bf16: this CPU has no native bf16"):
        enc.encode_queries(["q"])


def test_refusals(exports, monkeypatch) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    with pytest.raises(ConfigError, match="unknown runtime 'tensorrt'; choose one of onnxruntime"):
        OnnxEncoder.load(exports["fp32"], runtime="tensorrt")
    with pytest.raises(ConfigError, match="runs on the CPU; use --device cpu"):
        OnnxEncoder.load(exports["fp32"], runtime="openvino", device="cuda")
    # onnxruntime's dynamic int8 operators run 1.9x slower on OpenVINO: the export says so
    with pytest.raises(
        ConfigError,
        match=r"^runtime 'openvino' cannot run .*int8 export whose "
        r"graphs run on 'onnxruntime'$",
    ):
        OnnxEncoder.load(exports["int8"], runtime="openvino")
    assert OnnxEncoder.load(exports["int8"]).runtime == "onnxruntime"
    monkeypatch.setitem(sys.modules, "openvino", None)  # not installed
    enc = OnnxEncoder.load(exports["fp32"], runtime="openvino")
    with pytest.raises(ConfigError, match=r"pip install 'magretrieve\[openvino\]'"):
        enc.encode_queries(["q"])


def test_cli_index_with_openvino_equals_onnxruntime(exports, tmp_path: Path) -> None:
    from magretrieve.stores import open_store

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS))
    )
    vectors = {}
    for runtime in ("onnxruntime", "openvino"):
        spec = f"faiss:{tmp_path / runtime}"
        args = ["index", str(exports["fp32"]), str(corpus), "--store", spec, "--no-progress"]
        result = CliRunner().invoke(main, [*args, "--runtime", runtime])
        assert result.exit_code == 0, result.output
        assert f"{len(TEXTS)} added" in result.output
        with open_store(spec) as store:
            ids = [f"d{i}" for i in range(len(TEXTS))]
            vectors[runtime] = np.asarray(store.get_vectors(ids))
    np.testing.assert_allclose(vectors["openvino"], vectors["onnxruntime"], atol=1e-5)
    args = ["index", str(exports["fp32"]), str(corpus), "--store", f"faiss:{tmp_path / 'r'}"]
    bad = CliRunner().invoke(main, [*args, "--runtime", "openvino", "--engine", "ray"])
    assert bad.exit_code == 1
    assert "--runtime applies to --engine local" in bad.output
    assert not (tmp_path / "r").exists()  # refused before any store was created


def test_query_session_warms_every_query_length_once(exports, monkeypatch) -> None:
    """OpenVINO prepares kernels per shape on first sight; the query session pays that at open."""
    from magretrieve.serving.onnx_encoder import WARM_QUERY_TOKENS, OnnxEncoder
    from magretrieve.serving.openvino_session import OpenVinoSession

    seen: list[tuple[int, ...]] = []
    real = OpenVinoSession.run

    def spy(self, names, feed):
        seen.append(tuple(feed["input_ids"].shape))
        return real(self, names, feed)

    monkeypatch.setattr(OpenVinoSession, "run", spy)
    enc = OnnxEncoder.load(exports["fp32"], threads=1, runtime="openvino")
    enc.session("query")
    longest = min(enc.manifest.max_query_length, WARM_QUERY_TOKENS)
    probe = (1, enc.manifest.max_query_length)
    assert seen == [probe, *[(1, n) for n in range(1, longest + 1)]]
    seen.clear()
    enc.session("document")  # documents: the probe only
    assert seen == [(1, enc.manifest.max_document_length)]
    seen.clear()
    enc.encode_queries(["q"])  # opened once: no second warm-up
    assert len(seen) == 1
