"""engine="ray": a local Ray with 2 CPUs builds the same store as single-process indexing.

Needs the ``magretrieve[ray]`` extra (the import check at the bottom does not). CPU-heavy
(Ray start-up, two encoding actors): run under the shared CPU lock.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from magretrieve.cli import main
from magretrieve.core.errors import ConfigError, DataError
from magretrieve.serving.indexing import index_corpus
from magretrieve.serving.retriever import Retriever
from magretrieve.stores import open_store

N_DOCS = 40


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, tiny_model_dir) -> Path:
    from magretrieve.export import export_model

    out = tmp_path_factory.mktemp("ray-export") / "qnorm"
    export_model(tiny_model_dir, out, mode="qnorm", exporter="torchscript", overwrite=True)
    return out


def write_corpus(path: Path, n: int = N_DOCS, start: int = 0) -> Path:
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    rng = np.random.default_rng(7)
    rows = []
    for i in range(start, start + n):
        text = " ".join(rng.choice(words, size=int(rng.integers(3, 40))))
        row = {"_id": f"d{i}", "title": f"title {i}" if i % 3 else "", "text": text}
        if i % 2:  # payloads of several JSON types must survive the trip through Ray
            row.update({"year": 2000 + i, "tags": ["a", str(i)], "meta": {"score": i / 7}})
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def records(spec: str) -> dict[str, tuple[np.ndarray, dict]]:
    with open_store(spec) as store:
        ids = sorted(store.iter_ids())
        got = store.get(ids)
        return {r.id: (np.asarray(r.vector, dtype=np.float32), dict(r.payload)) for r in got}


def assert_same_store(a: str, b: str) -> None:
    ra, rb = records(a), records(b)
    assert sorted(ra) == sorted(rb)
    for doc_id, (vec, payload) in ra.items():
        np.testing.assert_allclose(rb[doc_id][0], vec, atol=1e-5, err_msg=doc_id)
        assert rb[doc_id][1] == payload, doc_id


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray", reason="engine='ray' needs the magretrieve[ray] extra")
    from magretrieve.engines.ray_engine import start_ray

    assert start_ray(num_cpus=2)  # the engine's own start (a second try if the raylet is late)
    yield ray
    ray.shutdown()


def index(export: Path, spec: str, corpus: Path, **kw) -> object:
    with Retriever.load(export, store=spec) as r:
        return index_corpus(r, corpus, batch_size=8, progress=False, **kw)


@pytest.mark.integration
def test_ray_store_equals_single_process(ray_local, export_dir, tmp_path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    local = index(export_dir, f"faiss:{tmp_path / 'local'}", corpus)
    distributed = index(
        export_dir, f"faiss:{tmp_path / 'ray'}", corpus, engine="ray", workers=2, threads=1
    )
    assert local.added == distributed.added == N_DOCS
    assert distributed.count == N_DOCS and distributed.skipped == 0
    assert_same_store(f"faiss:{tmp_path / 'local'}", f"faiss:{tmp_path / 'ray'}")


@pytest.mark.integration
def test_ray_serves_a_static_int8_export_on_its_own_runtime(
    ray_local, tiny_model_dir, tiny_beir_dir, tmp_path
) -> None:
    """Workers open the export with its default runtime: OpenVINO for a static int8 export.

    Static int8 has fixed activation scales, so a vector does not depend on how the workers
    batched it: the Ray store equals the single-process one as closely as fp32 does.
    """
    pytest.importorskip("nncf", reason="int8-static needs the magretrieve[openvino-int8] extra")
    from magretrieve.export import export_model

    export = export_model(
        tiny_model_dir,
        tmp_path / "static",
        mode="qnorm",
        quantize="int8-static",
        calibration_data=tiny_beir_dir,
    )
    corpus = write_corpus(tmp_path / "corpus.jsonl", n=20)
    index(export, f"faiss:{tmp_path / 'local'}", corpus)
    report = index(export, f"faiss:{tmp_path / 'ray'}", corpus, engine="ray", workers=2)
    assert report.added == 20
    assert_same_store(f"faiss:{tmp_path / 'local'}", f"faiss:{tmp_path / 'ray'}")


#: Raw Unicode line breaks inside JSON strings: ``str.splitlines`` splits at each of them.
BREAKS = ["\u2028", "\u2029", "\x85", "\x1c", "\x1d", "\x1e", "\x0b", "\x0c"]


def write_separator_corpus(path: Path) -> Path:
    """Documents whose id, title and text carry raw line breaks; a CRLF line; blank lines.

    The control characters (``\\x1c``, ``\\x0b``, ...) must be escaped in JSON, so they
    appear as escapes; the Unicode separators appear raw (``ensure_ascii=False``).
    """
    rows = [
        {"_id": f"s{i}{ch}", "title": f"t{ch}{i}", "text": f"alpha{ch}beta gamma {i}{ch}"}
        for i, ch in enumerate(BREAKS)
    ]
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    lines[1] += "\r"  # a CRLF line ending: JSON whitespace, the same line for both engines
    lines.insert(3, "")
    path.write_bytes(("\n".join(lines) + "\n").encode("utf-8"))
    return path


def test_ray_reads_lines_exactly_as_the_local_reader(tmp_path) -> None:
    """Byte ranges cut at ``\\n`` and split on ``\\n``: the local reader's lines, any chunk."""
    from magretrieve.data.readers import read_jsonl
    from magretrieve.engines.ray_engine import line_ranges, read_lines

    corpus = write_separator_corpus(tmp_path / "sep.jsonl")
    expected = [obj for _, obj in read_jsonl(corpus)]
    assert len(expected) == len(BREAKS)
    for chunk in (1, 7, 64, 1 << 20):
        ranges = line_ranges(corpus, chunk)
        assert ranges[0][0] == 0 and ranges[-1][1] == corpus.stat().st_size
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        rows = [
            r for a, b in ranges for r in read_lines({"path": str(corpus), "start": a, "end": b})
        ]
        assert [json.loads(r["text"]) for r in rows] == expected, chunk


