"""Documented tables equal the committed bench results they cite (fedgl.bench.docs)."""

from __future__ import annotations

import json
from pathlib import Path

from fedgl.bench import docs


def test_every_documented_table_matches_its_committed_result() -> None:
    assert docs.stale() == []


def test_a_changed_number_is_caught(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    result = tmp_path / "benchmarks" / "results" / "t" / "table.md"
    result.parent.mkdir(parents=True)
    result.write_text("# t\n\n| variant | acc |\n|---|---|\n| a | 81.00 |\n")
    doc = tmp_path / "docs" / "p.md"
    doc.write_text("text\n<!-- table: benchmarks/results/t/table.md -->\n| variant | acc |\n|---|---|\n"
                   "| a | 81.00 |\n<!-- /table -->\nmore\n")
    assert docs.stale(tmp_path) == []
    result.write_text(result.read_text().replace("81.00", "79.50"))
    assert docs.stale(tmp_path) == ["p.md: the table citing benchmarks/results/t/table.md differs from it"]
    assert docs.sync(tmp_path) == [doc]
    assert "79.50" in doc.read_text() and docs.stale(tmp_path) == []
    result.unlink()
    assert docs.stale(tmp_path) == ["p.md: cites benchmarks/results/t/table.md, which is not committed"]


def test_a_marker_may_keep_some_columns_and_rows(tmp_path: Path) -> None:
    result = tmp_path / "benchmarks" / "results" / "t" / "table.md"
    result.parent.mkdir(parents=True)
    result.write_text("| variant | acc | acc (paper) | bytes |\n|---|---|---|---|\n| cora a | 81.00 | 80.1 | 3 MB |\n"
                      "| pubmed a | 77.00 | 79.0 | 9 MB |\n")
    doc = tmp_path / "README.md"
    doc.write_text("<!-- table: benchmarks/results/t/table.md | variant; acc (paper); acc | rows: cora -->\n"
                   "<!-- /table -->\n")
    docs.sync(tmp_path)
    assert docs.table_lines(doc.read_text()) == ["| variant | acc (paper) | acc |", "|---|---|---|",
                                                 "| cora a | 80.1 | 81.00 |"]
    assert docs.stale(tmp_path) == []
    doc.write_text(doc.read_text().replace("; acc |", "; accuracy |"))
    assert docs.stale(tmp_path) == ["README.md: the table citing benchmarks/results/t/table.md: no column accuracy"]
    doc.write_text(doc.read_text().replace("; accuracy |", "; acc |").replace("rows: cora", "rows: citeseer"))
    assert docs.stale(tmp_path) == ["README.md: the table citing benchmarks/results/t/table.md: no row whose first "
                                    "cell contains 'citeseer'"]


def test_a_number_in_prose_equals_its_marked_source(tmp_path: Path) -> None:
    result = tmp_path / "benchmarks" / "results" / "t" / "table.json"
    result.parent.mkdir(parents=True)
    rows = [{"variant": "a", "test_accuracy": {"mean": 0.8123, "std": 0.004, "paper": 80.1},
             "bytes_total": {"mean": 3.2e6, "std": 0.0, "paper": None}},
            {"variant": "b", "test_accuracy": {"mean": 0.7751, "std": 0.01, "paper": None},
             "bytes_total": {"mean": 8e6, "std": 0.0, "paper": None}}]
    result.write_text(json.dumps({"task": "t", "rows": rows}))
    doc = tmp_path / "README.md"
    doc.write_text("a reaches 81.23<!-- = [t|a|test_accuracy] -->% (81.2<!-- = [t|a|test_accuracy] --> rounded; "
                   "paper 80.1<!-- = [t|a|test_accuracy (paper)] -->, std 0.40<!-- = [t|a|test_accuracy std] -->),\n"
                   "3.7<!-- = [t|a|test_accuracy] - [t|b|test_accuracy] --> points above b with "
                   "2.5<!-- = [t|b|bytes_total] / [t|a|bytes_total] -->x fewer MB, at most "
                   "8<!-- = max([t|a|bytes_total], [t|b|bytes_total]) --> MB; 77.51<!-- = [t|b|test_accuracy] -->-"
                   "81.23<!-- = [t|a|test_accuracy] -->, -3.72<!-- = [t|b|test_accuracy] - [t|a|test_accuracy] -->\n")
    assert docs.stale(tmp_path) == []
    rows[0]["test_accuracy"]["mean"] = 0.80
    result.write_text(json.dumps({"task": "t", "rows": rows}))
    assert docs.stale(tmp_path) == [
        "README.md: line 1: 81.23 is not [t|a|test_accuracy] = 80",
        "README.md: line 1: 81.2 is not [t|a|test_accuracy] = 80",
        "README.md: line 2: 3.7 is not [t|a|test_accuracy] - [t|b|test_accuracy] = 2.49",
        "README.md: line 2: 81.23 is not [t|a|test_accuracy] = 80",
        "README.md: line 2: -3.72 is not [t|b|test_accuracy] - [t|a|test_accuracy] = -2.49"]
    doc.write_text("x 1<!-- = [t|c|test_accuracy] --> y 2<!-- = [u|a|test_accuracy] --> "
                   "z 3<!-- = __import__('os').getcwd() --> w 4<!-- = _5 --> a%<!-- = 1 -->\n")
    assert docs.stale(tmp_path) == ["README.md: line 1: a marker right after no number (<!-- = 1 -->)",
                                    "README.md: line 1: 1: t has no variant 'c'",
                                    "README.md: line 1: 2: benchmarks/results/u/table.json is not committed",
                                    "README.md: line 1: 3: cannot read \"__import__('os').getcwd()\" in "
                                    "\"__import__('os').getcwd()\"",
                                    "README.md: line 1: 4: list index out of range"]


def test_a_number_may_come_from_the_performance_suite(tmp_path: Path) -> None:
    perf = tmp_path / "benchmarks" / "results" / "perf.json"
    perf.parent.mkdir(parents=True)
    perf.write_text(json.dumps({"measures": [{"name": "round", "value": 43.45, "target": "<= 10"}]}))
    doc = tmp_path / "README.md"
    doc.write_text("a round takes 43.4<!-- = [perf|round|value] --> ms against 10<!-- = [perf|round|target] -->\n")
    assert docs.stale(tmp_path) == []
    doc.write_text("a round takes 40<!-- = [perf|round|value] --> ms\n")
    assert docs.stale(tmp_path) == ["README.md: line 1: 40 is not [perf|round|value] = 43.45"]
