"""Property tests (hypothesis): the similarity family's algebra on random vectors, and the
loaders' promise that bad bytes only ever produce a MagRetrieveError."""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from magretrieve.core import similarity as sim
from magretrieve.core.errors import MagRetrieveError
from magretrieve.data import readers as data

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ELEMENTS = st.floats(-10, 10, allow_nan=False, allow_infinity=False, width=32)
DIM = 6


def matrices(min_rows: int = 1, max_rows: int = 8) -> st.SearchStrategy[np.ndarray]:
    """Random float32 matrices whose rows are not (near) zero."""
    return st.integers(min_rows, max_rows).flatmap(
        lambda n: arrays(np.float32, (n, DIM), elements=ELEMENTS).filter(
            lambda m: bool((np.linalg.norm(m, axis=1) > 1e-2).all())
        )
    )


gammas = st.floats(0, 1, allow_nan=False)
modes = st.sampled_from(sim.MODES)


def resolved(mode: str, gq: float, gd: float) -> sim.Similarity:
    return sim.resolve(mode, gq, gd) if mode == "learnable" else sim.resolve(mode)


def same_order(a: np.ndarray, b: np.ndarray, tol: float = 1e-4) -> None:
    """Every pair of entries that ``a`` separates clearly is ordered the same way by ``b``."""
    da = a[:, None] - a[None, :]
    db = b[:, None] - b[None, :]
    scale_a = tol * (np.abs(a).max() + 1e-6)
    clear = np.abs(da) > scale_a
    assert (np.sign(da[clear]) == np.sign(db[clear])).all(), (a, b)


# ----------------------------------------------------------------------------- similarity


@SETTINGS
@given(q=matrices(1, 3), d=matrices(2, 10))
def test_ranking_equivalences(q: np.ndarray, d: np.ndarray) -> None:
    s = {m: sim.score_matrix(q, d, sim.resolve(m)) for m in sim.FIXED_GAMMAS}
    qn = np.linalg.norm(q.astype(np.float64), axis=1, keepdims=True)
    # dnorm = ‖q‖·cosine and dot = ‖q‖·qnorm: a positive per-query factor, so same ranking
    np.testing.assert_allclose(s["dnorm"], qn * s["cosine"], rtol=1e-4, atol=1e-4 * qn.max())
    np.testing.assert_allclose(s["dot"], qn * s["qnorm"], rtol=1e-4, atol=1e-3 * qn.max())
    for i in range(len(q)):
        same_order(s["cosine"][i], s["dnorm"][i])
        same_order(s["qnorm"][i], s["dot"][i])


@SETTINGS
@given(q=matrices(1, 3), d=matrices(2, 10), gq1=gammas, gq2=gammas, gd=gammas)
def test_only_gamma_d_changes_the_ranking(
    q: np.ndarray, d: np.ndarray, gq1: float, gq2: float, gd: float
) -> None:
    a = sim.score_matrix(q, d, sim.resolve("learnable", gq1, gd))
    b = sim.score_matrix(q, d, sim.resolve("learnable", gq2, gd))
    for i in range(len(q)):
        same_order(a[i], b[i])


@SETTINGS
@given(a=matrices(), b=matrices(), g=gammas)
def test_symmetric_modes_are_symmetric(a: np.ndarray, b: np.ndarray, g: float) -> None:
    for s in (sim.resolve("cosine"), sim.resolve("dot"), sim.resolve("learnable", g, g)):
        assert s.is_symmetric
        ab = sim.score_matrix(a, b, s)
        ba = sim.score_matrix(b, a, s)
        np.testing.assert_allclose(ab, ba.T, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(ab).max()))


@SETTINGS
@given(
    q=matrices(1, 3),
    d=matrices(1, 5),
    mode=modes,
    gq=gammas,
    gd=gammas,
    c=st.floats(0.05, 20, allow_nan=False),
)
def test_scale_behaviour(
    q: np.ndarray, d: np.ndarray, mode: str, gq: float, gd: float, c: float
) -> None:
    s = resolved(mode, gq, gd)
    base = sim.score_matrix(q, d, s).astype(np.float64)
    tol = 1e-4 * (np.abs(base).max() + 1e-6)
    # scaling d by c multiplies every score by c^(1−γd)
    by_d = sim.score_matrix(q, (d * c).astype(np.float32), s)
    fd = c ** (1 - s.gamma_d)
    np.testing.assert_allclose(by_d, base * fd, rtol=1e-4, atol=tol * fd)
    # scaling q by c multiplies every score by c^(1−γq)
    by_q = sim.score_matrix((q * c).astype(np.float32), d, s)
    fq = c ** (1 - s.gamma_q)
    np.testing.assert_allclose(by_q, base * fq, rtol=1e-4, atol=tol * fq)


