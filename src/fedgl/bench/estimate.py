"""What a task's pending runs will take before any starts (``fedgl bench TASK --plan``): each run's wall
time estimated from the runs of its variant already listed in the folder's ``results.json`` that computed
what it will (a committed table, typically at fewer seeds), and the whole as the executor would lay them out
over its workers."""

from __future__ import annotations

import heapq
import statistics

from rich.table import Table

from .executor import RunJob


def makespan(seconds: list[float], workers: int) -> float:
    """How long ``seconds`` of runs last when each starts, in order, on the first of ``workers`` to be free
    (how the worker pool and the Ray executor hand them out)."""
    free = [0.0] * max(workers, 1)
    for s in seconds:
        heapq.heapreplace(free, free[0] + s)
    return max(free)


def plan_table(name: str, jobs: list[RunJob], walls: list[list[float]], reused: int,
               workers: int) -> tuple[Table, str]:
    """The runs to make, each estimated as the mean of the wall seconds ``walls`` gives it (none: unknown),
    and a line summing them up."""
    guesses = [statistics.mean(w) if w else None for w in walls]
    table = Table(title=f"{name}: {len(jobs)} runs to make, {reused} reused")
    table.add_column("run")
    table.add_column("estimate (min)", justify="right")
    for job, guess in zip(jobs, guesses):
        table.add_row(job.name, "?" if guess is None else f"{guess / 60:.0f}")
    known = [g for g in guesses if g is not None]
    if not jobs:
        return table, f"{name}: nothing to run"
    if not known:
        return table, f"{name}: no run in results.json computed what these will, to estimate them from"
    unknown = f"; {len(jobs) - len(known)} runs without an estimate left out" if len(known) < len(jobs) else ""
    return table, (f"{name}: about {sum(known) / 60:.0f} minutes of runs, about {makespan(known, workers) / 60:.0f} "
                   f"minutes of wall time with {workers} at once (each estimate is the mean wall time of the runs in "
                   f"results.json of the same computation, on whatever machine and load they had){unknown}")
