"""benchmarks/perf.py's ratio of a round over the same round on the code before (``BEFORE``): the median
of the paired ratios its children timed, and a failed child reported as a failed measure, never dropped."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def perf():
    sys.path.insert(0, str(BENCHMARKS))  # perf.py imports its harness beside it
    try:
        yield importlib.import_module("perf")
    finally:
        sys.path.remove(str(BENCHMARKS))


def measures(perf, seconds):
    return [perf.Measure("g", "p: one round", seconds, "s"),
            perf.Measure("g", "p: one round, over plain PyG", 2.0, "x")]


def test_the_ratio_over_the_code_before_is_the_median_of_the_pairs(perf):
    # CPU seconds decide; the wall seconds (a core shared with other work) are shown beside
    pairs = [({"cpu": c, "wall": 3 * c}, {"cpu": n, "wall": 9 * n}) for c, n in ((8.0, 4.2), (12.0, 6.0), (16.0, 7.8))]
    out = perf.over_before("g", pairs, measures(perf, 2.0), "<= 0.6")
    assert [m.name for m in out][-1] == "p: one round, over the code before"
    assert out[-1].value == 0.5 and out[-1].passed is True
    assert "median of 3 paired ratios" in out[-1].note
    assert "6.00 against 12.00 (54.00 against 36.00 wall)" in out[-1].note


def test_a_failed_child_is_a_failed_ratio(perf):
    failed = perf.over_before("g", RuntimeError("no such revision"), measures(perf, 2.0), "<= 0.4")
    assert failed[-1].value is None and failed[-1].passed is False and "no such revision" in failed[-1].note


def test_a_child_that_fails_names_its_last_line(perf, monkeypatch):
    before = importlib.import_module("perf_before")

    def failing(argv, **kwargs):
        return subprocess.CompletedProcess(argv, 1, "", "Traceback ...\nMemoryError: out of memory")
    monkeypatch.setattr(before.subprocess, "run", failing)
    with pytest.raises(RuntimeError, match="MemoryError: out of memory"):
        before.round_seconds("cnfgnn-cs", True, perf.CPU, BENCHMARKS)
    assert "MemoryError" in before.paired_rounds("cnfgnn-cs", True, perf.CPU).args[0]
