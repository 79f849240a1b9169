"""Where a bench task's runs execute: one after another in this process, at most N at once in worker
processes, or as Ray tasks on a cluster.

Every run writes its own folder exactly as it would alone (a Ray task writes a temporary folder whose
files travel back to the driver, so the cluster's machines need not share a filesystem); the task
aggregates its tables once every run is back, so where the runs went changes no number.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import yaml

from ..config import RunConfig
from ..errors import ConfigError, FedglError, RunFailed
from ..progress import RunProgress
from ..results import CONFIG, FINISHED, SUMMARY, write_json
from ..search import run

EXECUTORS = ("processes", "ray")


@dataclass
class RunJob:
    """One run of a task: its config and the folder it leaves; ``compute`` makes its summary without
    training (``BenchTask.compute``)."""

    variant: str
    seed: int
    cfg: RunConfig
    folder: Path
    compute: Callable[[RunConfig], dict[str, Any]] | None = None

    @property
    def name(self) -> str:
        return f"{self.variant} seed {self.seed}"


@dataclass
class Outcome:
    """What a run gives back: its summary and the CPU seconds it took, or the one-line reason it failed."""

    summary: dict[str, Any] | None = None
    cpu_s: float = 0.0
    error: str | None = None
    files: dict[str, bytes] | None = None  # the run folder's files, from a Ray task


def computed_summary(compute: Callable[[RunConfig], dict[str, Any]], cfg: RunConfig, folder: Path) -> dict[str, Any]:
    """``compute``'s summary, left in ``folder`` as a finished run leaves it (config and summary), so it
    is reused the same way."""
    summary = compute(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    write_json(folder / SUMMARY, summary)
    (folder / FINISHED).write_text("computed\n")
    return summary


def execute(job: RunJob) -> Outcome:
    """Run (or compute) one job in this process; its CPU time is this process's during the run, kept in
    the summary (``cpu_s``) so a table's cost can be read from its runs, reused ones too."""
    start = time.process_time()
    if job.compute is None:
        summary = run(job.cfg, job.folder).summary
    else:
        summary = computed_summary(job.compute, job.cfg, job.folder)
    summary["cpu_s"] = time.process_time() - start
    write_json(job.folder / SUMMARY, summary)
    return Outcome(summary, summary["cpu_s"])


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    message = text[0] if text else ""
    return message if isinstance(err, FedglError) else f"{type(err).__name__}: {message}".rstrip(": ")


def _isolated(job: RunJob) -> Outcome:
    """``execute`` in a worker: one torch thread unless the config asks for more (so N workers use N
    cores), and a failure comes back as one line instead of ending the task."""
    import torch

    torch.set_num_threads(job.cfg.threads or 1)
    try:
        return execute(job)
    except Exception as err:  # every failure is reported by the parent, naming the run
        return Outcome(error=_one_line(err))


def _in_task(job: RunJob) -> Outcome:
    """``_isolated`` inside a Ray task: the run writes a temporary folder whose files go back with it."""
    with tempfile.TemporaryDirectory(prefix="fedgl-run-") as temporary:
        folder = Path(temporary)
        outcome = _isolated(replace(job, folder=folder))
        outcome.files = {path.relative_to(folder).as_posix(): path.read_bytes()
                         for path in sorted(folder.rglob("*")) if path.is_file()}
    return outcome


def _unpack(files: dict[str, bytes], folder: Path) -> None:
    """A run's files written where the task keeps them; the ``finished`` marker last, so an interrupted
    write never looks like a finished run."""
    for name in sorted(files, key=lambda name: name == FINISHED):
        path = folder / name
        if ".." in Path(name).parts or Path(name).is_absolute():
            raise RunFailed(f"a Ray task returned a file outside its run folder: {name}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[name])


class _Board:
    """The task's one progress display (runs done of all runs) and a line for each failed run."""

    def __init__(self, title: str, total: int, done: int):
        self.progress = RunProgress(title, total, done, unit="run")
        self.done = done
        self.failed: list[str] = []

    def record(self, job: RunJob, outcome: Outcome) -> None:
        self.done += 1
        if outcome.error is not None:
            self.failed.append(job.name)
            print(f"fedgl: bench: {job.name} failed: {outcome.error}", file=sys.stderr, flush=True)
        self.progress.update(self.done, None)


def _ignore_interrupts() -> None:
    """A worker leaves Ctrl-C to the parent, which ends every worker at once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _in_processes(jobs: list[RunJob], workers: int, board: _Board) -> list[Outcome]:
    outcomes: list[Outcome] = [Outcome() for _ in jobs]
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_ignore_interrupts)
    try:
        futures = {pool.submit(_isolated, job): i for i, job in enumerate(jobs)}
        for future in as_completed(futures):
            i, err = futures[future], future.exception()  # err: the worker died or the job did not pickle
            outcomes[i] = Outcome(error=_one_line(err)) if err else future.result()
            board.record(jobs[i], outcomes[i])
    except BaseException:  # Ctrl-C: nothing new starts and the running workers end now
        started = list((pool._processes or {}).values())  # terminate_workers() from Python 3.14
        pool.shutdown(wait=False, cancel_futures=True)
        for process in started:
            process.terminate()
        raise
    pool.shutdown()
    return outcomes


def _connect(cluster: str | None) -> tuple[Any, bool]:
    """Ray as the runs' executor: the session already open in this process, the cluster at ``cluster``,
    or a new local instance on loopback, as the Ray backend starts it; True when this call opened it."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("--executor ray needs the ray package: pip install 'fedgl[ray]'") from exc
    from ..comm.ray_transport import init_ray

    return ray, init_ray(ray, cluster, 30.0)


def _on_ray(jobs: list[RunJob], limit: int, cluster: str | None, board: _Board) -> list[Outcome]:
    ray, opened = _connect(cluster)
    task = ray.remote(num_cpus=1, max_retries=0)(_in_task)
    outcomes: list[Outcome] = [Outcome() for _ in jobs]
    waiting, running = list(range(len(jobs))), {}
    try:
        while waiting or running:
            while waiting and len(running) < limit:
                i = waiting.pop(0)
                running[task.remote(jobs[i])] = i
            (ref,), _ = ray.wait(list(running), num_returns=1)
            i = running.pop(ref)
            try:
                outcomes[i] = ray.get(ref)
            except ray.exceptions.RayError as err:  # the task's worker or node was lost
                outcomes[i] = Outcome(error=_one_line(err))
            if outcomes[i].files is not None:
                _unpack(outcomes[i].files, jobs[i].folder)
                outcomes[i].files = None
            board.record(jobs[i], outcomes[i])
    except BaseException:
        for ref in running:
            ray.cancel(ref, force=True)
        raise
    finally:
        if opened:
            ray.shutdown()
    return outcomes


def run_jobs(jobs: list[RunJob], *, title: str, total: int, workers: int, executor: str,
             cluster: str | None = None) -> list[Outcome]:
    """Every job at most ``workers`` at a time in worker processes or as Ray tasks, under one progress
    display counting ``total`` runs (those reused before count as done). A failed run is named on one
    line while the others finish; then ``RunFailed`` says how many failed."""
    board = _Board(title, total, total - len(jobs))
    with board.progress:
        if executor == "ray":
            outcomes = _on_ray(jobs, workers, cluster, board)
        else:
            outcomes = _in_processes(jobs, workers, board)
    if board.failed:
        raise RunFailed(f"{len(board.failed)} of {len(jobs)} runs failed ({', '.join(board.failed)}); the "
                        f"others finished and are reused when the task runs again")
    return outcomes
