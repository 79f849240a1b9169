"""The ratio of a round over the same round on the code before the last speed-ups (``BEFORE``).

Both codes time the group's run (``perf_settings``) in children of their own, one right after the other
(the code before first), ``PAIRS`` times in turn; the measure is the median of the pairs' ratios. A
machine whose load drifts over the pass then slows both sides of most ratios alike, where one timing of
each, minutes apart, measured the drift as much as the code. The code before is its ``src/`` from
``git archive``.

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

BEFORE = "77b6c0b"  # main before the second pass on issue #34's speed (CNFGNN's handed-over uploads)
PAIRS = 3


def round_seconds(group: str, quick: bool, place: Place, src: Path) -> float:
    """Median seconds per round of the group's run on the fedgl in ``src``, timed in a child."""
    argv = [sys.executable, __file__, group, "--device", place.name] + (["--quick"] if quick else [])
    proc = subprocess.run(argv, capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(src)})
    if proc.returncode:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1]))


def paired_rounds(group: str, quick: bool, place: Place) -> list[tuple[float, float]] | Exception:
    """(code before, this code) seconds per round, ``PAIRS`` times in turn (once with ``quick``); or what
    stopped them (the group's own measures are taken either way)."""
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tree = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE, "src"], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", tmp], input=tree.stdout, check=True)
            return [(round_seconds(group, quick, place, Path(tmp) / "src"), round_seconds(group, quick, place,
                                                                                          ROOT / "src"))
                    for _ in range(1 if quick else PAIRS)]
    except Exception as err:
        return err


def over_before(group: str, pairs: list[tuple[float, float]] | Exception, measures: list[Measure],
                target: str) -> list[Measure]:
    """``measures`` and the median ratio of this code's round over the code before's, pair by pair."""
    name = f"{measures[0].name}, over the code before"
    if isinstance(pairs, Exception):
        return measures + [failed(group, name, "x", target, pairs)]
    shown = ", ".join(f"{now:.2f} against {then:.2f}" for then, now in pairs)
    count = f"median of {len(pairs)} paired ratios, each" if len(pairs) > 1 else "one paired ratio,"
    note = (f"{count} this code's round over the same round on {BEFORE}, timed one right after the other in "
            f"children of their own (the code before first): {shown} s per round")
    return measures + [Measure(group, name, statistics.median(now / then for then, now in pairs), "x", target, note)]


def main(argv: list[str] | None = None) -> None:
    """A child: the group's run on the fedgl of this interpreter's path, its median seconds per round
    after one warm-up round, printed as one JSON line."""
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
        seconds = []
        for _ in range(setting.rounds):
            start = time.perf_counter()
            run.step()
            seconds.append(time.perf_counter() - start)
    finally:
        run.close()
    print(json.dumps(statistics.median(seconds)))


if __name__ == "__main__":
    main()
