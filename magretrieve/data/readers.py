"""Reading and validating retrieval data: BEIR folders, pair files, STS pair files.

Every problem is a :class:`~magretrieve.core.errors.DataError` naming the file and the line
or id at fault, so a user can fix the data without reading a traceback.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from magretrieve.core.errors import DataError
from magretrieve.core.text import blank, lone_surrogate

R = TypeVar("R")

logger = logging.getLogger(__name__)

#: Relevance grades outside this range are refused: trec_eval sizes per-query tables by the
#: largest grade (a grade of 1e12 would allocate tens of GB), and BEIR grades are 0-4.
MAX_GRADE = 1000


def check_text(text: str, where: str) -> str:
    """``text`` if it is valid Unicode; a DataError naming ``where`` and the position if not."""
    pos = lone_surrogate(text)
    if pos is not None:
        raise DataError(
            f"{where} holds a lone surrogate ({text[pos]!r} at position {pos}): not valid "
            "Unicode text (a broken JSON escape, or a mis-encoded shell argument)"
        )
    return text


def _check_strings(obj: Any, where: str, key: str = "") -> None:
    """Refuse a lone surrogate anywhere in a parsed JSON value, naming the field."""
    if isinstance(obj, str):
        check_text(obj, f"{where}: field {key!r}" if key else where)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            check_text(k, f"{where}: a field name")
            _check_strings(v, where, key or k)
    elif isinstance(obj, list):
        for v in obj:
            _check_strings(v, where, key)


def read_error(path: str | Path, exc: OSError) -> DataError:
    """A one-line DataError for a file the operating system will not let us read."""
    return DataError(f"{path}: cannot read ({exc.strerror or exc})")


@dataclass
class Document:
    """One corpus entry; ``payload`` carries any extra JSON fields through to the store."""

    id: str
    text: str
    title: str = ""
    payload: dict[str, Any] = field(default_factory=dict)

    @property
    def full_text(self) -> str:
        """Title and text joined as BEIR does for encoding."""
        return f"{self.title} {self.text}".strip() if self.title else self.text


@dataclass
class TrainingPair:
    """A query with one positive document text and optional hard negatives."""

    query: str
    positive: str
    negatives: list[str] = field(default_factory=list)
    positive_id: str | None = None


@dataclass
class RetrievalDataset:
    """A BEIR split: corpus, the queries that have judgements, and the judgements."""

    name: str
    split: str
    corpus: dict[str, Document]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    #: The qrels file the judgements came from (named in errors).
    source: str = ""

    def training_pairs(self) -> list[TrainingPair]:
        """One pair per positive judgement (score > 0), in qrels order."""
        pairs = [
            TrainingPair(self.queries[qid], self.corpus[did].full_text, positive_id=did)
            for qid, docs in self.qrels.items()
            for did, rel in docs.items()
            if rel > 0
        ]
        if not pairs:
            where = f"{self.source}: " if self.source else ""
            raise DataError(
                f"{where}{self.name}:{self.split} has no positive judgements to train on "
                "(every score is 0 or less)"
            )
        return pairs


@dataclass
class SentencePair:
    """A symmetric-task pair (e.g. STS-B) with a gold similarity score."""

    a: str
    b: str
    score: float


# ----------------------------------------------------------------------------- JSONL


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line; errors name file and line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise read_error(path, exc) from None
    with fh:
        for lineno, raw in _lines(fh, path):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{path}:{lineno}: not valid UTF-8 ({exc.reason} at byte {exc.start})"
                ) from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(
                    f"{path}:{lineno}: malformed JSON ({exc.msg}, column {exc.colno})"
                ) from None
            except (ValueError, RecursionError) as exc:
                # e.g. an integer of > 4300 digits, or arrays nested deeper than the recursion limit
                raise DataError(f"{path}:{lineno}: malformed JSON ({exc})") from None
            if not isinstance(obj, dict):
                raise DataError(
                    f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}"
                )
            if (
                "\\u" in line and "\\ud" in line.lower()
            ):  # cheap prefilter: only a \\uDxxx escape is lone
                _check_strings(obj, f"{path}:{lineno}")
            yield lineno, obj


def _lines(fh: Any, path: Path) -> Iterator[tuple[int, bytes]]:
    """Numbered lines of an open file; an OS read error (EIO, ...) is a DataError."""
    lineno = 0
    while True:
        try:
            raw = fh.readline()
        except OSError as exc:
            raise read_error(path, exc) from None
        if not raw:
            return
        lineno += 1
        yield lineno, raw


def _required_str(
    obj: dict[str, Any], key: str, path: Path, lineno: int, *, allow_empty: bool = False
) -> str:
    if key not in obj:
        raise DataError(f"{path}:{lineno}: missing field {key!r}")
    value = obj[key]
    if key == "_id" and isinstance(value, float):
        # json reads NaN/Infinity/1.5 as floats; str() would make ids "nan" and "1.5" that
        # match nothing in qrels (or match by accident). Integers only.
        raise DataError(
            f"{path}:{lineno}: field '_id' must be a string or an integer, got {value!r}"
        )
    if isinstance(value, int) and not isinstance(value, bool) and key == "_id":
        value = str(value)
    if not isinstance(value, str):
        raise DataError(
            f"{path}:{lineno}: field {key!r} must be a string, got {type(value).__name__}"
        )
    if not allow_empty and blank(value):
        raise DataError(f"{path}:{lineno}: field {key!r} is empty")
    return value


def iter_corpus(
    path: str | Path, *, allow_empty: bool = False, skip_empty: bool = False
) -> Iterator[tuple[int, Document]]:
    """Stream a corpus JSONL (``_id``, ``text``, optional ``title`` and extra payload fields).

    Streaming lets indexing start before a large file is read; duplicates are refused by
    the caller that keeps the ids (see :func:`load_corpus`). A document with empty title and
    text is refused, kept with a warning (``allow_empty``), or passed through for the caller
    to skip and count (``skip_empty``: :func:`is_empty` tells which).
    """
    path = Path(path)
    for lineno, obj in read_jsonl(path):
        yield (
            lineno,
            corpus_document(obj, path, lineno, allow_empty=allow_empty, skip_empty=skip_empty),
        )


def corpus_document(
    obj: dict[str, Any],
    path: Path,
    lineno: int,
    *,
    allow_empty: bool = False,
    skip_empty: bool = False,
) -> Document:
    """One corpus line's object as a :class:`Document` (errors name ``path:lineno``).

    Shared by :func:`iter_corpus` and the distributed indexing engines, which parse lines on
    their workers: both read a line exactly the same way. An empty document is refused, kept
    with a warning (``allow_empty``) or returned without payload for the caller to skip
    (``skip_empty``; :func:`is_empty` tells which).
    """
    doc_id = _required_str(obj, "_id", path, lineno)
    text = _required_str(obj, "text", path, lineno, allow_empty=True)
    title = obj.get("title")
    if title is None:
        title = ""
    if not isinstance(title, str):
        raise DataError(
            f"{path}:{lineno}: field 'title' must be a string, got {type(title).__name__}"
        )
    if blank(text) and blank(title):
        if skip_empty:
            return Document(doc_id, text, title, {})
        if not allow_empty:
            raise DataError(
                f"{path}:{lineno}: document {doc_id!r} has empty title and text "
                "(`magretrieve index --skip-empty` skips and counts such documents)"
            )
        logger.warning("%s:%s: document %r has empty title and text (kept)", path, lineno, doc_id)
    payload = {k: v for k, v in obj.items() if k not in ("_id", "text", "title")}
    return Document(doc_id, text, title, payload)


def is_empty(doc: Document) -> bool:
    """True for a document with nothing to encode (title and text :func:`blank`)."""
    return blank(doc.text) and blank(doc.title)


def _duplicate_id(path: Path, lineno: int, doc_id: str, first: int) -> DataError:
    return DataError(f"{path}:{lineno}: duplicate document id {doc_id!r} (first on line {first})")


def iter_documents_to_index(
    path: str | Path, *, skip_empty: bool = False, on_empty: Callable[[str], Any] | None = None
) -> Iterator[tuple[int, Document]]:
    """The documents of a corpus file to index, with their lines, checked as indexing needs:
    a duplicate id is refused (naming both lines), and so is a document with empty title and
    text unless ``skip_empty``, which leaves it out and hands its id to ``on_empty``."""
    path = Path(path)
    first: dict[str, int] = {}
    for lineno, doc in iter_corpus(path, skip_empty=True):
        if is_empty(doc):
            if not skip_empty:
                raise DataError(
                    f"{path}:{lineno}: document {doc.id!r} has empty title and text "
                    "(`magretrieve index --skip-empty` skips and counts such documents)"
                )
            if on_empty is not None:
                on_empty(doc.id)
            continue
        if doc.id in first:
            raise _duplicate_id(path, lineno, doc.id, first[doc.id])
        first[doc.id] = lineno
        yield lineno, doc


def load_corpus(path: str | Path, *, allow_empty: bool = False) -> dict[str, Document]:
    """Read a whole corpus, refusing duplicate ids and an empty file."""
    path = Path(path)
    corpus: dict[str, Document] = {}
    first_line: dict[str, int] = {}
    for lineno, doc in iter_corpus(path, allow_empty=allow_empty):
        if doc.id in corpus:
            raise _duplicate_id(path, lineno, doc.id, first_line[doc.id])
        corpus[doc.id] = doc
        first_line[doc.id] = lineno
    if not corpus:
        raise DataError(f"{path}: corpus is empty")
    return corpus


def load_queries(path: str | Path) -> dict[str, str]:
    """Read queries JSONL (``_id``, ``text``), refusing duplicates and empty texts."""
    path = Path(path)
    queries: dict[str, str] = {}
    for lineno, obj in read_jsonl(path):
        qid = _required_str(obj, "_id", path, lineno)
        if qid in queries:
            raise DataError(f"{path}:{lineno}: duplicate query id {qid!r}")
        queries[qid] = _required_str(obj, "text", path, lineno)
    if not queries:
        raise DataError(f"{path}: no queries")
    return queries


def load_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """Read a BEIR qrels TSV (header ``query-id corpus-id score``)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    qrels: dict[str, dict[str, int]] = {}
    rows: list[list[str]] = []
    try:
        fh = path.open(encoding="utf-8", newline="")
    except OSError as exc:
        raise read_error(path, exc) from None
    try:
        with fh:
            # QUOTE_NONE: BEIR qrels are plain TSV, so one row is one line (line numbers stay right)
            reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
            try:
                for row in reader:
                    rows.append(row)
            except csv.Error as exc:
                raise DataError(f"{path}:{reader.line_num}: unreadable TSV row ({exc})") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not valid UTF-8 ({exc.reason})") from None
    except OSError as exc:
        raise read_error(path, exc) from None
    if not rows:
        raise DataError(f"{path}: empty qrels file")
    header = [c.strip().lower() for c in rows[0]]
    if header[:2] != ["query-id", "corpus-id"]:
        raise DataError(
            f"{path}:1: missing header 'query-id<TAB>corpus-id<TAB>score' (got {rows[0]!r})"
        )
    for lineno, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        if len(row) < 3:
            raise DataError(f"{path}:{lineno}: expected 3 tab-separated columns, got {len(row)}")
        qid, did, score = row[0].strip(), row[1].strip(), row[2].strip()
        try:
            value = float(score)
        except ValueError:
            raise DataError(f"{path}:{lineno}: score {score!r} is not a number") from None
        if not math.isfinite(value):
            raise DataError(f"{path}:{lineno}: score {score!r} is not a finite number")
        if value != int(value):
            # trec_eval scores integer grades: int() would silently turn 0.5 into 0
            raise DataError(
                f"{path}:{lineno}: score {score!r} is not an integer grade (NDCG needs integer "
                "relevance grades; map fractional scores to grades before evaluating)"
            )
        if abs(value) > MAX_GRADE:
            raise DataError(
                f"{path}:{lineno}: grade {score!r} is outside [-{MAX_GRADE}, {MAX_GRADE}] "
                "(BEIR grades are 0-4; trec_eval allocates per grade)"
            )
        if not qid or not did:
            raise DataError(f"{path}:{lineno}: empty query or document id")
        rel = int(value)
        qrels.setdefault(qid, {})[did] = rel
    if not qrels:
        raise DataError(f"{path}: no judgements")
    return qrels


