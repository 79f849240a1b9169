"""Comparing two runs strictly, a run resumed from a checkpoint, and a run made in a fresh process.

Two runs that must be the same run (local and Ray, resumed and uninterrupted, deployed and in-process)
agree on every metric but wall time, on the ledger line by line and on every summary field but the
measured timings, to the bit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fedgl.config import build_config
from fedgl.runner import RunResult
from fedgl.search import run

METRIC_TIMES = {"wall_time_s"}
# measured, so never equal between two runs; compute_s_by_party is checked for its parties only
SUMMARY_TIMES = {"wall_time_s", "wall_ms_per_round", "compute_s_by_party"}


def _folder(result: RunResult | Path) -> Path:
    return result.out_dir if isinstance(result, RunResult) else Path(result)


def _canonical(value) -> str:
    """JSON text with sorted keys: NaN equals NaN, and 1 differs from 1.0 as it does in the file."""
    return json.dumps(value, sort_keys=True)


def _first_difference(a: dict, b: dict) -> str:
    keys = sorted(set(a) | set(b))
    diff = [k for k in keys if _canonical(a.get(k, "<missing>")) != _canonical(b.get(k, "<missing>"))]
    return ", ".join(f"{k}: {a.get(k, '<missing>')!r} != {b.get(k, '<missing>')!r}" for k in diff[:5])


def compare_runs(a: RunResult | Path, b: RunResult | Path, differ: tuple[str, ...] = ()) -> None:
    """Assert that the runs in folders ``a`` and ``b`` are the same run: every metric row equal but
    for wall time, the ledger files equal, the summaries equal but for timings (the parties that
    measured compute must be the same) and the fields named in ``differ`` (e.g. ``backend``)."""
    a, b = _folder(a), _folder(b)
    # the ledger first: where two runs part, its first differing message names the party, method and kind
    ledgers = [(p / "ledger.jsonl").read_text().splitlines() for p in (a, b)]
    for i, (x, y) in enumerate(zip(*ledgers)):
        assert x == y, f"ledger row {i}: {x} != {y}"
    assert len(ledgers[0]) == len(ledgers[1]), f"ledger rows: {len(ledgers[0])} != {len(ledgers[1])}"
    rows = [[json.loads(line) for line in (p / "metrics.jsonl").read_text().splitlines()] for p in (a, b)]
    assert [r["round"] for r in rows[0]] == [r["round"] for r in rows[1]], "evaluated rounds differ"
    for x, y in zip(*rows):
        x, y = ({k: v for k, v in r.items() if k not in METRIC_TIMES} for r in (x, y))
        assert _canonical(x) == _canonical(y), f"round {x['round']}: {_first_difference(x, y)}"
    summaries = [json.loads((p / "summary.json").read_text()) for p in (a, b)]
    parties = [sorted(s["compute_s_by_party"]) for s in summaries]
    assert parties[0] == parties[1], f"parties with measured compute: {parties[0]} != {parties[1]}"
    x, y = ({k: v for k, v in s.items() if k not in SUMMARY_TIMES and k not in differ} for s in summaries)
    assert _canonical(x) == _canonical(y), f"summary: {_first_difference(x, y)}"


def with_rounds(settings: dict, rounds: int, **top) -> dict:
    """``settings`` training for ``rounds`` rounds, with top-level keys (e.g. ``checkpoint_every``) set."""
    return {**settings, "train": {**settings.get("train", {}), "rounds": rounds}, **top}


def run_resumed(settings: dict, out: Path, stop_after: int) -> RunResult:
    """Run ``settings`` for ``stop_after`` rounds checkpointing every round, then resume the folder
    in a fresh run for the remaining rounds."""
    rounds = settings["train"]["rounds"]
    run(build_config(with_rounds(settings, stop_after, checkpoint_every=1)), out)
    return run(build_config(with_rounds(settings, rounds, checkpoint_every=1)), out, resume=True)


def run_in_fresh_process(settings: dict, out: Path) -> Path:
    """The in-process run of ``settings`` made by a new Python process, in folder ``out``: the reference
    for a backend whose driver shares the test process with a Ray instance (see test_equivalence)."""
    code = ("import json, sys\nfrom fedgl.config import build_config\nfrom fedgl.search import run\n"
            "run(build_config(json.loads(sys.argv[1])), sys.argv[2])\n")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(settings), str(out)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return out
