"""Running a benchmark task: every variant over every seed, then mean ± std beside the reference.

A task is data: a base config, variants (each a label, config overrides and the paper's numbers for
it) and the summary columns to report. Results go to ``results.json`` (every run's summary),
``table.md`` and ``table.json`` in the task's folder, with each run's own folder beneath it. A task
whose numbers need no training (e.g. partition statistics) gives ``compute``, which makes a run's
summary from its config; everything else, folders and tables included, stays the same. The runs go one
after another here or, spread over worker processes or Ray tasks, through ``executor``; ``cost.json``
records what they took.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from ..config import RunConfig, build_config, set_key
from ..config.identity import config_hashes, hash_without
from ..errors import ConfigError
from ..files import check_folder, make_folder
from ..protocols import protocol_class
from ..results import CONFIG, FINISHED, SUMMARY, load_summary, read_config, write_json
from ..tables import markdown_table
from .estimate import plan_table
from .executor import EXECUTORS, Outcome, RunJob, execute, run_jobs

DAMAGED = "delete the folder or pass --rerun"  # a run folder a crash or a hand edit damaged
COST = "cost.json"  # what the task's runs cost: CPU seconds summed over them, wall seconds of the whole task


@dataclass
class Variant:
    label: str
    overrides: dict[str, Any] = field(default_factory=dict)  # dotted keys, e.g. {"protocol.K": 2}
    reference: dict[str, float] = field(default_factory=dict)  # paper's numbers per column


@dataclass
class BenchTask:
    name: str
    description: str
    base: dict[str, Any]
    variants: list[Variant]
    columns: list[str]  # summary keys to aggregate, e.g. test_accuracy, bytes_total
    seeds: int = 3
    quick: dict[str, Any] = field(default_factory=dict)  # overrides for a fast smoke run
    derive: Callable[[dict[str, Any]], dict[str, Any]] | None = None  # extra columns from a summary
    source: str = ""  # where the reference numbers come from
    finish: Callable[[Path], None] | None = None  # e.g. draw the paper's figure from the task folder
    compute: Callable[[RunConfig], dict[str, Any]] | None = None  # a run's summary without training
    formats: dict[str, str] = field(default_factory=dict)  # format spec per column, e.g. {"num_edges": ",.0f"}
    labels: dict[str, str] = field(default_factory=dict)  # table header per column or "<column> (paper)"
    tolerance: dict[str, float] = field(default_factory=dict)  # gate: |mean - paper| <= tolerance, pass/fail


def variant_config(task: BenchTask, variant: Variant, seed: int, extra: dict[str, Any]):
    data = copy.deepcopy(task.base)
    for key, value in {**variant.overrides, **extra, "seed": seed}.items():
        set_key(data, key.split("."), copy.deepcopy(value), key)
    return build_config(data)


def aggregate(values: list[float]) -> tuple[float | None, float | None]:
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def display_scale(column: str, spec: str | None = None) -> float:
    """What a column's values are multiplied by in tables: accuracies and scores as percentages,
    bytes as MB, a column with its own format as it is."""
    if spec is None and ("accuracy" in column or column.endswith(("f1", "auc"))):
        return 100.0
    if spec is None and column.startswith("bytes"):
        return 1e-6
    return 1.0


def _cell(mean: float | None, std: float | None, column: str, spec: str | None = None) -> str:
    if mean is None:
        return "—"
    if spec is not None:
        return f"{mean:{spec}} ± {std or 0:{spec}}"
    scale = display_scale(column)
    if scale == 100.0:
        return f"{scale * mean:.2f} ± {scale * (std or 0):.2f}"
    if scale == 1e-6:
        return f"{scale * mean:.3f} ± {scale * (std or 0):.3f} MB"
    return f"{mean:.4g} ± {std or 0:.2g}"


def _ref(value: float | None, column: str, spec: str | None = None) -> str:
    if value is None:
        return ""
    if spec is not None:
        return f"{value:{spec}}"
    if "accuracy" in column:
        return f"{100 * value:.2f}" if value <= 1 else f"{value:.2f}"
    return f"{value:g}"


def select_variants(task: BenchTask, only: list[str] | None) -> list[Variant]:
    """The variants whose label contains one of ``only`` (case-insensitive); all of them without it."""
    if not only:
        return task.variants
    chosen = [v for v in task.variants if any(part.lower() in v.label.lower() for part in only)]
    if not chosen:
        labels = ", ".join(v.label for v in task.variants)
        raise ConfigError(f"no variant of {task.name} matches {', '.join(only)}; its variants: {labels}")
    return chosen


def as_saved(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config as its run behaved: a protocol option added since, whose default changed what a run
    does, declares the value runs made before it behaved as (``json_schema_extra={"earlier": ...}``) and
    takes that value instead of today's default, so such runs are not reused for today's."""
    section = saved.get("protocol")
    if not isinstance(section, dict):
        return saved
    for key, value in earlier_values(section.get("name", "")).items():
        section.setdefault(key, value)
    return saved