def parse_data_spec(spec: str | Path, default_split: str = "test") -> tuple[Path, str]:
    """Split ``DIR:split`` into the folder and the qrels split name (default ``test``)."""
    text = str(spec)
    folder, sep, split = text.rpartition(":")
    if not sep or "/" in split or not split:
        folder, split = text, default_split
    return Path(folder), split


def load_beir(spec: str | Path, default_split: str = "test") -> RetrievalDataset:
    """Load a BEIR folder split (``DIR:split``), keeping only queries judged in that split.

    Every judged query and document must exist: an unknown id is an error naming it.
    """
    folder, split = parse_data_spec(spec, default_split)
    if not folder.is_dir():
        raise DataError(f"{folder}: not a folder (expected a BEIR folder with corpus.jsonl)")
    qrels_path = folder / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        available = (
            sorted(p.stem for p in (folder / "qrels").glob("*.tsv"))
            if (folder / "qrels").is_dir()
            else []
        )
        raise DataError(
            f"{qrels_path}: no such qrels split {split!r} (available: {', '.join(available) or 'none'})"
        )
    # Published BEIR corpora hold a few empty documents (cranfield 471 and 995, as in the
    # original collection); evaluation keeps them so figures stay comparable, with a warning.
    corpus = load_corpus(folder / "corpus.jsonl", allow_empty=True)
    all_queries = load_queries(folder / "queries.jsonl")
    qrels = load_qrels(qrels_path)
    for qid, docs in qrels.items():
        if qid not in all_queries:
            raise DataError(f"{qrels_path}: query id {qid!r} is not in {folder / 'queries.jsonl'}")
        for did in docs:
            if did not in corpus:
                raise DataError(
                    f"{qrels_path}: document id {did!r} (query {qid!r}) is not in {folder / 'corpus.jsonl'}"
                )
    queries = {qid: all_queries[qid] for qid in qrels}
    return RetrievalDataset(folder.name, split, corpus, queries, qrels, source=str(qrels_path))