@SETTINGS
@given(x=matrices(), g=gammas)
def test_partial_normalize_norm_power(x: np.ndarray, g: float) -> None:
    norms = np.linalg.norm(x.astype(np.float64), axis=1)
    out = sim.partial_normalize(x, g)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), norms ** (1 - g), rtol=1e-4)


# ----------------------------------------------------------------------------- loaders

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([math.nan, math.inf, -math.inf, 10**400])
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
KEYS = st.sampled_from(
    [
        "_id",
        "text",
        "title",
        "query",
        "positive",
        "negatives",
        "sentence1",
        "sentence2",
        "score",
        "x",
    ]
)


SCORES = (
    st.sampled_from([0, 1, 2.5, -1, True, "3", None, math.nan, math.inf, -math.inf, 10**400])
    | st.floats()
    | JSON_VALUES
)


@st.composite
def json_lines(draw: st.DrawFn) -> bytes:
    """Mostly-plausible JSONL: objects with the loaders' keys and random values, mixed with junk."""
    lines = []
    # some files mix junk with objects; others hold only one plausible shape, so that a
    # loader gets past line 1 and its field checks are reached
    kinds = draw(st.sampled_from([(0, 1, 2, 3, 4), (2,), (3,)]))
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(kinds))
        if kind == 0:
            lines.append(draw(st.binary(max_size=30)))
        elif kind == 1:
            obj = draw(st.dictionaries(KEYS, JSON_VALUES, max_size=5))
            lines.append(json.dumps(obj).encode())
        elif kind == 2:
            obj = {"_id": draw(st.text(max_size=3)), "text": draw(st.text(max_size=5))}
            lines.append(json.dumps(obj, ensure_ascii=draw(st.booleans())).encode())
        elif kind == 3:
            # a nearly valid pair/STS object with its score and one other field randomised
            obj = {"sentence1": "a", "sentence2": "b", "query": "q", "positive": "p"}
            obj["score"] = draw(SCORES)
            if draw(st.booleans()):
                obj[draw(KEYS)] = draw(JSON_VALUES)
            lines.append(json.dumps(obj).encode())
        else:
            lines.append(json.dumps(draw(JSON_VALUES)).encode())
    sep = draw(st.sampled_from([b"\n", b"\r\n"]))
    body = sep.join(lines)
    if draw(st.booleans()) and body:
        body = body[: draw(st.integers(0, len(body)))]  # truncated file
    return body


QREL_TOKENS = st.sampled_from(
    ["q1", "d1", "1", "0", "2.5", "-1", "inf", "nan", "1e999", "", " ", '"', "x", "\x00", "é"]
)


@st.composite
def qrels_bytes(draw: st.DrawFn) -> bytes:
    rows = []
    if draw(st.booleans()):
        rows.append("query-id\tcorpus-id\tscore")
    for _ in range(draw(st.integers(0, 5))):
        rows.append("\t".join(draw(st.lists(QREL_TOKENS, max_size=4))))
    body = "\n".join(rows).encode()
    if draw(st.booleans()):
        body += draw(st.binary(max_size=20))
    return body


def check_result(result: Any) -> None:
    """What a loader accepts is well-formed: ids and texts are non-blank strings, scores finite."""
    items = result.values() if isinstance(result, dict) else result
    for item in items:
        if isinstance(item, data.Document):
            assert item.id.strip() and item.full_text.strip()
        elif isinstance(item, data.SentencePair):
            assert item.a.strip() and item.b.strip() and math.isfinite(item.score)
        elif isinstance(item, data.TrainingPair):
            assert item.query.strip() and item.positive.strip()
            assert all(isinstance(n, str) for n in item.negatives)
        elif isinstance(item, dict):  # qrels: {doc_id: int}
            assert all(isinstance(r, int) for r in item.values())
        elif isinstance(item, str):  # queries
            assert item.strip()