def earlier_values(protocol: str) -> dict[str, Any]:
    """The options of ``protocol`` whose arrival changed what runs do, each with the value runs made before
    it behaved as (``json_schema_extra={"earlier": ...}``); none for an unknown protocol."""
    try:
        fields = protocol_class(protocol).Options.model_fields
    except ConfigError:
        return {}
    return {key: info.json_schema_extra["earlier"] for key, info in fields.items()
            if isinstance(info.json_schema_extra, dict) and "earlier" in info.json_schema_extra}


def finished_summary(folder: Path, cfg: RunConfig) -> dict[str, Any] | None:
    """The summary of an earlier, finished run in ``folder`` made with exactly this config, if there is
    one (an interrupted run's summary says ``"finished": false`` and has no ``finished`` marker)."""
    summary, config = folder / SUMMARY, folder / CONFIG
    if not (summary.exists() and config.exists()):
        return None
    saved = read_config(folder, damaged=DAMAGED)  # a damaged file is refused, one another fedgl wrote is not reused
    try:  # both read through today's config model: options added since then take their defaults
        earlier = build_config(as_saved(saved)).model_dump(mode="json")
    except ConfigError:
        return None
    if earlier != build_config(cfg.model_dump(mode="json")).model_dump(mode="json"):
        return None
    found = load_summary(folder, damaged=DAMAGED)
    if not (folder / FINISHED).exists() and found.get("finished", True) is not True:
        return None
    return found


def committed_summaries(out: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """The runs an earlier invocation wrote to ``out``'s ``results.json``, by (variant, seed): a committed
    results folder keeps them without the runs' own folders."""
    path = out / "results.json"
    if not path.is_file():
        return {}
    try:
        rows = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path} is not valid JSON ({err}); move it away to run the task afresh") from None
    if not isinstance(rows, list):  # a string or a mapping would be iterated as if it listed runs
        held = {dict: "an object", str: "a string", bool: "a boolean", type(None): "null"}.get(type(rows), "a number")
        raise ConfigError(f"{path} is not a list of runs (it holds {held}); move it away to run the task afresh")
    return {(r["variant"], r["seed"]): r for r in rows if isinstance(r, dict) and {"variant", "seed"} <= r.keys()}


def committed_summary(row: dict[str, Any] | None, cfg: RunConfig) -> dict[str, Any] | None:
    """``row``'s summary if it is a finished run of what ``cfg`` computes: the same config hash (which
    leaves out where a run ran and what it recorded) and the same number of rounds (which it leaves out too)."""
    if row is None or row.get("finished", True) is not True or row.get("rounds") != cfg.train.rounds:
        return None
    if not same_computation(row, cfg):
        return None
    return {k: v for k, v in row.items() if k not in ("variant", "seed", "folder")}


def same_computation(row: dict[str, Any], cfg: RunConfig) -> bool:
    """Whether ``row``'s config hash is one ``cfg`` has held, however long either ran."""
    return row.get("config_hash") in config_hashes(cfg) | earlier_hashes(cfg)


def earlier_hashes(cfg: RunConfig) -> set[str]:
    """The hashes of ``cfg`` as runs made before some of its protocol options existed hold them: each option
    set to the value such runs behaved as (``as_saved``) left out, in every combination."""
    earlier = [f"protocol.{key}" for key, value in earlier_values(cfg.protocol_name).items()
               if cfg.protocol.get(key) == value]
    return {hash_without(cfg, set(keys)) for n in range(1, len(earlier) + 1) for keys in combinations(earlier, n)}


