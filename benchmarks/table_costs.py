"""What each paper's main table costs to reproduce on this machine, read from its committed results:
writes benchmarks/results/table-costs/ (table.json, table.md), which the README's performance section
cites. Nothing is timed here: every figure is a sum over the runs the table holds.

- ``CPU-h``: the CPU time of the table's runs, each on one torch thread, so what the table needs
  whatever the parallelism: summed from the runs' own ``cpu_s`` where every run has it, else the task's
  ``cost.json`` where that invocation ran every run, else empty (results committed before either
  was recorded);
- ``run wall-h``: the runs' wall times summed, which a loaded machine lengthens, and ``before``, that
  sum over the task's results as committed at BEFORE, the commit the speed work started from (empty
  where the task had no results then): compare the two only with the load in mind;
- ``wall h, jobs``: the whole task's wall time and parallelism from its ``cost.json``.

usage: python benchmarks/table_costs.py   # --check: exit 1 if the committed table is out of date;
                                          # --record-before: read ``before`` from git again
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OUT = RESULTS / "table-costs"
BEFORE = "185a1e5"
# (paper table, bench task, variant prefix: the rows of that table within a task holding several)
TABLES = [("GLASU Table 2, Cora", "glasu-table2-cora", ""),
          ("GLASU Table 2, CiteSeer", "glasu-table2-citeseer", ""),
          ("GLASU Table 2, PubMed", "glasu-table2-pubmed", ""),
          ("FedAAS Table 2, CS: FedAAS", "fedaas-table2-cs", ""),
          ("FedAAS Table 2, CS: baselines", "fedaas-baselines-cs", ""),
          ("FedAAS Table 2, PubMed: FedAAS", "fedaas-table2-pubmed", ""),
          ("FedAAS Table 2, PubMed: baselines", "fedaas-baselines-pubmed", ""),
          ("nFedGNN Figure 4, Cora", "nfedgnn-fig4-gcn", "cora "),
          ("Swift-FedGNN Tables 1, 7, 8, CiteSeer", "swift-compare-citeseer", "")]
HEADER = ["variant", "task", "runs", "seeds", "CPU-h", "run wall-h", "before", "wall h", "jobs"]


def _hours(runs: list[dict], prefix: str) -> tuple[int, float, float | None]:
    """Runs, their wall hours summed and their CPU hours summed (None unless every run has them)."""
    own = [r for r in runs if r["variant"].startswith(prefix)]
    cpu = sum(r["cpu_s"] for r in own) / 3600 if all("cpu_s" in r for r in own) else None
    return len(own), sum(r["wall_time_s"] for r in own) / 3600, cpu


def record_before() -> dict[str, str]:
    """``before`` per table, read from git at BEFORE once and kept in ``before.json`` (a clone may not
    hold that commit)."""
    before = {}
    for label, task, prefix in TABLES:
        shown = subprocess.run(["git", "show", f"{BEFORE}:benchmarks/results/{task}/results.json"], cwd=ROOT,
                               capture_output=True, text=True)
        if not shown.returncode:
            runs, hours, _ = _hours(json.loads(shown.stdout), prefix)
            before[label] = f"{hours:.2f} ({runs} runs)"
    return before


def rows() -> list[dict[str, str]]:
    before = json.loads((OUT / "before.json").read_text())
    out = []
    for label, task, prefix in TABLES:
        folder = RESULTS / task
        if not (folder / "results.json").exists():
            continue
        runs = json.loads((folder / "results.json").read_text())
        count, hours, cpu = _hours(runs, prefix)
        cost = json.loads((folder / "cost.json").read_text()) if (folder / "cost.json").exists() else {}
        whole = not prefix and cost
        if cpu is None and whole and cost["ran"] == cost["runs"]:
            cpu = cost["cpu_s"] / 3600
        out.append({"variant": label, "task": task, "runs": str(count),
                    "seeds": str(len({r["seed"] for r in runs})), "CPU-h": "" if cpu is None else f"{cpu:.2f}",
                    "run wall-h": f"{hours:.2f}", "before": before.get(label, ""),
                    "wall h": f"{cost['wall_s'] / 3600:.2f}" if whole else "",
                    "jobs": str(cost.get("jobs", "")) if whole else ""})
    return out


def render(table: list[dict[str, str]]) -> tuple[str, str]:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row[h] for h in HEADER) + " |" for row in table]
    return json.dumps(table, indent=1) + "\n", "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if "--record-before" in argv:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "before.json").write_text(json.dumps(record_before(), indent=1) + "\n")
    as_json, as_md = render(rows())
    if "--check" in argv:
        same = (OUT / "table.json").exists() and (OUT / "table.json").read_text() == as_json
        print("table-costs is up to date" if same else "table-costs is out of date: run benchmarks/table_costs.py")
        return 0 if same else 1
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "table.json").write_text(as_json)
    (OUT / "table.md").write_text(as_md)
    print(as_md)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
