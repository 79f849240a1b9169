"""benchmarks/rerun.py: a committed bench run trained again and compared with its committed row."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def rerun():
    sys.path.insert(0, str(BENCHMARKS))  # rerun.py imports perf.py beside it
    try:
        import rerun as module

        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))
        for name in ("rerun", "perf"):
            sys.modules.pop(name, None)


def test_timings_are_not_compared_and_a_changed_value_is_caught(rerun):
    assert rerun.compared_columns(["test_accuracy", "sim_time_s", "wall_ms_per_round", "bytes_total"]) == [
        "test_accuracy", "bytes_total"]
    rows = rerun.compare({"test_accuracy": 0.8, "bytes_total": 10}, {"test_accuracy": 0.8, "bytes_total": 11},
                         ["test_accuracy", "bytes_total", "absent"])
    assert [(r["column"], r["same"]) for r in rows] == [
        ("test_accuracy", True), ("bytes_total", False), ("absent", True)]
    table = rerun.markdown({"machine": {"date": "d", "cpu": "c", "cores": 2, "kernels": "k", "torch": "t"},
                            "runs": [{"task": "t", "variant": "v", "seed": 0, "committed_in": "abc", "columns": rows}]})
    assert "| t | v | 0 | abc | bytes_total | 10 | 11 | no |" in table.splitlines()


@pytest.mark.slow
def test_the_committed_nfedgnn_cora_run_re_runs(rerun, data_root):
    """The committed Figure 4 run sends exactly the committed bytes and scores within a point of its
    committed accuracy (to the bit on the CPU that made it; other CPUs round some sums differently)."""
    row = rerun.rerun("nfedgnn-fig4-gcn", "cora nfedgnn", 0)
    values = {c["column"]: c for c in row["columns"]}
    assert values["bytes_total"]["same"] and values["upload_mib"]["same"]
    for column in ("test_accuracy", "final_test_accuracy", "best_val_accuracy"):
        assert values[column]["rerun"] == pytest.approx(values[column]["committed"], abs=0.01), column
    with pytest.raises(Exception, match="holds no run"):
        rerun.rerun("nfedgnn-fig4-gcn", "cora nfedgnn", 99)
