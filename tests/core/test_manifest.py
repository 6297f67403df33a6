"""The export manifest: validation, hash verification and round trip (torch-free, no export needed)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from magretrieve.core.errors import ManifestError
from magretrieve.core.manifest import (
    MANIFEST_NAME,
    Manifest,
    hash_folder,
    model_fingerprint,
    seal,
    sha256_file,
)
from tests.support.manifests import FILES, manifest_graph, write_manifest_folder


def test_valid_manifest_loads_with_contract_attributes(tmp_path: Path) -> None:
    write_manifest_folder(tmp_path)
    m = Manifest.load(tmp_path)
    assert (m.mode, m.gamma_q, m.gamma_d) == ("qnorm", 1.0, 0.0)
    assert m.query_contract == "unit_norm" and m.document_contract == "magnitude_keeping"
    assert m.index_metric == "inner_product" and m.dimension == 384
    assert m.model_fingerprint == model_fingerprint(
        json.loads((tmp_path / MANIFEST_NAME).read_text())
    )
    assert m.similarity.mode == "qnorm" and not m.similarity.is_symmetric
    assert m.query_prefix == "query: " and m.folder == tmp_path
    assert m.path("document") == tmp_path / "document.onnx"


def test_to_dict_round_trips(tmp_path: Path) -> None:
    write_manifest_folder(tmp_path)
    m = Manifest.load(tmp_path)
    again = Manifest.from_dict(json.loads(json.dumps(m.to_dict())))
    assert again.to_dict() == m.to_dict()


def test_learnable_gammas_set_contracts(tmp_path: Path) -> None:
    write_manifest_folder(
        tmp_path,
        mode="learnable",
        gamma_q=0.3,
        gamma_d=0.8,
        graphs={
            "query": manifest_graph("query.onnx", 0.3, "magnitude_keeping"),
            "document": manifest_graph("document.onnx", 0.8, "magnitude_keeping"),
        },
    )
    sim = Manifest.load(tmp_path).similarity
    assert (sim.mode, sim.gamma_q, sim.gamma_d) == ("learnable", 0.3, 0.8)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"format_version": 3}, "unknown format_version 3"),
        ({"format": "something-else"}, "not a magretrieve export manifest"),
        ({"mode": "euclid"}, "unknown mode"),
        ({"mode": "learnable", "gamma_q": 1.5}, "gamma_q must lie in [0, 1]"),
        ({"gamma_d": 1.0}, "fixes gamma_d"),
        ({"index_metric": "l2"}, "index_metric 'l2'"),
        (
            {
                "graphs": {
                    "query": manifest_graph("query.onnx", 1.0, "unit_norm"),
                    "document": manifest_graph("document.onnx", 0.0, "unit_norm"),
                }
            },
            "graphs.document.contract='unit_norm'",
        ),
        ({"files": {}}, "'files' must map"),
        ({"runtimes": []}, "runtimes must be a non-empty list"),
        ({"runtimes": "openvino"}, "runtimes must be a non-empty list"),
        ({"runtimes": ["openvino", 3]}, "runtimes must be a non-empty list"),
    ],
)
def test_invalid_manifest_refused(tmp_path: Path, overrides: dict, message: str) -> None:
    write_manifest_folder(tmp_path, **overrides)
    with pytest.raises(ManifestError, match="magretrieve.json") as info:
        Manifest.load(tmp_path)
    assert message in str(info.value)


def test_missing_field_named(tmp_path: Path) -> None:
    data = write_manifest_folder(tmp_path)
    del data["dimension"]
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(seal(data)))
    with pytest.raises(ManifestError, match="missing field 'dimension'"):
        Manifest.load(tmp_path)


def test_tampered_file_refused_naming_it(tmp_path: Path) -> None:
    write_manifest_folder(tmp_path)
    (tmp_path / "document.onnx").write_bytes(b"doc graph!")
    with pytest.raises(ManifestError, match=r"document\.onnx: sha256 does not match"):
        Manifest.load(tmp_path)
    # verify=False skips hashing (used only for reading a report right after writing it)
    assert Manifest.load(tmp_path, verify=False).mode == "qnorm"


def test_missing_file_refused(tmp_path: Path) -> None:
    write_manifest_folder(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(ManifestError, match=r"tokenizer\.json: listed in .* but missing"):
        Manifest.load(tmp_path)


def test_graph_without_hash_refused(tmp_path: Path) -> None:
    data = write_manifest_folder(tmp_path)
    del data["files"]["query.onnx"]
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(seal(data)))
    with pytest.raises(ManifestError, match="no sha256 recorded for query.onnx"):
        Manifest.load(tmp_path)


def test_no_manifest_or_bad_json(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no manifest"):
        Manifest.load(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        Manifest.load(tmp_path)


def test_hash_helpers(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"abc")
    (tmp_path / MANIFEST_NAME).write_text("{}")
    (tmp_path / "sub").mkdir()
    assert sha256_file(tmp_path / "a.bin") == hashlib.sha256(b"abc").hexdigest()
    assert hash_folder(tmp_path) == {"a.bin": hashlib.sha256(b"abc").hexdigest()}


# ----------------------------------------------------------------------------- the seal


def test_a_hand_edited_field_is_refused_by_the_checksum(tmp_path: Path) -> None:
    data = write_manifest_folder(tmp_path)
    data["dimension"] = 16  # edited, manifest_sha256 left as it was
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="does not match its manifest_sha256"):
        Manifest.load(tmp_path)


def test_a_manifest_without_checksum_is_refused(tmp_path: Path) -> None:
    write_manifest_folder(tmp_path, sealed=False)
    with pytest.raises(ManifestError, match="no manifest_sha256"):
        Manifest.load(tmp_path)


def test_fingerprint_must_match_content(tmp_path: Path) -> None:
    data = write_manifest_folder(tmp_path)
    data["model_fingerprint"] = "0" * 64
    from magretrieve.core.manifest import CHECKSUM_KEY, content_checksum

    data[CHECKSUM_KEY] = content_checksum(data)  # checksum updated, fingerprint not
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="model_fingerprint does not match"):
        Manifest.load(tmp_path)


@pytest.mark.parametrize(
    ("path", "value", "changes"),
    [
        (("files", "tokenizer.json"), "1" * 64, True),  # a swapped tokenizer
        (("query_prefix",), "search_query: ", True),  # another prompt
        (("document_prefix",), "passage: ", True),
        (("max_document_length",), 128, True),
        (("pad_token_id",), 1, True),
        (("files", "document.onnx"), "2" * 64, True),
        (("parity", "max_abs_diff"), 3e-7, False),  # how it was checked, not what it is
        (("versions", "torch"), "9.9", False),
        (("exporter", "opset"), 17, False),
    ],
)
def test_fingerprint_covers_everything_that_changes_a_vector(path, value, changes) -> None:
    data = write_manifest_folder(Path(__import__("tempfile").mkdtemp()))
    before = model_fingerprint(data)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert (model_fingerprint(data) != before) is changes


def test_runtimes_field_and_its_legacy_default(tmp_path: Path) -> None:
    """Which runtimes run an export: as written, or (older manifests) by quantization."""
    write_manifest_folder(tmp_path / "fp32")
    assert Manifest.load(tmp_path / "fp32").runtimes is None  # any runtime that reads ONNX
    write_manifest_folder(
        tmp_path / "legacy-int8", quantization="int8"
    )  # written before the field existed
    assert Manifest.load(tmp_path / "legacy-int8").runtimes == ["onnxruntime"]
    write_manifest_folder(tmp_path / "static", quantization="int8-static", runtimes=["openvino"])
    manifest = Manifest.load(tmp_path / "static")
    assert manifest.runtimes == ["openvino"]
    assert manifest.to_dict()["runtimes"] == ["openvino"]
    assert "runtimes" not in Manifest.load(tmp_path / "fp32").to_dict()
    # how an export may run is not what its vectors are: the fingerprint ignores it
    data = write_manifest_folder(tmp_path / "x")
    before = model_fingerprint(data)
    data["runtimes"] = ["openvino"]
    assert model_fingerprint(data) == before


def test_a_manifest_written_before_the_typed_config_loads_and_saves_byte_identical(
    tmp_path: Path,
) -> None:
    """tests/core/fixtures/manifest_v2.json was written by the Manifest that re-declared the
    encoder's fields (learnable γ, a linear norm head trained on a frozen encoder, int8)."""
    from magretrieve.core.config import EncoderConfig

    golden = (Path(__file__).parent / "fixtures" / "manifest_v2.json").read_text()
    for name, data in FILES.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / MANIFEST_NAME).write_text(golden)
    m = Manifest.load(tmp_path)
    assert isinstance(m.encoder, EncoderConfig)
    assert (m.mode, m.gamma_q, m.gamma_d, m.base_model) == ("learnable", 0.25, 0.75, "tiny")
    assert (m.max_query_length, m.max_document_length, m.query_prefix) == (64, 256, "query: ")
    head = m.encoder.head
    assert (head.kind, head.hidden, head.bound, head.frozen_encoder) == ("linear", 64, 2.0, True)
    assert m.encoder.extra == {}  # the flag is the head's, typed, not a loose extra key
    assert m.graphs["document"].head["kind"] == "linear"
    out = tmp_path / "again"
    out.mkdir()
    m.save(out)
    assert (out / MANIFEST_NAME).read_text() == golden  # same keys, order, seal and fingerprint


def test_the_encoder_settings_have_one_owner(tmp_path: Path) -> None:
    write_manifest_folder(tmp_path)
    m = Manifest.load(tmp_path)
    assert m.encoder_config() is m.encoder
    with pytest.raises(AttributeError):
        m.mode = "cosine"  # a view of m.encoder, not a second copy
    assert json.loads((tmp_path / MANIFEST_NAME).read_text())["encoder"] == m.to_dict()["encoder"]