def _load_records(
    path: str | Path, parse: Callable[[dict[str, Any], Path, int], R], none: str
) -> list[R]:
    """One record per JSONL line, made by ``parse(obj, path, lineno)`` (its errors name the
    line); a file without any is refused as ``{path}: {none}``."""
    path = Path(path)
    records = [parse(obj, path, lineno) for lineno, obj in read_jsonl(path)]
    if not records:
        raise DataError(f"{path}: {none}")
    return records


def _training_pair(obj: dict[str, Any], path: Path, lineno: int) -> TrainingPair:
    query = _required_str(obj, "query", path, lineno)
    positive = _required_str(obj, "positive", path, lineno)
    negatives = obj.get("negatives", []) or []
    if not isinstance(negatives, list) or not all(isinstance(n, str) for n in negatives):
        raise DataError(f"{path}:{lineno}: field 'negatives' must be a list of strings")
    return TrainingPair(query, positive, list(negatives))


def load_pairs(path: str | Path) -> list[TrainingPair]:
    """Read a training JSONL of ``{"query", "positive", "negatives"?}`` objects."""
    return _load_records(path, _training_pair, "no training pairs (no positives)")


#: Gold score from which a sentence pair of an STS file counts as a positive for training.
STS_POSITIVE_SCORE = 4.0