def within(entry: dict[str, Any], tolerance: float) -> bool | None:
    """Whether an aggregated cell's mean is within ``tolerance`` of the paper's number (None: no pair)."""
    if entry["mean"] is None or entry["paper"] is None:
        return None
    return abs(entry["mean"] - entry["paper"]) <= tolerance


def plan_runs(task: BenchTask, variants: list[Variant], n_seeds: int, extra: dict[str, Any],
              out: Path) -> list[RunJob]:
    """Every run of the task, variant by variant and seed by seed: the order ``derive`` sees them in."""
    return [RunJob(variant.label, seed, variant_config(task, variant, seed, extra),
                   out / "runs" / f"{variant.label}-seed{seed}".replace(" ", "_").replace("/", "-"), task.compute)
            for variant in variants for seed in range(n_seeds)]


def placement(jobs: int | None, executor: str | None, pending: int) -> tuple[str, int]:
    """Where the runs go and how many at once: one after another here (``sequential``) unless ``jobs``
    or ``executor`` asks for workers; Ray without ``jobs`` gets every pending run at once."""
    if executor is not None and executor not in EXECUTORS:
        raise ConfigError(f"unknown executor {executor!r}; allowed: {', '.join(EXECUTORS)}")
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be at least 1 (got {jobs})")
    if executor is None and jobs in (None, 1):
        return "sequential", 1
    executor = executor or "processes"
    return executor, jobs or (max(pending, 1) if executor == "ray" else 1)


def execute_runs(task: BenchTask, total: int, todo: list[RunJob], console: Console, executor: str, workers: int,
                 cluster: str | None) -> list[Outcome]:
    """The runs not reused: one after another here, or spread over worker processes or Ray tasks."""
    if executor == "sequential" or not todo:
        outcomes = []
        for job in todo:
            console.print(f"[dim]{task.name}: {job.name}[/dim]")
            outcomes.append(execute(job))
        return outcomes
    if any(job.cfg.backend.name == "ray" for job in todo):
        raise ConfigError("--jobs and --executor run each run whole in one process, and backend ray spreads a "
                          "run's parties over Ray actors: use one or the other")
    return run_jobs(todo, title=task.name, total=total, workers=workers, executor=executor, cluster=cluster)


