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


def test_a_zero_in_prose_stands_only_for_zero() -> None:
    """0.0 shown for 0.003 would also pass an expression off by a factor of a thousand."""
    assert docs.matches("0.0", 0.0) and docs.matches("0.00", -0.0)
    assert not docs.matches("0.0", 0.003) and not docs.matches("0", 0.4)
    assert docs.matches("0.4", 0.43) and not docs.matches("0.4", 0.46)


def test_a_number_may_come_from_the_performance_suite(tmp_path: Path) -> None:
    perf = tmp_path / "benchmarks" / "results" / "perf.json"
    perf.parent.mkdir(parents=True)
    perf.write_text(json.dumps({"measures": [{"name": "round", "value": 43.45, "target": "<= 10"}]}))
    doc = tmp_path / "README.md"
    doc.write_text("a round takes 43.4<!-- = [perf|round|value] --> ms against 10<!-- = [perf|round|target] -->\n")
    assert docs.stale(tmp_path) == []
    doc.write_text("a round takes 40<!-- = [perf|round|value] --> ms\n")
    assert docs.stale(tmp_path) == ["README.md: line 1: 40 is not [perf|round|value] = 43.45"]


# Committed results whose task has changed since they ran, and why; the re-run that lands takes its entry out.
PENDING_RERUN: dict[str, str] = {}  # task: why its committed table no longer matches its definition


def test_every_committed_table_is_what_its_task_renders_from_its_results() -> None:
    drifting = {line.split("/")[0].split(":")[0] for line in docs.table_drift()}
    assert drifting == set(PENDING_RERUN), docs.table_drift()


def test_a_table_edited_by_hand_or_a_task_changed_since_its_run_is_caught(tmp_path: Path) -> None:
    source = docs.ROOT / "benchmarks" / "results" / "glasu-table3"
    folder = tmp_path / "benchmarks" / "results" / "glasu-table3"
    folder.mkdir(parents=True)
    for name in ("results.json", "table.json", "table.md"):
        (folder / name).write_text((source / name).read_text())
    assert docs.table_drift(tmp_path) == []
    (folder / "table.md").write_text((source / "table.md").read_text().replace("±", "+-", 1))
    assert docs.table_drift(tmp_path) == ["glasu-table3/table.md differs from its task's rendering of results.json"]
    (folder / "table.md").write_text((source / "table.md").read_text())
    runs = json.loads((source / "results.json").read_text())
    (folder / "results.json").write_text(json.dumps([{**r, "test_accuracy": 0.5} for r in runs]))
    assert docs.table_drift(tmp_path) == ["glasu-table3/table.md differs from its task's rendering of results.json",
                                          "glasu-table3/table.json differs from its task's rows of results.json"]
    (folder / "results.json").write_text(json.dumps([{**r, "variant": "K=3"} for r in runs]))
    assert docs.table_drift(tmp_path) == ["glasu-table3: variants K=3 are no longer in glasu-table3"]



def test_every_committed_seed_is_one_its_task_runs() -> None:
    assert docs.seed_excess() == []


def test_a_committed_seed_the_task_does_not_run_is_caught(tmp_path: Path) -> None:
    source = docs.ROOT / "benchmarks" / "results" / "glasu-table3"
    folder = tmp_path / "benchmarks" / "results" / "glasu-table3"
    folder.mkdir(parents=True)
    (folder / "table.json").write_text((source / "table.json").read_text())
    runs = json.loads((source / "results.json").read_text())
    (folder / "results.json").write_text(json.dumps(runs))
    assert docs.seed_excess(tmp_path) == []
    (folder / "results.json").write_text(json.dumps([r for r in runs if r["seed"] != 1] + [{**runs[0], "seed": 3}]))
    said = "glasu-table3: seed 3 is committed, and glasu-table3 runs seeds 0-2 (its seeds = 3)"
    assert docs.seed_excess(tmp_path) == [said]


def test_no_result_number_in_the_docs_lacks_its_source() -> None:
    assert docs.unmarked() == []


