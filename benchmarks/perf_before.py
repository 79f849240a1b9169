"""The ratio of a round over the same round on the code before the speed work (``BEFORE``).

Both codes time the group's run (``perf_settings``) in children of their own, one right after the other
(the code before first), ``PAIRS`` times in turn; the measure is the median of the pairs' ratios of CPU
seconds per round (a run computes on one thread, so its CPU time is its work; wall time on a shared machine
adds the time it waits for a core, which the note shows beside). One timing of each, minutes apart,
measured the load's drift as much as the code. The code before is its ``src/`` from ``git archive``.

    python benchmarks/perf_before.py GROUP [--device cpu] [--quick]   # a child: seconds per round
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from perf_harness import ROOT, FedglRun, Measure, Place, failed

# the commit issue #34's speed work started from (as table_costs.py's): the "today's" its targets are
# ratios of. A 2-round FedAAS run of examples/fedaas-cs.yaml there and now: the same ledger and metrics.
BEFORE = "185a1e5"
PAIRS = 3


def round_seconds(group: str, quick: bool, place: Place, src: Path) -> dict[str, float]:
    """Median CPU and wall seconds per round of the group's run on the fedgl in ``src``, timed in a child."""
    argv = [sys.executable, __file__, group, "--device", place.name] + (["--quick"] if quick else [])
    proc = subprocess.run(argv, capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(src)})
    if proc.returncode:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def paired_rounds(group: str, quick: bool, place: Place) -> list[tuple[dict, dict]] | Exception:
    """(code before, this code) seconds per round (``round_seconds``), ``PAIRS`` times in turn (once with
    ``quick``); or what stopped them (the group's own measures are taken either way)."""
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tree = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE, "src"], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", tmp], input=tree.stdout, check=True)
            return [(round_seconds(group, quick, place, Path(tmp) / "src"), round_seconds(group, quick, place,
                                                                                          ROOT / "src"))
                    for _ in range(1 if quick else PAIRS)]
    except Exception as err:
        return err


def over_before(group: str, pairs: list[tuple[dict, dict]] | Exception, measures: list[Measure],
                target: str) -> list[Measure]:
    """``measures`` and the median ratio of this code's CPU seconds per round over the code before's, pair
    by pair."""
    name = f"{measures[0].name}, over the code before"
    if isinstance(pairs, Exception):
        return measures + [failed(group, name, "x", target, pairs)]
    shown = "; ".join(f"{now['cpu']:.2f} against {then['cpu']:.2f} ({now['wall']:.2f} against {then['wall']:.2f} wall)"
                      for then, now in pairs)
    count = f"median of {len(pairs)} paired ratios, each" if len(pairs) > 1 else "one paired ratio,"
    note = (f"{count} this code's CPU seconds per round over the same round's on {BEFORE}, timed one right after "
            f"the other in children of their own (the code before first): {shown} s per round")
    ratio = statistics.median(now["cpu"] / then["cpu"] for then, now in pairs)
    return measures + [Measure(group, name, ratio, "x", target, note)]


def main(argv: list[str] | None = None) -> None:
    """A child: the group's run on the fedgl of this interpreter's path, its median CPU and wall seconds
    per round after one warm-up round, printed as one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("group")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    import torch

    from perf_settings import SETTINGS

    warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
    torch.set_num_threads(1)  # as fedgl runs by default (threads: 1)
    setting = SETTINGS[args.group](Place.of(args.device), args.quick)
    run = FedglRun(setting.cfg, setting.data)
    try:
        run.step()
        cpu, wall = [], []
        for _ in range(setting.rounds):
            start, start_cpu = time.perf_counter(), time.process_time()
            run.step()
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    finally:
        run.close()
    print(json.dumps({"cpu": statistics.median(cpu), "wall": statistics.median(wall)}))


if __name__ == "__main__":
    main()
