"""How long the default test suite (README's test command) takes on this machine, with the shared
datasets: runs it once and writes benchmarks/results/test-suite/ (table.json, table.md), which the
README's test section cites, with the load average it ran under (other work on the machine
lengthens it). The tests use one torch thread each.

usage: FEDGL_DATA_ROOT=... python benchmarks/suite_time.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "test-suite"


def main() -> int:
    if not os.environ.get("FEDGL_DATA_ROOT"):
        print("set FEDGL_DATA_ROOT: the suite is timed with its real-data tests", file=sys.stderr)
        return 2
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=40"],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    print(done.stdout[done.stdout.find("slowest"):])
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-2000:], sep="\n", file=sys.stderr)
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|deselected|xfailed)", last)}
    row = {"variant": "default suite", "wall_min": f"{wall / 60:.1f}", "cores": str(os.cpu_count()),
           "passed": str(counts.get("passed", 0)), "failed": str(counts.get("failed", 0)),
           "skipped": str(counts.get("skipped", 0)),
           "xfailed": str(counts.get("xfailed", 0)), "deselected (slow)": str(counts.get("deselected", 0)),
           "load average": f"{os.getloadavg()[1]:.1f}", "measured": time.strftime("%Y-%m-%d")}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "table.json").write_text(json.dumps([row], indent=1) + "\n")
    header = list(row)
    (OUT / "table.md").write_text("\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                                             "| " + " | ".join(row.values()) + " |"]) + "\n")
    return 1 if done.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