def assert_only_magretrieve_errors(
    loader: Callable[[Path], Any], content: bytes, name: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(content)
        try:
            result = loader(path)
            if isinstance(result, bool):
                return
            if not isinstance(result, (dict, list)):
                result = [obj for _, obj in result]  # read_jsonl is a generator of (line, obj)
                assert all(isinstance(obj, dict) for obj in result)
                return
            check_result(result)
        except MagRetrieveError as exc:
            assert str(exc)  # a message, never empty


JSONL_LOADERS = [
    data.read_jsonl,
    data.load_corpus,
    data.load_queries,
    data.load_pairs,
    data.load_sentence_pairs,
    data.is_sentence_pair_file,
]


@settings(max_examples=150, deadline=None)
@given(content=st.one_of(st.binary(max_size=200), json_lines()))
def test_jsonl_loaders_only_raise_magretrieve_errors(content: bytes) -> None:
    for loader in JSONL_LOADERS:
        assert_only_magretrieve_errors(loader, content, "file.jsonl")


@settings(max_examples=150, deadline=None)
@given(content=st.one_of(st.binary(max_size=200), qrels_bytes()))
def test_qrels_loader_only_raises_magretrieve_errors(content: bytes) -> None:
    assert_only_magretrieve_errors(data.load_qrels, content, "test.tsv")


@settings(max_examples=40, deadline=None)
@given(corpus=json_lines(), queries=json_lines(), qrels=qrels_bytes())
def test_load_beir_only_raises_magretrieve_errors(
    corpus: bytes, queries: bytes, qrels: bytes
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "corpus.jsonl").write_bytes(corpus)
        (folder / "queries.jsonl").write_bytes(queries)
        (folder / "qrels").mkdir()
        (folder / "qrels" / "test.tsv").write_bytes(qrels)
        try:
            ds = data.load_beir(f"{folder}:test")
            ds.training_pairs()
        except MagRetrieveError as exc:
            assert str(exc)


# ----------------------------------------------------------------------------- untrusted folders


def _mutate(obj: Any, path: tuple[str, ...], value: Any) -> Any:
    """``obj`` (a JSON dict) with the entry at ``path`` replaced by ``value`` (or deleted)."""
    obj = json.loads(json.dumps(obj))
    node = obj
    for key in path[:-1]:
        if not isinstance(node, dict) or key not in node:
            return obj
        node = node[key]
    if isinstance(node, dict):
        if value is _DELETE:
            node.pop(path[-1], None)
        else:
            node[path[-1]] = value
    return obj


_DELETE = object()
VALUES = JSON_VALUES | st.just(_DELETE) | st.sampled_from(["../x", "/etc/hostname", "", "a/b"])


def _manifest_folder(folder: Path) -> dict:
    from tests.support.manifests import write_manifest_folder

    return write_manifest_folder(folder)


MANIFEST_PATHS = st.sampled_from(
    [
        (k,)
        for k in (
            "format", "format_version", "encoder", "dimension", "index_metric", "graphs",
            "tokenizer", "model_fingerprint", "files", "pad_token_id", "exporter",
        )
    ]
    + [("encoder", k) for k in (
        "mode", "gamma_q", "gamma_d", "pooling", "max_query_length", "norm_scale")]
    + [("graphs", side, k) for side in ("query", "document")
       for k in ("file", "inputs", "output", "gamma", "contract", "head")]
    + [("graphs", "query"), ("files", "query.onnx"), ("files", "tokenizer.json")]
)  # fmt: skip


@settings(max_examples=120, deadline=None)
@given(
    raw=st.one_of(st.binary(max_size=120), st.none()),
    path=MANIFEST_PATHS,
    value=VALUES,
    reseal=st.booleans(),
)
def test_manifest_loader_only_raises_magretrieve_errors(raw, path, value, reseal) -> None:
    """Arbitrary bytes, or a valid manifest with one entry replaced, as magretrieve.json.

    ``reseal``: the edit also recomputes the checksum and fingerprint (so the field checks
    behind them are reached); without it the checksum must refuse every effective edit.
    """
    from magretrieve.core.manifest import MANIFEST_NAME, Manifest, content_checksum, seal

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "export"
        manifest = _manifest_folder(folder)
        original = json.loads(json.dumps(manifest))
        if raw is not None:
            (folder / MANIFEST_NAME).write_bytes(raw)
        else:
            edited = _mutate(manifest, path, value)
            if reseal and path == ("model_fingerprint",):
                edited["manifest_sha256"] = content_checksum(edited)  # fingerprint stays edited
            elif reseal:
                seal(edited)
            (folder / MANIFEST_NAME).write_text(json.dumps(edited))
            if not reseal and edited != original:
                try:
                    Manifest.load(folder)
                except MagRetrieveError:
                    return
                raise AssertionError(f"an edit of {path} passed the checksum")
        try:
            loaded = Manifest.load(folder)
        except MagRetrieveError as exc:
            assert str(exc)
            return
        # whatever loads names only files inside the folder
        for name in (*loaded.files, loaded.tokenizer, *(g.file for g in loaded.graphs.values())):
            assert (folder / name).resolve().parent == folder.resolve()


STATE_PATHS = st.sampled_from(
    [
        (k,)
        for k in (
            "format", "generation", "store_id", "dimension", "index_type", "parameters", "index_file",
            "records_file", "index_sha256", "records_sha256", "metadata", "sequential",
            "vectors", "records", "vectors_sha256", "hnsw_config", "quantization_config",
        )
    ]
    + [("vectors", ""), ("vectors", "", "size"), ("vectors", "", "distance")]
)  # fmt: skip


@settings(max_examples=50, deadline=None)
@given(
    kind=st.sampled_from(["faiss", "memory", "qdrant-edge", "qdrant-edge-meta"]),
    raw=st.one_of(st.binary(max_size=120), st.none()),
    path=STATE_PATHS,
    value=VALUES,
)
def test_store_state_loaders_only_raise_magretrieve_errors(kind, raw, path, value) -> None:
    """A store folder whose state file is arbitrary bytes, or valid with one entry replaced."""
    from magretrieve.stores import open_store

    state_name = {
        "faiss": "faiss_store.json",
        "memory": "memory_store.json",
        "qdrant-edge": "shard/edge_config.json",
        "qdrant-edge-meta": "magretrieve_store.json",
    }[kind]
    with tempfile.TemporaryDirectory() as tmp:
        spec = f"{kind.removesuffix('-meta')}:{tmp}/s"
        store = open_store(spec, dimension=4)
        store.add(["a", "b"], np.eye(2, 4, dtype=np.float32), [{"t": 1}, {"t": 2}])
        store.write_metadata({"mode": "qnorm"})
        store.persist()
        store.close()
        state_file = Path(tmp) / "s" / state_name
        if raw is not None:
            state_file.write_bytes(raw)
        else:
            state = json.loads(state_file.read_text())
            state_file.write_text(json.dumps(_mutate(state, path, value)))
        for dimension in (None, 4):
            try:
                reopened = open_store(spec, dimension=dimension)
                reopened.read_metadata()
                reopened.search(np.ones((1, 4), dtype=np.float32), 2)
                reopened.close()
            except MagRetrieveError as exc:
                assert str(exc)


# ----------------------------------------------------------------------------- grades and text that loads exactly or is refused


@settings(max_examples=150, deadline=None)
@given(grade=st.one_of(st.integers(-3000, 3000), st.floats(-3000, 3000, allow_nan=False)))
def test_qrels_grades_are_integers_in_range_or_refused_with_the_line(grade) -> None:
    """No grade is silently changed: an integral one in [-1000, 1000] is kept exactly, anything
    else is refused naming file:line."""
    from magretrieve.core.errors import DataError

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "test.tsv"
        path.write_text(f"query-id\tcorpus-id\tscore\nq1\td1\t{grade!r}\n")
        value = float(grade)
        if value == int(value) and abs(value) <= data.MAX_GRADE:
            assert data.load_qrels(path) == {"q1": {"d1": int(value)}}
        else:
            with pytest.raises(DataError, match=f"{path}:2"):
                data.load_qrels(path)


@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cc",)), max_size=30))
def test_any_text_loads_exactly_unless_it_holds_a_lone_surrogate(text) -> None:
    """Whatever a JSON file can hold in 'text' either loads unchanged or, for lone surrogates
    (valid JSON escapes, not Unicode), is refused naming file:line and the field."""
    from magretrieve.core.errors import DataError

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "corpus.jsonl"
        line = json.dumps({"_id": "a", "text": "x" + text})  # ensure_ascii: \\udxxx escapes
        path.write_text(line + "\n")
        if data.lone_surrogate(text) is None:
            assert data.load_corpus(path)["a"].text == "x" + text
        else:
            with pytest.raises(DataError, match=rf"{path}:1: field 'text' holds a lone surrogate"):
                data.load_corpus(path)
