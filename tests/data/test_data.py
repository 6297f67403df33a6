"""BEIR and pair loading: real folders load, and every kind of bad input is a DataError that
names the file and the line (or the id) at fault."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from magretrieve.core.errors import DataError, MagRetrieveError
from magretrieve.data import readers as data

HEADER = "query-id\tcorpus-id\tscore\n"


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def jsonl(*objs: object) -> str:
    return "".join(json.dumps(o) + "\n" for o in objs)


@pytest.fixture
def beir_copy(tiny_beir_dir: Path, tmp_path: Path) -> Path:
    """A private, editable copy of the tiny BEIR folder."""
    return Path(shutil.copytree(tiny_beir_dir, tmp_path / "beir"))


# ----------------------------------------------------------------------------- loading


def test_load_tiny_beir_test_split(tiny_beir_dir: Path) -> None:
    ds = data.load_beir(f"{tiny_beir_dir}:test")
    assert ds.split == "test"
    assert ds.name == tiny_beir_dir.name
    assert len(ds.corpus) == 12
    # only the 6 queries judged in the test split are kept (t0..t5), not the train ones
    assert sorted(ds.queries) == [f"t{i}" for i in range(6)]
    assert ds.qrels["t0"] == {"d01": 1}
    assert ds.queries["t0"] == "how statins heart risk"
    doc = ds.corpus["d01"]
    assert doc.title == "statins heart"
    assert doc.text == "statins heart study 1 of the effect on patients"
    assert doc.full_text == "statins heart statins heart study 1 of the effect on patients"


def test_load_tiny_beir_default_split_and_training_pairs(tiny_beir_dir: Path) -> None:
    assert data.load_beir(tiny_beir_dir).split == "test"
    assert data.load_beir(tiny_beir_dir, default_split="train").split == "train"
    pairs = data.load_training_data(str(tiny_beir_dir))  # default split for training: train
    assert len(pairs) == 6
    assert pairs[0].query == "what does statins heart cause"
    assert pairs[0].positive_id == "d00"
    assert pairs[0].positive == "statins heart statins heart study 0 of the effect on patients"


def test_load_scifact(shared_data: Path) -> None:
    folder = shared_data / "scifact"
    test = data.load_beir(f"{folder}:test")
    assert len(test.corpus) == 5183
    assert len(test.queries) == 300
    assert sum(len(v) for v in test.qrels.values()) == 339
    assert all(rel > 0 for docs in test.qrels.values() for rel in docs.values())
    train = data.load_beir(f"{folder}:train")
    assert len(train.queries) == 809
    assert len(train.training_pairs()) == 919
    # qrels rows are read as they are: first test row is query 1 -> doc 31715818
    assert test.qrels["1"] == {"31715818": 1}


def test_document_extra_fields_become_payload(tmp_path: Path) -> None:
    p = write(
        tmp_path / "c.jsonl",
        jsonl({"_id": 7, "text": "t", "title": None, "year": 2020, "tags": ["a"]}),
    )
    corpus = data.load_corpus(p)
    assert list(corpus) == ["7"]  # numeric ids become strings
    assert corpus["7"].payload == {"year": 2020, "tags": ["a"]}
    assert corpus["7"].title == ""
    assert corpus["7"].full_text == "t"


def test_blank_lines_are_skipped_and_line_numbers_count_them(tmp_path: Path) -> None:
    p = write(tmp_path / "c.jsonl", '{"_id": "a", "text": "x"}\n\n   \n{"_id": "a", "text": "y"}\n')
    with pytest.raises(
        DataError, match=r"c\.jsonl:4: duplicate document id 'a' \(first on line 1\)"
    ):
        data.load_corpus(p)


def test_crlf_line_endings_are_accepted(tmp_path: Path) -> None:
    p = write(tmp_path / "c.jsonl", b'{"_id": "a", "text": "x"}\r\n{"_id": "b", "text": "y"}\r\n')
    assert list(data.load_corpus(p)) == ["a", "b"]
    q = write(tmp_path / "q.tsv", b"query-id\tcorpus-id\tscore\r\nq1\td1\t2\r\n")
    assert data.load_qrels(q) == {"q1": {"d1": 2}}


# ----------------------------------------------------------------------------- JSONL errors


def test_malformed_jsonl_line_names_file_and_line(tmp_path: Path) -> None:
    p = write(tmp_path / "corpus.jsonl", jsonl({"_id": "a", "text": "x"}) + '{"_id": "b", text}\n')
    with pytest.raises(DataError) as info:
        data.load_corpus(p)
    msg = str(info.value)
    assert f"{p}:2: malformed JSON" in msg


def test_truncated_last_line(tmp_path: Path) -> None:
    p = write(tmp_path / "corpus.jsonl", jsonl({"_id": "a", "text": "x"}) + '{"_id": "b", "te')
    with pytest.raises(DataError, match=rf"{p}:2: malformed JSON"):
        data.load_corpus(p)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('["_id", "text"]', "expected a JSON object, got list"),
        ('"just a string"', "expected a JSON object, got str"),
        ('{"_id": ["a"], "text": "x"}', "field '_id' must be a string, got list"),
        ('{"_id": true, "text": "x"}', "field '_id' must be a string, got bool"),
        ('{"_id": "a", "text": 5}', "field 'text' must be a string, got int"),
        ('{"_id": "a", "text": "x", "title": 0}', "field 'title' must be a string, got int"),
        ('{"_id": "a", "text": "x", "title": ["t"]}', "field 'title' must be a string, got list"),
        ('{"text": "x"}', "missing field '_id'"),
        ('{"_id": "a"}', "missing field 'text'"),
        ('{"_id": "  ", "text": "x"}', "field '_id' is empty"),
        ('{"_id": "a", "text": "  \\t ", "title": ""}', "document 'a' has empty title and text"),
        ('{"_id": "a", "text": "   "}', "document 'a' has empty title and text"),
        ("[" * 100000, "malformed JSON"),  # deeper than the recursion limit
        ('{"_id": ' + "1" * 5000 + ', "text": "x"}', "malformed JSON"),  # int too long to parse
    ],
)
def test_corpus_line_errors(tmp_path: Path, line: str, needle: str) -> None:
    p = write(tmp_path / "corpus.jsonl", jsonl({"_id": "ok", "text": "fine"}) + line + "\n")
    with pytest.raises(DataError) as info:
        data.load_corpus(p)
    assert f"{p}:2: " in str(info.value)
    assert needle in str(info.value)


def test_title_only_document_is_fine(tmp_path: Path) -> None:
    p = write(tmp_path / "c.jsonl", jsonl({"_id": "a", "text": "", "title": "Only a title"}))
    assert data.load_corpus(p)["a"].full_text == "Only a title"


def test_duplicate_document_id_names_both_lines(tmp_path: Path) -> None:
    p = write(
        tmp_path / "corpus.jsonl",
        jsonl({"_id": "a", "text": "x"}, {"_id": "b", "text": "y"}, {"_id": "a", "text": "z"}),
    )
    with pytest.raises(DataError) as info:
        data.load_corpus(p)
    assert str(info.value) == f"{p}:3: duplicate document id 'a' (first on line 1)"


def test_duplicate_query_id(tmp_path: Path) -> None:
    p = write(tmp_path / "q.jsonl", jsonl({"_id": "q", "text": "x"}, {"_id": "q", "text": "y"}))
    with pytest.raises(DataError, match=rf"{p}:2: duplicate query id 'q'"):
        data.load_queries(p)


def test_whitespace_only_query(tmp_path: Path) -> None:
    p = write(tmp_path / "q.jsonl", jsonl({"_id": "q", "text": " \n "}))
    with pytest.raises(DataError, match=rf"{p}:1: field 'text' is empty"):
        data.load_queries(p)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_corpus(tmp_path: Path, content: str) -> None:
    p = write(tmp_path / "corpus.jsonl", content)
    with pytest.raises(DataError, match=rf"{p}: corpus is empty"):
        data.load_corpus(p)


def test_empty_queries(tmp_path: Path) -> None:
    p = write(tmp_path / "q.jsonl", "")
    with pytest.raises(DataError, match="no queries"):
        data.load_queries(p)


def test_non_utf8_bytes_name_line_and_byte(tmp_path: Path) -> None:
    p = write(
        tmp_path / "corpus.jsonl",
        b'{"_id": "a", "text": "x"}\n{"_id": "b", "text": "caf\xe9"}\n',
    )
    with pytest.raises(DataError) as info:
        data.load_corpus(p)
    assert str(info.value).startswith(f"{p}:2: not valid UTF-8")
    assert "at byte 25" in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="file not found"):
        data.load_corpus(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="file not found"):
        data.load_qrels(tmp_path / "nope.tsv")


# ----------------------------------------------------------------------------- qrels


def test_qrels_reads_graded_scores(tmp_path: Path) -> None:
    p = write(tmp_path / "q.tsv", HEADER + "q1\td1\t2\nq1\td2\t0\n\nq2\td1\t1.0\n")
    assert data.load_qrels(p) == {"q1": {"d1": 2, "d2": 0}, "q2": {"d1": 1}}


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("q1\td1\thigh\n", ":2: score 'high' is not a number"),
        ("q1\td1\t1\nq2\td2\t\n", ":3: score '' is not a number"),
        ("q1\td1\tnan\n", ":2: score 'nan' is not a finite number"),
        ("q1\td1\tinf\n", ":2: score 'inf' is not a finite number"),
        ("q1\td1\t1e400\n", ":2: score '1e400' is not a finite number"),
        ("q1\td1\n", ":2: expected 3 tab-separated columns, got 2"),
        ("q1 d1 1\n", ":2: expected 3 tab-separated columns, got 1"),
        ('"q1\td1\t1\nq2\td2\tx\n', ":3: score 'x' is not a number"),  # a quote is just a char
        ("q1\td1\t" + "1" * 200_000 + "\n", ":2: unreadable TSV row"),
    ],
)
def test_qrels_row_errors(tmp_path: Path, body: str, needle: str) -> None:
    p = write(tmp_path / "q.tsv", HEADER + body)
    with pytest.raises(DataError) as info:
        data.load_qrels(p)
    assert str(info.value).startswith(str(p))
    assert needle in str(info.value)


def test_qrels_missing_header(tmp_path: Path) -> None:
    p = write(tmp_path / "q.tsv", "q1\td1\t1\n")
    with pytest.raises(
        DataError, match=rf"{p}:1: missing header 'query-id<TAB>corpus-id<TAB>score'"
    ):
        data.load_qrels(p)


@pytest.mark.parametrize("content", ["", HEADER, HEADER + "\n\n"])
def test_qrels_empty(tmp_path: Path, content: str) -> None:
    p = write(tmp_path / "q.tsv", content)
    with pytest.raises(DataError, match=rf"{p}: (empty qrels file|no judgements)"):
        data.load_qrels(p)


def test_qrels_non_utf8(tmp_path: Path) -> None:
    p = write(tmp_path / "q.tsv", HEADER.encode() + b"q\xff\td\t1\n")
    with pytest.raises(DataError, match=rf"{p}: not valid UTF-8"):
        data.load_qrels(p)


def test_qrels_unknown_query_id_is_named(beir_copy: Path) -> None:
    write(beir_copy / "qrels" / "test.tsv", HEADER + "t0\td01\t1\nghost-q\td01\t1\n")
    with pytest.raises(DataError) as info:
        data.load_beir(f"{beir_copy}:test")
    assert "query id 'ghost-q'" in str(info.value)
    assert "queries.jsonl" in str(info.value)
    assert "test.tsv" in str(info.value)


def test_qrels_unknown_doc_id_is_named(beir_copy: Path) -> None:
    write(beir_copy / "qrels" / "test.tsv", HEADER + "t0\td01\t1\nt1\tghost-d\t1\n")
    with pytest.raises(DataError) as info:
        data.load_beir(f"{beir_copy}:test")
    assert "document id 'ghost-d' (query 't1')" in str(info.value)
    assert "corpus.jsonl" in str(info.value)


def test_unknown_split_lists_available(tiny_beir_dir: Path) -> None:
    with pytest.raises(DataError) as info:
        data.load_beir(f"{tiny_beir_dir}:dev")
    msg = str(info.value)
    assert "no such qrels split 'dev'" in msg
    assert "(available: test, train)" in msg


def test_not_a_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not a folder"):
        data.load_beir(f"{tmp_path / 'missing'}:test")


def test_split_without_positives_cannot_train(beir_copy: Path) -> None:
    write(beir_copy / "qrels" / "train.tsv", HEADER + "q0\td00\t0\nq1\td10\t0\n")
    ds = data.load_beir(f"{beir_copy}:train")
    assert ds.qrels == {"q0": {"d00": 0}, "q1": {"d10": 0}}
    with pytest.raises(DataError, match="has no positive judgements"):
        ds.training_pairs()


# ----------------------------------------------------------------------------- pair files


def test_load_pairs(tmp_path: Path) -> None:
    p = write(
        tmp_path / "pairs.jsonl",
        jsonl(
            {"query": "q one", "positive": "p one", "negatives": ["n1", "n2"]},
            {"query": "q two", "positive": "p two"},
            {"query": "q three", "positive": "p three", "negatives": None},
        ),
    )
    pairs = data.load_pairs(p)
    assert [(x.query, x.positive, x.negatives) for x in pairs] == [
        ("q one", "p one", ["n1", "n2"]),
        ("q two", "p two", []),
        ("q three", "p three", []),
    ]
    assert data.load_training_data(str(p)) == pairs


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ({"query": "q"}, "missing field 'positive'"),
        ({"query": "q", "positive": "  "}, "field 'positive' is empty"),
        (
            {"query": "q", "positive": "p", "negatives": "n"},
            "'negatives' must be a list of strings",
        ),
        (
            {"query": "q", "positive": "p", "negatives": [1]},
            "'negatives' must be a list of strings",
        ),
    ],
)
def test_pair_file_errors(tmp_path: Path, line: dict, needle: str) -> None:
    p = write(tmp_path / "pairs.jsonl", jsonl({"query": "a", "positive": "b"}, line))
    with pytest.raises(DataError) as info:
        data.load_pairs(p)
    assert f"{p}:2: " in str(info.value) and needle in str(info.value)


def test_pair_file_with_no_positives(tmp_path: Path) -> None:
    p = write(tmp_path / "pairs.jsonl", "\n")
    with pytest.raises(DataError, match=rf"{p}: no training pairs"):
        data.load_pairs(p)


def test_sentence_pairs(tmp_path: Path) -> None:
    p = write(
        tmp_path / "sts.jsonl",
        jsonl(
            {"sentence1": "a", "sentence2": "b", "score": 4},
            {"sentence1": "c", "sentence2": "d", "score": 0.5},
        ),
    )
    pairs = data.load_sentence_pairs(p)
    assert [(x.a, x.b, x.score) for x in pairs] == [("a", "b", 4.0), ("c", "d", 0.5)]
    assert data.is_sentence_pair_file(p)
    assert not data.is_sentence_pair_file(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("score", ['"4"', "true", "NaN", "Infinity", "null", "1" + "0" * 400])
def test_sentence_pair_bad_score(tmp_path: Path, score: str) -> None:
    p = write(
        tmp_path / "sts.jsonl", '{"sentence1": "a", "sentence2": "b", "score": ' + score + "}\n"
    )
    with pytest.raises(DataError, match=rf"{p}:1: field 'score' must be a finite number"):
        data.load_sentence_pairs(p)


# ----------------------------------------------------------------------------- specs


@pytest.mark.parametrize(
    ("spec", "folder", "split"),
    [
        ("../shared/data/scifact:train", "../shared/data/scifact", "train"),
        ("../shared/data/scifact", "../shared/data/scifact", "test"),
        ("data/x:dev", "data/x", "dev"),
        ("/abs/path/beir", "/abs/path/beir", "test"),
        ("a:b/c", "a:b/c", "test"),  # a colon inside the path is not a split
    ],
)
def test_parse_data_spec(spec: str, folder: str, split: str) -> None:
    assert data.parse_data_spec(spec) == (Path(folder), split)


def test_parse_data_spec_default_split() -> None:
    assert data.parse_data_spec("x", default_split="train") == (Path("x"), "train")
    assert data.parse_data_spec(Path("x")) == (Path("x"), "test")


def test_every_data_error_is_a_magretrieve_error() -> None:
    assert issubclass(DataError, MagRetrieveError)


def test_read_training_data_reads_the_three_forms(tmp_path: Path, tiny_beir_dir: Path) -> None:
    sts = tmp_path / "sts.jsonl"
    rows = [("a cat sits", "a cat is sitting", 4.6), ("a dog", "the stock market", 0.4)]
    rows.append(("rain today", "it rains today", 4.0))  # exactly the threshold counts
    sts.write_text(
        "".join(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n" for a, b, s in rows)
    )
    got = data.read_training_data(sts)
    assert [(p.query, p.positive) for p in got.pairs] == [
        ("a cat sits", "a cat is sitting"),
        ("rain today", "it rains today"),
    ]
    assert got.dataset is None
    low = tmp_path / "low.jsonl"
    low.write_text(json.dumps({"sentence1": "x", "sentence2": "y", "score": 3.9}) + "\n")
    with pytest.raises(DataError, match=r"low\.jsonl: no pairs with score >= 4\.0"):
        data.read_training_data(low)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"query": "q", "positive": "p", "negatives": ["n"]}) + "\n")
    got = data.read_training_data(pairs)
    assert got.pairs == [data.TrainingPair("q", "p", ["n"])] and got.dataset is None
    with pytest.raises(DataError, match=r"missing\.jsonl: file not found"):
        data.read_training_data(tmp_path / "missing.jsonl")
    beir = data.read_training_data(str(tiny_beir_dir))  # default split: train
    assert beir.dataset is not None and beir.dataset.split == "train"
    assert beir.pairs == beir.dataset.training_pairs()
    assert data.load_training_data(str(tiny_beir_dir)) == beir.pairs
