"""benchmarks/perf.py's ratio of a round over the same round on the code before (``BEFORE``): read from
the rows its child measured there, and a failed child or run reported as a failed measure, never dropped."""

from __future__ import annotations

import importlib
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


def test_the_ratio_over_the_code_before_is_read_from_its_rows(perf):
    old = [{"name": "p: one round", "value": 8.0, "load_average": 1.5, "note": ""},
           {"name": "p: one round, over plain PyG", "value": 5.0, "load_average": 1.5, "note": ""}]
    out = perf.over_before("g", old, measures(perf, 2.0), "<= 0.4")
    assert [m.name for m in out][-1] == "p: one round, over the code before"
    assert out[-1].value == 0.25 and out[-1].passed is True
    assert "8.00 s" in out[-1].note and "2 against 5" in out[-1].note


def test_a_failed_child_or_run_is_a_failed_ratio(perf):
    failed = perf.over_before("g", RuntimeError("no such revision"), measures(perf, 2.0), "<= 0.4")
    assert failed[-1].value is None and failed[-1].passed is False and "no such revision" in failed[-1].note
    old = [{"name": "p: one round", "value": None, "load_average": 1.0, "note": "not measured: MemoryError"}]
    assert "MemoryError" in perf.over_before("g", old, measures(perf, 2.0), "<= 0.4")[-1].note


def test_the_child_on_the_code_before_adds_no_ratio(perf):
    assert len(perf.over_before("g", [], measures(perf, 2.0), "<= 0.4")) == 2