@dataclass
class TrainingData:
    """Training pairs, and the BEIR split they came from (None for a pair file).

    The split is what hard-negative mining, norm calibration and a validation hold-out need
    beyond the pairs themselves.
    """

    pairs: list[TrainingPair]
    dataset: RetrievalDataset | None = None


def read_training_data(spec: str | Path) -> TrainingData:
    """Training data from any of the three forms ``magretrieve train --train`` accepts.

    An STS sentence-pair JSONL (``sentence1``, ``sentence2``, ``score``: pairs scoring at
    least :data:`STS_POSITIVE_SCORE` are positives), a pair JSONL (``query``, ``positive``,
    ``negatives``), or a BEIR ``DIR:split`` (default split ``train``).
    """
    if is_sentence_pair_file(spec):
        pairs = [
            TrainingPair(p.a, p.b)
            for p in load_sentence_pairs(spec)
            if p.score >= STS_POSITIVE_SCORE
        ]
        if not pairs:
            raise DataError(
                f"{spec}: no pairs with score >= {STS_POSITIVE_SCORE} to use as positives"
            )
        return TrainingData(pairs)
    if str(spec).endswith(".jsonl"):
        return TrainingData(load_pairs(spec))
    folder, split = parse_data_spec(spec, default_split="train")
    dataset = load_beir(f"{folder}:{split}")
    return TrainingData(dataset.training_pairs(), dataset)


def load_training_data(spec: str | Path) -> list[TrainingPair]:
    """Training pairs of :func:`read_training_data` (STS file, pair file or BEIR ``DIR:split``)."""
    return read_training_data(spec).pairs


def _sentence_pair(obj: dict[str, Any], path: Path, lineno: int) -> SentencePair:
    a = _required_str(obj, "sentence1", path, lineno)
    b = _required_str(obj, "sentence2", path, lineno)
    score = obj.get("score")
    try:
        value = float(score) if isinstance(score, (int, float)) else math.nan
    except OverflowError:  # an integer too large for a float
        value = math.nan
    if isinstance(score, bool) or not math.isfinite(value):
        raise DataError(f"{path}:{lineno}: field 'score' must be a finite number, got {score!r}")
    return SentencePair(a, b, value)


def load_sentence_pairs(path: str | Path) -> list[SentencePair]:
    """Read an STS-style JSONL (``sentence1``, ``sentence2``, ``score``)."""
    return _load_records(path, _sentence_pair, "no sentence pairs")


def is_sentence_pair_file(spec: str | Path) -> bool:
    """True for a JSONL whose first object has ``sentence1``/``sentence2`` (an STS file)."""
    path = Path(str(spec))
    if not (path.is_file() and path.suffix == ".jsonl"):
        return False
    for _, obj in read_jsonl(path):
        return "sentence1" in obj and "sentence2" in obj
    return False
