"""The ratio of a round over the same round on the code before the last speed-ups (``BEFORE``): that
code's ``src/`` is taken with ``git archive`` and the group re-run there by ``perf.py`` in a child, first,
so one pass of the suite times both on the same machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from perf_harness import ROOT, Measure, Place, failed, fmt

PERF = Path(__file__).with_name("perf.py")

BEFORE = "77b6c0b"  # main before the second pass on issue #34's speed (CNFGNN's handed-over uploads)


def before(group: str, quick: bool, place: Place) -> list[dict]:
    """The group's rows measured again on the code of ``BEFORE``, in a child process (none in that child)."""
    if os.environ.get("FEDGL_PERF_BEFORE"):
        return []
    with tempfile.TemporaryDirectory() as tmp:
        tree = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE, "src"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=tree.stdout, check=True)
        argv = [sys.executable, str(PERF), "--child", group, "--device", place.name] + (["--quick"] if quick else [])
        env = os.environ | {"PYTHONPATH": f"{tmp}/src", "FEDGL_PERF_BEFORE": "1"}
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def earlier_code(group: str, quick: bool, place: Place) -> list[dict] | Exception:
    """``before``'s rows, or what stopped it (the group's own measures are taken either way)."""
    try:
        return before(group, quick, place)
    except Exception as err:
        return err


def over_before(group: str, old: list[dict] | Exception, measures: list[Measure], target: str) -> list[Measure]:
    """``measures`` and the round's seconds over the same measure on the code of ``BEFORE`` (``old``, timed
    first in a child; the note adds both ratios over plain PyG, which a shared machine's load slows alike)."""
    name = measures[0].name
    if isinstance(old, list) and not old:  # the child on the code before
        return measures
    rows = {row["name"]: row for row in old} if isinstance(old, list) else {}
    then, now = rows.get(name, {}).get("value"), measures[0].value
    if then is None or now is None:
        why = old if isinstance(old, Exception) else RuntimeError(rows.get(name, {}).get("note") or measures[0].note)
        return measures + [failed(group, f"{name}, over the code before", "x", target, why)]
    pyg = f"{name}, over plain PyG"
    note = (f"{now:.2f} s against {then:.2f} s per round on {BEFORE} (timed first, at load "
            f"{rows[name]['load_average']}); over plain PyG {fmt(measures[1].value)} against {fmt(rows[pyg]['value'])}")
    return measures + [Measure(group, f"{name}, over the code before", now / then, "x", target, note)]
