"""Static int8 exports for OpenVINO (``magretrieve export --quantize int8-static``).

NNCF calibrates activation ranges on texts of a BEIR folder and writes OpenVINO IR. What must
hold: the export says in its manifest that only OpenVINO runs it (and OnnxEncoder picks that by
default, refusing onnxruntime in one line); its vectors agree with fp32; a text's vector does not
depend on its batch-mates (the scales are fixed); the same inputs give the same export; bad
calibration options are refused before any work; and ``magretrieve index`` serves it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from magretrieve.cli import main
from magretrieve.core.errors import ConfigError, DataError
from tests.support.tiny_models import RUNTIME_TEXTS as TEXTS

#: Slow lane: NNCF calibrates every export these tests build.
pytestmark = pytest.mark.slow


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def exports(
    tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("static")
    fp32 = root / "fp32"
    static = root / "static"
    for dest, extra in ((fp32, []), (static, ["--quantize", "int8-static"])):
        args = ["export", str(tiny_model_dir), str(dest), "--mode", "qnorm", *extra]
        if extra:
            args += ["--calibration-data", str(tiny_beir_dir), "--eval-data", f"{tiny_beir_dir}"]
            args += ["--json"]
        result = CliRunner().invoke(main, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
    return {"fp32": fp32, "static": static, "output": result.output}


def test_manifest_names_openvino_and_the_calibration(exports, tiny_beir_dir: Path) -> None:
    from magretrieve.core.manifest import Manifest

    folder = exports["static"]
    files = sorted(p.name for p in folder.iterdir())
    assert {"query.xml", "query.bin", "document.xml", "document.bin"} <= set(files)
    assert not [f for f in files if f.endswith(".onnx")]  # only the IR ships
    manifest = Manifest.load(folder)  # every file, the .bin weights included, is hashed
    assert {"query.bin", "document.bin"} <= set(manifest.files)
    assert manifest.quantization == "int8-static"
    assert manifest.runtimes == ["openvino", "openvino-bf16"]
    assert manifest.graphs["document"].file == "document.xml"
    quantizer = manifest.exporter["quantizer"]
    assert quantizer["calibration_data"] == tiny_beir_dir.name  # its name, never a path
    assert quantizer["document"]["method"] == "nncf.quantize"
    assert quantizer["document"]["calibration_texts"] == 12  # the tiny corpus has 12 documents
    assert manifest.exporter["optimizer"]["applied"]  # quantized from the fused fp32 graph
    ev = manifest.quantization_report["eval"]
    assert ev["ndcg@10_delta"] == pytest.approx(ev["int8"]["ndcg@10"] - ev["fp32"]["ndcg@10"])
    # the printed report names the scheme and the runtime, and --json stays parseable
    out = exports["output"]
    assert "runs on: openvino, openvino-bf16" in out
    assert "int8-static document vs fp32" in out
    data = json.loads(out[out.index("{\n") :])
    assert data["runtimes"] == ["openvino", "openvino-bf16"]
    # the fp32 export does not name runtimes: any runtime that reads ONNX runs it
    assert "runtimes" not in json.loads((exports["fp32"] / "magretrieve.json").read_text())


def test_vectors_agree_with_fp32_and_keep_the_contract(exports) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    static = OnnxEncoder.load(exports["static"])
    assert static.runtime == "openvino"  # the export's own runtime by default
    fp32 = OnnxEncoder.load(exports["fp32"])
    for side in ("query", "document"):
        encode = "encode_queries" if side == "query" else "encode_documents"
        a = getattr(static, encode)(TEXTS)
        b = getattr(fp32, encode)(TEXTS)
        assert a.shape == b.shape == (len(TEXTS), fp32.dim)
        assert _cosines(a, b).min() > 0.99
        assert not np.array_equal(a, b)  # it is not the fp32 graph under another name
    q = static.encode_queries(TEXTS)
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)  # qnorm: q̂
    d = static.encode_documents(TEXTS)
    ratio = np.linalg.norm(d, axis=1) / np.linalg.norm(fp32.encode_documents(TEXTS), axis=1)
    np.testing.assert_allclose(ratio, 1.0, atol=0.02)  # document magnitude survives int8


def test_a_vector_does_not_depend_on_its_batch_mates(exports) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    enc = OnnxEncoder.load(exports["static"], threads=1)
    together = enc.encode_documents(TEXTS)
    alone = np.stack([enc.encode_documents([t])[0] for t in TEXTS])
    # fixed activation scales: padding to a batch-mate's length changes nothing
    np.testing.assert_allclose(alone, together, atol=1e-5)


def test_other_runtimes_refused_in_one_line(exports) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    with pytest.raises(
        ConfigError,
        match=r"^runtime 'onnxruntime' cannot run .*: it is a int8-static export whose graphs "
        r"run on 'openvino' or 'openvino-bf16'$",
    ):
        OnnxEncoder.load(exports["static"], runtime="onnxruntime")
    with pytest.raises(ConfigError, match="runs on the CPU"):
        OnnxEncoder.load(exports["static"], device="cuda")


def test_same_inputs_give_the_same_vectors(
    exports, tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path
) -> None:
    from magretrieve.core.manifest import Manifest
    from magretrieve.export import export_model
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    again = export_model(
        tiny_model_dir,
        tmp_path / "again",
        mode="qnorm",
        quantize="int8-static",
        calibration_data=tiny_beir_dir,
    )
    first, second = Manifest.load(exports["static"]), Manifest.load(again)
    # the weights and scales are the same bytes; the .xml differs only in the node names
    # OpenVINO numbers from a process-wide counter
    for name in ("query.bin", "document.bin"):
        assert first.files[name] == second.files[name], name
    a, b = OnnxEncoder.load(exports["static"]), OnnxEncoder.load(again)
    np.testing.assert_array_equal(a.encode_documents(TEXTS), b.encode_documents(TEXTS))
    np.testing.assert_array_equal(a.encode_queries(TEXTS), b.encode_queries(TEXTS))


def test_bad_calibration_refused_before_any_work(
    tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    from magretrieve.export import export_model

    dest = tmp_path / "x"
    with pytest.raises(ConfigError, match="needs --calibration-data DIR"):
        export_model(tiny_model_dir, dest, quantize="int8-static")
    with pytest.raises(ConfigError, match="use them with --quantize int8-static"):
        export_model(tiny_model_dir, dest, quantize="int8", calibration_data=tiny_beir_dir)
    with pytest.raises(ConfigError, match="use them with --quantize int8-static"):
        export_model(tiny_model_dir, dest, calibration_size=10)
    with pytest.raises(ConfigError, match="--calibration-size must be at least 1, got 0"):
        export_model(
            tiny_model_dir,
            dest,
            quantize="int8-static",
            calibration_data=tiny_beir_dir,
            calibration_size=0,
        )
    with pytest.raises(DataError, match=r"nowhere: not a folder"):
        export_model(
            tiny_model_dir, dest, quantize="int8-static", calibration_data=tmp_path / "nowhere"
        )
    half = tmp_path / "half"
    half.mkdir()
    (half / "corpus.jsonl").write_text('{"_id": "d1", "text": "a document"}\n')
    with pytest.raises(DataError, match=r"half/queries.jsonl: missing"):
        export_model(tiny_model_dir, dest, quantize="int8-static", calibration_data=half)
    (half / "queries.jsonl").write_text('{"_id": "q1", "text": "a query"}\n{"_id": "q2"}\n')
    with pytest.raises(DataError, match=r"queries.jsonl:2: missing field 'text'"):
        export_model(tiny_model_dir, dest, quantize="int8-static", calibration_data=half)
    monkeypatch.setitem(sys.modules, "nncf", None)  # the extra is not installed
    with pytest.raises(ConfigError, match=r"pip install 'magretrieve\[openvino-int8\]'"):
        export_model(tiny_model_dir, dest, quantize="int8-static", calibration_data=tiny_beir_dir)
    assert not dest.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["half"]  # no staging left either


def test_cli_refusal_is_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["export", str(tiny_model_dir), str(tmp_path / "x"), "--quantize", "int8-static"]
    )
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [
        "Error: --quantize int8-static needs --calibration-data DIR: a BEIR folder whose "
        "documents and queries look like what will be served"
    ]


def test_cli_index_serves_it_and_refuses_onnxruntime(exports, tmp_path: Path) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder
    from magretrieve.stores import open_store

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS))
    )
    spec = f"faiss:{tmp_path / 'store'}"
    args = ["index", str(exports["static"]), str(corpus), "--store", spec, "--no-progress"]
    bad = CliRunner().invoke(main, [*args, "--runtime", "onnxruntime"])
    assert bad.exit_code == 1
    assert "cannot run" in bad.output and "int8-static export" in bad.output
    assert not (tmp_path / "store").exists()  # refused before a store was created
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    with open_store(spec) as store:
        stored = np.asarray(store.get_vectors([f"d{i}" for i in range(len(TEXTS))]))
    expected = OnnxEncoder.load(exports["static"]).encode_documents(TEXTS)
    np.testing.assert_allclose(stored, expected, atol=1e-6)


def test_a_quantizer_failure_is_one_line_and_writes_nothing(
    tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    import nncf

    def broken(*args, **kwargs):
        raise RuntimeError("Unsupported operation: SomeOp\nlong internal trace")

    monkeypatch.setattr(nncf, "quantize", broken)
    dest = tmp_path / "x"
    args = ["export", str(tiny_model_dir), str(dest), "--quantize", "int8-static"]
    result = CliRunner().invoke(main, [*args, "--calibration-data", str(tiny_beir_dir)])
    assert result.exit_code == 1
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert error == [
        "Error: query.onnx: static int8 failed (RuntimeError: Unsupported operation: SomeOp); "
        "export without --quantize, or with --quantize int8"
    ]
    assert "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []  # no target, no staging folder left behind