def test_an_unmarked_copy_of_a_result_is_caught() -> None:
    marked = "FedPNS reaches 94.52<!-- = [fedaas-baselines-cs|FedPNS iid|final_test_accuracy] -->% on CS.\n"
    assert docs.unmarked_numbers(marked) == []
    assert docs.unmarked_numbers("FedPNS reaches 94.52% on CS.\n") == ["line 1: 94.52 has no source marker"]
    assert docs.unmarked_numbers("x\nFedAAS: 95.3 %, 0.80 of the bytes\n") == [
        "line 2: 95.3 has no source marker", "line 2: 0.80 has no source marker"]
    assert docs.unmarked_numbers("a gap of -3.72 points\n") == ["line 1: 3.72 has no source marker"]
    assert docs.unmarked_numbers("seeds at 93.94, 94.00 and 92.85\n") == [
        f"line 1: {n} has no source marker" for n in ("93.94", "94.00", "92.85")]


def test_settings_versions_quoted_paper_numbers_tables_and_code_are_not_results() -> None:
    text = ("Python 3.11, Ray 2.52, flwr (1.42 or later); Adam 0.01, `lr` (0.001), lr 0.01 and 0.001, σ = 0.01,\n"
            "the paper's 94.88<!-- paper -->% and 5.12<!-- paper -->; `fedgl run --set train.lr=0.005`\n"
            "<!-- table: benchmarks/results/t/table.md -->\n| a | 81.23 |\n<!-- /table -->\n"
            "```\nacc 77.51\n```\n<!-- 12.34 in a comment -->\n62.8 and 1.5 are short, 3 % an integer\n")
    assert docs.unmarked_numbers(text) == []
    assert docs.unmarked_numbers("lr 0.01 reaches 81.23\n") == ["line 1: 81.23 has no source marker"]


def test_a_paper_marker_needs_its_number() -> None:
    assert docs.stale_values("the paper's 94.88<!-- paper -->%\n") == []
    assert docs.stale_values("the paper's <!-- paper -->\n") == ["line 1: a paper marker right after no number"]


def test_a_number_may_come_from_one_seed_a_seed_count_a_single_run_or_a_task_s_extra_table(tmp_path: Path) -> None:
    results = tmp_path / "benchmarks" / "results"
    (results / "t").mkdir(parents=True)
    rows = [{"variant": "a", "test_accuracy": {"mean": 0.8, "std": 0.01, "paper": None}}]
    (results / "t" / "table.json").write_text(json.dumps({"task": "t", "rows": rows}))
    (results / "t" / "results.json").write_text(json.dumps(
        [{"variant": "a", "seed": s, "test_accuracy": v} for s, v in ((0, 0.7912), (1, 0.8088))]))
    (results / "t" / "savings.md").write_text("| variant | baseline | seeds | saving |\n|---|---|---|---|\n"
                                              "| A | B | 3 | 86.02 |\n| A code | B | 3 | 89.43 |\n")
    (results / "run").mkdir()
    (results / "run" / "summary.json").write_text(json.dumps({"final_test_accuracy": 0.9142, "rounds": 50}))
    (results / "run" / "metrics.jsonl").write_text('{"round": 50, "train_loss": 0.0605, "tau": NaN}\n')
    doc = tmp_path / "README.md"
    doc.write_text("79.12<!-- = [t|a|test_accuracy seed 0] --> and 80.88<!-- = [t|a|test_accuracy seed 1] -->; "
                   "86.02<!-- = [t/savings.md|A / B|saving] -->, 89.43<!-- = [t/savings.md|A code / B|saving] -->; "
                   "91.42<!-- = [run|summary|final_test_accuracy] --> with loss "
                   "0.06<!-- = [run|round 50|train_loss] --> (2<!-- = [t|a|seeds] --> seeds)\n")
    assert docs.stale(tmp_path) == []
    doc.write_text("1<!-- = [t|a|test_accuracy seed 2] --> 2<!-- = [u/savings.md|A / B|saving] --> "
                   "(3<!-- = [t|a|seeds] --> seeds, 1<!-- = [t|b|seeds] --> seed)\n")
    assert docs.stale(tmp_path) == [
        "README.md: line 1: 1: t has no run of 'a' with seed 2 and a 'test_accuracy'",
        "README.md: line 1: 2: benchmarks/results/u/savings.md is not committed",
        "README.md: line 1: 3 is not [t|a|seeds] = 2",
        "README.md: line 1: 1: t has no run of 'b'"]
    doc.write_text("3<!-- = [t/savings.md|A / B|seeds] -->\n")  # an extra table's own column, not a run count
    assert docs.stale(tmp_path) == []