@pytest.mark.integration
def test_ray_indexes_unicode_line_breaks_like_the_local_engine(
    ray_local, export_dir, tmp_path
) -> None:
    corpus = write_separator_corpus(tmp_path / "sep.jsonl")
    local = index(export_dir, f"faiss:{tmp_path / 'local'}", corpus)
    distributed = index(export_dir, f"faiss:{tmp_path / 'ray'}", corpus, engine="ray", workers=2)
    assert local.added == distributed.added == len(BREAKS)
    assert_same_store(f"faiss:{tmp_path / 'local'}", f"faiss:{tmp_path / 'ray'}")
    stored = records(f"faiss:{tmp_path / 'ray'}")
    assert sorted(stored) == sorted(f"s{i}{ch}" for i, ch in enumerate(BREAKS))


@pytest.mark.integration
def test_ray_resumes_skipping_stored_ids(ray_local, export_dir, tmp_path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    first = write_corpus(tmp_path / "first.jsonl", n=15)  # a run that stopped after 15 docs
    index(export_dir, f"faiss:{tmp_path / 'full'}", corpus)
    index(export_dir, f"faiss:{tmp_path / 'resumed'}", first)
    report = index(export_dir, f"faiss:{tmp_path / 'resumed'}", corpus, engine="ray", workers=2)
    assert (report.seen, report.skipped, report.added) == (N_DOCS, 15, N_DOCS - 15)
    assert_same_store(f"faiss:{tmp_path / 'full'}", f"faiss:{tmp_path / 'resumed'}")
    again = index(export_dir, f"faiss:{tmp_path / 'resumed'}", corpus, engine="ray")
    assert (again.added, again.skipped) == (0, N_DOCS)


@pytest.mark.integration
def test_ray_refuses_duplicates_before_storing(ray_local, export_dir, tmp_path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl", n=5)
    with corpus.open("a") as fh:
        fh.write(json.dumps({"_id": "d2", "text": "again"}) + "\n")
    spec = f"faiss:{tmp_path / 'dup'}"
    with pytest.raises(DataError, match=r"corpus.jsonl:6: duplicate document id 'd2'.*line 3"):
        index(export_dir, spec, corpus, engine="ray", workers=2)
    if (tmp_path / "dup" / "faiss_store.json").exists():  # created empty, or not at all
        with open_store(spec) as store:
            assert store.count() == 0


@pytest.mark.integration
def test_cli_engine_ray(ray_local, export_dir, tmp_path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl", n=12)
    spec = f"faiss:{tmp_path / 'cli'}"
    args = ["index", str(export_dir), str(corpus), "--store", spec, "--no-progress"]
    result = CliRunner().invoke(main, [*args, "--engine", "ray", "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert "12 added, 0 already stored, 12 in store" in result.output
    bad = CliRunner().invoke(main, [*args, "--workers", "2"])
    assert bad.exit_code == 1 and "--workers needs --engine ray" in bad.output


def test_unknown_engine_and_stray_options(export_dir, tmp_path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl", n=3)
    with pytest.raises(ConfigError, match="unknown indexing engine 'spark'"):
        index(export_dir, f"faiss:{tmp_path / 's'}", corpus, engine="spark")
    with pytest.raises(ConfigError, match="need a distributed engine"):
        index(export_dir, f"faiss:{tmp_path / 's'}", corpus, workers=2)


def test_default_path_never_imports_ray() -> None:
    code = (
        "import sys\n"
        "import magretrieve, magretrieve.serving.indexing, magretrieve.engines\n"
        "from magretrieve.cli import main\n"
        "try:\n"
        "    main(['index', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('RAY' if 'ray' in sys.modules else 'NO-RAY')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "NO-RAY"


class _FlakyRay:
    """Stands in for the ``ray`` module: ``init`` fails ``failures`` times, then starts."""

    def __init__(self, failures: int) -> None:
        self.failures, self.inits, self.shutdowns, self.up = failures, [], 0, False

    def is_initialized(self) -> bool:
        return self.up

    def init(self, **kw) -> None:
        self.inits.append(kw)
        if len(self.inits) <= self.failures:
            raise Exception("The current node timed out during startup.\nmore detail")
        self.up = True

    def shutdown(self) -> None:
        self.shutdowns += 1
        self.up = False


def test_start_ray_retries_a_late_local_node_once(monkeypatch) -> None:
    from magretrieve.engines import ray_engine

    fake = _FlakyRay(failures=1)
    monkeypatch.setattr(ray_engine, "_ray", lambda: fake)
    assert ray_engine.start_ray(num_cpus=2) is True
    assert len(fake.inits) == 2 and fake.shutdowns == 1  # the half-started node was cleaned up
    assert fake.inits[-1] == {
        "address": None,
        "include_dashboard": False,
        "log_to_driver": False,
        "num_cpus": 2,
    }
    assert ray_engine.start_ray() is False  # already running: not started (nor shut) by us

    fake = _FlakyRay(failures=2)
    monkeypatch.setattr(ray_engine, "_ray", lambda: fake)
    with pytest.raises(
        ConfigError,
        match=r"^Ray \(a local node\) did not start: The current node timed out during startup\.$",
    ):
        ray_engine.start_ray()
    assert len(fake.inits) == 2 and fake.shutdowns == 2


def test_start_ray_tries_a_cluster_address_once(monkeypatch) -> None:
    from magretrieve.engines import ray_engine

    fake = _FlakyRay(failures=1)
    probed: list[tuple[str, float]] = []
    monkeypatch.setattr(ray_engine, "_ray", lambda: fake)
    monkeypatch.setattr(ray_engine, "probe_address", lambda a, t: probed.append((a, t)))
    with pytest.raises(ConfigError, match=r"^Ray at ray://head:10001 did not start: "):
        ray_engine.start_ray("ray://head:10001", connect_timeout=4.0)
    assert len(fake.inits) == 1
    assert probed == [("ray://head:10001", 4.0)]  # the address was probed before ray.init


def test_probe_fails_fast_on_a_dead_port_and_leaves_auto_to_ray() -> None:
    import socket
    import time

    from magretrieve.engines.ray_engine import probe_address

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(ConfigError, match=rf"^Ray at {address} did not answer within 3 s"):
            probe_address(address, 3.0)
    assert time.monotonic() - started < 3.0
    with socket.socket() as live:  # a listening port passes
        live.bind(("127.0.0.1", 0))
        live.listen()
        probe_address(f"127.0.0.1:{live.getsockname()[1]}", 3.0)
    probe_address("auto", 0.001)  # no host:port: Ray resolves it, nothing probed
