"""benchmarks/scann_kernels.py on a small store: both settings probed in their own processes,
ScaNN's own choice left alone under ``MAGRETRIEVE_SCANN_AVX2=0``, recall measured against
exact inner product, and the ratios taken against the own-check rows."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from magretrieve.stores._scann_kernels import cpu_has_avx2
from tests.support.benchmarks import load_benchmark

pytest.importorskip("scann")

pytestmark = pytest.mark.integration


def test_a_small_run_writes_both_settings_with_their_recall(tmp_path, monkeypatch):
    bench = load_benchmark("scann_kernels")
    monkeypatch.setenv("MAGRETRIEVE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "sk"
    args = ["--n", "25000", "--dim", "16", "--queries", "64", "--seconds", "0.05"]
    result = CliRunner().invoke(bench.main, [*args, "--out", str(out), "--lock", ""])
    assert result.exit_code == 0, result.output
    record = json.loads(out.with_suffix(".json").read_text())
    rows = record["rows"]
    assert [(r[0], r[2]) for r in rows] == [
        (name, bs) for name in bench.SETTINGS for bs in bench.BATCHES
    ]
    ran = {r[0]: r[1] for r in rows}
    assert ran["ScaNN's own check"] in ("sse4", "avx2")  # never switched by the store
    assert ran["switched on"] in ("avx2", "avx2 (switched on)") or not cpu_has_avx2()
    for r in rows:
        assert float(r[3]) > 0 and float(r[4]) > 0  # q/s and CPU ms per query measured
        assert float(r[6]) >= 0.9  # a tuned store's recall@10 against exact
        if r[0] == "ScaNN's own check":
            assert r[5] == "1.00x"  # the ratio's own base
    assert 0.0 <= record["same_hits"] <= 1.0
    assert (out.with_suffix(".md")).read_text().count("| ") > 8