def run_task(task: BenchTask, out_dir: str | Path, *, seeds: int | None = None, quick: bool = False,
             backend: str | None = None, overrides: dict[str, Any] | None = None, only: list[str] | None = None,
             rerun: bool = False, extend: bool = False, console: Console | None = None, jobs: int | None = None,
             executor: str | None = None, cluster: str | None = None, plan: bool = False) -> dict[str, Any]:
    """Run (or reuse) every selected variant over every seed, then aggregate and write the tables.

    A run whose folder already holds a summary made with the same config is reused unless ``rerun``,
    so an interrupted task continues where it stopped and new seeds or variants can be added later. With
    ``extend``, so is a run listed in ``out``'s ``results.json`` (a committed results folder, which keeps no
    run folders) whose config hash and rounds are this run's; the figures then stay as they are, since they
    need every run's folder.
    ``jobs`` runs at once, each in a worker process (``executor="processes"``, the default with
    ``jobs``) or a Ray task (``"ray"``, on ``cluster`` or a local Ray); the tables are those of one run
    after another. ``cost.json`` records what the runs took. ``plan`` runs nothing: it prints the runs to
    make with their estimated wall time (``estimate``) and returns them.
    """
    started = time.perf_counter()
    console = console or Console()
    variants = select_variants(task, only)
    out = check_folder(out_dir)  # before anything is planned: --plan refuses it too
    n_seeds = seeds or (1 if quick else task.seeds)
    extra = task_overrides(task, quick, overrides or {}, backend)
    planned = plan_runs(task, variants, n_seeds, extra, out)
    committed = committed_summaries(out) if extend and not rerun else {}
    summaries, from_rows = ([None] * len(planned), []) if rerun else _reused(task, planned, committed, console)
    todo = [i for i, summary in enumerate(summaries) if summary is None]
    where, workers = placement(jobs, executor, len(todo))
    if plan:
        return _plan(task, [planned[i] for i in todo], len(planned), extra, out, workers, console)
    make_folder(out)
    outcomes = execute_runs(task, len(planned), [planned[i] for i in todo], console, where, workers, cluster)
    for i, outcome in zip(todo, outcomes):
        summaries[i] = outcome.summary
    runs: list[dict[str, Any]] = []
    for job, summary in zip(planned, summaries):
        if task.derive:
            summary |= task.derive(summary)
        runs.append({"variant": job.variant, "seed": job.seed, "folder": str(job.folder), **summary})
    if extend:  # the listed runs of the variants and seeds not asked for this time stay in the tables
        runs, variants, kept = _with_listed(task, runs, committed, console)
        from_rows += kept
        n_seeds = max(r["seed"] for r in runs) + 1
    rows = [_row(task, variant, [r for r in runs if r["variant"] == variant.label]) for variant in variants]
    result = {"task": task.name, "description": task.description, "source": task.source, "seeds": n_seeds,
              "quick": quick, "rows": rows}
    (out / "results.json").write_text(json.dumps(runs, indent=2, default=float))
    (out / "table.json").write_text(json.dumps(result, indent=2, default=float))
    (out / "table.md").write_text(render_markdown(task, rows, n_seeds))
    if todo:  # a task whose runs were all reused keeps the cost of the invocation that ran them
        write_json(out / COST, {"runs": len(planned), "ran": len(todo), "executor": where, "jobs": workers,
                                "cpu_s": sum(o.cpu_s for o in outcomes), "wall_s": time.perf_counter() - started})
    console.print(render_table(task, rows, n_seeds))
    if task.finish and from_rows:  # its figures and derived files read every run's own folder
        console.print(f"{task.name}: figures not redrawn: {len(from_rows)} runs were reused from results.json "
                      f"without their folders (e.g. {from_rows[0]}); the ones already here are kept")
    elif task.finish:
        task.finish(out)
    return result


def task_overrides(task: BenchTask, quick: bool, overrides: dict[str, Any], backend: str | None) -> dict[str, Any]:
    """What every run of the task sets on top of its variant: the quick settings, the user's, the backend.
    A seed is refused: the seed loop would overwrite it without a word."""
    if "seed" in overrides:
        raise ConfigError(f"a bench sets seed itself (0 to seeds - 1; --seeds); it cannot be set "
                          f"(got seed={overrides['seed']})")
    return {**(task.quick if quick else {}), **overrides, **({"backend.name": backend} if backend else {})}


def _plan(task: BenchTask, todo: list[RunJob], total: int, extra: dict[str, Any], out: Path, workers: int,
          console: Console) -> dict[str, Any]:
    """``--plan``: print the runs to make, each estimated from the listed runs of its variant that computed
    what it will (another seed of the same config, as long or stopped earlier at a target), and return them."""
    variants = {v.label: v for v in task.variants if any(job.variant == v.label for job in todo)}
    timed = {(label, seed): row for (label, seed), row in committed_summaries(out).items()
             if label in variants and isinstance(row.get("wall_time_s"), (int, float))
             and same_computation(row, variant_config(task, variants[label], seed, extra))}  # each row once
    walls = [[float(row["wall_time_s"]) for (label, _), row in timed.items()
              if label == job.variant and as_long(row, job.cfg)] for job in todo]
    table, line = plan_table(task.name, todo, walls, total - len(todo), workers)
    console.print(table, line)
    return {"task": task.name, "to_run": [job.name for job in todo]}


def as_long(row: dict[str, Any], cfg: RunConfig) -> bool:
    """Whether ``row`` ran as long as ``cfg`` will: its rounds, or fewer where both stop at their target and it
    was reached (a shorter run of a longer config is no estimate of it)."""
    rounds = row.get("rounds")
    if rounds == cfg.train.rounds:
        return True
    stopped = cfg.eval.stop_at_target and row.get("round_at_target") is not None
    return stopped and isinstance(rounds, int) and rounds < cfg.train.rounds


