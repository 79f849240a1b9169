"""Does a committed result re-run? Trains committed bench runs afresh and compares them, number by number.

    FEDGL_DATA_ROOT=/path/to/datasets python benchmarks/rerun.py                  # the default selection
    FEDGL_DATA_ROOT=/path/to/datasets python benchmarks/rerun.py --run glasu-table2-cora "cora GLASU-4" 1
    FEDGL_DATA_ROOT=/path/to/datasets python benchmarks/rerun.py --task glasu-table2-citeseer   # every run of a task

Each selected run (task, variant label, seed) is built from its task's config as ``fedgl bench`` builds it,
trained into a temporary folder, and its summary compared with that run's row of the task's committed
``results.json``: every column the task tables, except timings (``*time*``, ``wall*``), which measure
the machine (a run a task made with ``--set`` or ``--quick`` is re-run without them). The default
selection is one quick run of each protocol family with a committed table (about 6 minutes on 2
cores). Writes ``benchmarks/results/rerun.json`` and ``rerun.md``: the machine, the commit that last
wrote each results.json, and per run and column the committed value, the re-run value and whether
they are equal to the bit.

A run that is not equal is not wrong: torch's CPU kernels (its own and MKL's) choose their code paths
by processor and round some sums differently on another CPU, and a training run can carry a last-bit
difference into its last digits.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from fedgl.errors import ConfigError, FedglError
from fedgl.tables import markdown_table
from perf import machine  # the same description of the machine as the performance suite's

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT = (
    ("glasu-table2-citeseer", "citeseer GLASU-1", 0),
    ("glasu-table2-citeseer", "citeseer StAl.", 0),
    ("nfedgnn-fig4-gcn", "cora nfedgnn", 0),
    ("swift-compare-pubmed", "Swift-FedGNN", 0),
    ("fedaas-table2-pubmed", "FedAAS iid", 0),
)


def compared_columns(columns: list[str]) -> list[str]:
    """The columns a re-run should repeat: all but the timings."""
    return [c for c in columns if "time" not in c and not c.startswith("wall")]


def compare(committed: dict[str, Any], rerun: dict[str, Any], columns: list[str]) -> list[dict[str, Any]]:
    """One row per column: both values and whether they are equal (a column neither has counts as equal)."""
    return [{"column": c, "committed": committed.get(c), "rerun": rerun.get(c),
             "same": committed.get(c) == rerun.get(c)} for c in columns]


def rerun(task_name: str, label: str, seed: int, results: Path = RESULTS) -> dict[str, Any]:
    """Train one committed run again and compare it with its committed row."""
    from fedgl.bench import get_task
    from fedgl.bench.core import variant_config
    from fedgl.search import run

    task = get_task(task_name)
    variant = next((v for v in task.variants if v.label == label), None)
    if variant is None:
        labels = ", ".join(v.label for v in task.variants)
        raise ConfigError(f"{task_name} has no variant {label!r}; its variants: {labels}")
    committed = next((r for r in committed_rows(task_name, results) if r["variant"] == label and r["seed"] == seed),
                     None)
    if committed is None:
        raise ConfigError(f"benchmarks/results/{task_name}/results.json holds no run of {label!r} with seed {seed}")
    cfg = variant_config(task, variant, seed, {})
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedgl-rerun-") as tmp:
        summary = task.compute(cfg) if task.compute else run(cfg, Path(tmp) / "run").summary
    if task.derive:
        summary |= task.derive(summary)
    columns = compare(committed, summary, compared_columns(task.columns))
    return {"task": task_name, "variant": label, "seed": seed, "seconds": round(time.perf_counter() - started, 1),
            "committed_in": last_commit(results / task_name / "results.json"),
            "identical": all(c["same"] for c in columns), "columns": columns}


def committed_rows(task_name: str, results: Path = RESULTS) -> list[dict[str, Any]]:
    """The rows of a task's committed results.json."""
    path = results / task_name / "results.json"
    if not path.exists():
        raise ConfigError(f"no committed results for {task_name!r}: {path} does not exist")
    return json.loads(path.read_text())


def last_commit(path: Path) -> str:
    """The commit that last wrote ``path`` (abbreviated hash and date); "uncommitted" when git knows none,
    "unknown" without git (an unpacked release)."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%h %ad", "--date=short", "--", str(path)], cwd=ROOT,
                             capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"
    return out or "uncommitted"


def fmt(column: str, value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and ("accuracy" in column or column.endswith(("f1", "auc"))):
        return f"{100 * value:.2f}"
    if isinstance(value, float):
        return f"{value:.6g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [f"Re-run {m['date']} on {m['cpu']} ({m['cores']} cores, {m['kernels']} kernels), torch {m['torch']}: "
             "each run trained afresh and compared with its row of the task's committed results.json (timings left "
             "out). Accuracies in %.",
             "", *markdown_table(["task", "variant", "seed", "committed in", "column", "committed", "re-run", "same"],
                                 [[r["task"], r["variant"], r["seed"], r["committed_in"], c["column"],
                                   fmt(c["column"], c["committed"]), fmt(c["column"], c["rerun"]),
                                   "yes" if c["same"] else "no"] for r in result["runs"] for c in r["columns"]])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", nargs=3, action="append", default=[], metavar=("TASK", "VARIANT", "SEED"),
                        help="re-run this committed run instead of the default selection (repeatable)")
    parser.add_argument("--task", action="append", default=[],
                        help="re-run every committed run of this task instead of the default selection (repeatable)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for rerun.json and rerun.md")
    args = parser.parse_args(argv)
    result = {"machine": machine(), "runs": []}
    try:  # an unknown task, variant or seed is one line, no traceback
        chosen = [(t, v, int(s)) for t, v, s in args.run] + [
            (task, row["variant"], row["seed"]) for task in args.task for row in committed_rows(task)]
        for task, label, seed in chosen or DEFAULT:
            row = rerun(task, label, seed)
            result["runs"].append(row)
            differing = ", ".join(c["column"] for c in row["columns"] if not c["same"])
            verdict = f"differs in {differing}" if differing else "identical"
            print(f"{task} / {label} / seed {seed}: {verdict} ({row['seconds']} s)", flush=True)
    except FedglError as err:
        raise SystemExit(str(err)) from None
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rerun.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "rerun.md").write_text(markdown(result))
    print(f"written to {args.out / 'rerun.json'} and {args.out / 'rerun.md'}")


if __name__ == "__main__":
    main()
