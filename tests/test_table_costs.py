"""benchmarks/table_costs.py: what each paper's main table costs, read from its committed runs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "table_costs.py"


@pytest.fixture(scope="module")
def costs():
    spec = importlib.util.spec_from_file_location("table_costs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_table_is_what_the_committed_runs_give(costs):
    assert costs.main(["--check"]) == 0


def test_cpu_hours_are_summed_only_when_every_run_recorded_them(costs):
    runs = [{"variant": "cora A", "wall_time_s": 3600.0, "cpu_s": 1800.0},
            {"variant": "cora B", "wall_time_s": 7200.0, "cpu_s": 1800.0},
            {"variant": "pubmed A", "wall_time_s": 3600.0}]
    assert costs._hours(runs, "cora ") == (2, 3.0, 1.0)
    assert costs._hours(runs, "") == (3, 4.0, None)


def test_each_row_names_a_committed_task(costs):
    table = json.loads((costs.OUT / "table.json").read_text())
    assert {row["task"] for row in table} <= {task for _, task, _ in costs.TABLES}
    assert all((costs.RESULTS / row["task"] / "results.json").exists() for row in table)