def _reused(task: BenchTask, planned: list[RunJob], listed: dict[tuple[str, int], dict[str, Any]],
            console: Console) -> tuple[list[dict[str, Any] | None], list[str]]:
    """The summary of every planned run already made (None: to run), from its folder or, failing that,
    from the ``listed`` runs of ``--extend``; the names of those taken from the list."""
    summaries, from_rows = [], []
    for job in planned:
        summary = finished_summary(job.folder, job.cfg)
        if summary is not None:
            console.print(f"[dim]{task.name}: {job.name} (reused)[/dim]")
        elif (summary := committed_summary(listed.get((job.variant, job.seed)), job.cfg)) is not None:
            console.print(f"[dim]{task.name}: {job.name} (reused from results.json)[/dim]")
            from_rows.append(job.name)
        summaries.append(summary)
    return summaries, from_rows


def _with_listed(task: BenchTask, runs: list[dict[str, Any]], listed: dict[tuple[str, int], dict[str, Any]],
                 console: Console) -> tuple[list[dict[str, Any]], list[Variant], list[str]]:
    """``runs`` and the listed runs they do not redo, in the task's variant order and then by seed; the
    variants they cover; the names of the listed runs added."""
    order = {v.label: i for i, v in enumerate(task.variants)}
    gone = sorted({variant for variant, _ in listed if variant not in order})
    if gone:
        console.print(f"{task.name}: results.json lists variants the task no longer has, left out: {', '.join(gone)}")
    done = {(r["variant"], r["seed"]) for r in runs}
    kept = [r for key, r in listed.items() if key not in done and key[0] in order]
    runs = sorted(runs + kept, key=lambda r: (order[r["variant"]], r["seed"]))
    return (runs, [v for v in task.variants if any(r["variant"] == v.label for r in runs)],
            [f"{r['variant']} seed {r['seed']}" for r in kept])


def _row(task: BenchTask, variant: Variant, mine: list[dict[str, Any]]) -> dict[str, Any]:
    """A variant's row: each column's mean ± std over its runs, beside the paper's number."""
    row: dict[str, Any] = {"variant": variant.label}
    for column in task.columns:
        values = [r.get(column) for r in mine]
        mean, std = aggregate(values)
        row[column] = {"mean": mean, "std": std, "paper": variant.reference.get(column),
                       "runs": sum(v is not None for v in values), "of": len(values)}
        if column in task.tolerance:
            row[column]["pass"] = within(row[column], task.tolerance[column])
    return row


def _header(task: BenchTask) -> list[str]:
    cols = ["variant"]
    for column in task.columns:
        label = task.labels.get(column, column)
        cols.append(label)
        if any(column in v.reference for v in task.variants):
            cols.append(task.labels.get(f"{column} (paper)", f"{label} (paper)"))
        if column in task.tolerance:
            cols.append(f"{label} within ±{task.tolerance[column]:g}")
    return cols


def _cells(task: BenchTask, row: dict[str, Any]) -> list[str]:
    cells = [row["variant"]]
    for column in task.columns:
        entry = row[column]
        spec = task.formats.get(column)
        cell = _cell(entry["mean"], entry["std"], column, spec)
        if 0 < entry["runs"] < entry["of"]:  # e.g. a target some seeds never reached
            cell += f" ({entry['runs']} of {entry['of']} runs)"
        cells.append(cell)
        if any(column in v.reference for v in task.variants):
            cells.append(_ref(entry["paper"], column, spec))
        if column in task.tolerance:
            cells.append({True: "pass", False: "fail", None: "—"}[entry["pass"]])
    return cells


def render_markdown(task: BenchTask, rows: list[dict[str, Any]], seeds: int) -> str:
    header = _header(task)
    lines = [f"# {task.name}", "", task.description, "", f"Mean ± std over {seeds} seed(s).",
             f"Paper numbers: {task.source}" if task.source else "", "",
             *markdown_table(header, [_cells(task, row) for row in rows])]
    return "\n".join(lines) + "\n"


def render_table(task: BenchTask, rows: list[dict[str, Any]], seeds: int) -> Table:
    table = Table(title=f"{task.name} (mean ± std over {seeds} seed(s))")
    for column in _header(task):
        table.add_column(column)
    for row in rows:
        table.add_row(*_cells(task, row))
    return table
