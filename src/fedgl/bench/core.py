"""Running a benchmark task: every variant over every seed, then mean ± std beside the reference.

A task is data: a base config, variants (each a label, config overrides and the paper's numbers for
it) and the summary columns to report. Results go to ``results.json`` (every run's summary),
``table.md`` and ``table.json`` in the task's folder, with each run's own folder beneath it. A task
whose numbers need no training (e.g. partition statistics) gives ``compute``, which makes a run's
summary from its config; everything else, folders and tables included, stays the same.
"""

from __future__ import annotations

import copy
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml
from rich.console import Console
from rich.table import Table

from ..config import RunConfig, build_config, set_key
from ..errors import ConfigError
from ..protocols import protocol_class
from ..results import CONFIG, FINISHED, SUMMARY, write_json
from ..runner import run
from ..tables import markdown_table


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
    try:
        fields = protocol_class(section.get("name", "")).Options.model_fields
    except ConfigError:
        return saved
    for key, info in fields.items():
        extra = info.json_schema_extra
        if key not in section and isinstance(extra, dict) and "earlier" in extra:
            section[key] = extra["earlier"]
    return saved


def finished_summary(folder: Path, cfg: RunConfig) -> dict[str, Any] | None:
    """The summary of an earlier, finished run in ``folder`` made with exactly this config, if there is
    one (an interrupted run's summary says ``"finished": false`` and has no ``finished`` marker)."""
    summary, config = folder / SUMMARY, folder / CONFIG
    if not (summary.exists() and config.exists()):
        return None
    try:  # both read through today's config model: options added since then take their defaults
        earlier = build_config(as_saved(yaml.safe_load(config.read_text()))).model_dump(mode="json")
    except ConfigError:
        return None
    if earlier != build_config(cfg.model_dump(mode="json")).model_dump(mode="json"):
        return None
    found = json.loads(summary.read_text())
    if not (folder / FINISHED).exists() and found.get("finished", True) is not True:
        return None
    return found


def computed_summary(task: BenchTask, cfg: RunConfig, folder: Path) -> dict[str, Any]:
    """``task.compute``'s summary, left in ``folder`` as a finished run leaves it (config and
    summary), so it is reused the same way."""
    summary = task.compute(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    write_json(folder / SUMMARY, summary)
    (folder / FINISHED).write_text("computed\n")
    return summary


def within(entry: dict[str, Any], tolerance: float) -> bool | None:
    """Whether an aggregated cell's mean is within ``tolerance`` of the paper's number (None: no pair)."""
    if entry["mean"] is None or entry["paper"] is None:
        return None
    return abs(entry["mean"] - entry["paper"]) <= tolerance


def run_task(task: BenchTask, out_dir: str | Path, *, seeds: int | None = None, quick: bool = False,
             backend: str | None = None, overrides: dict[str, Any] | None = None, only: list[str] | None = None,
             rerun: bool = False, console: Console | None = None) -> dict[str, Any]:
    """Run (or reuse) every selected variant over every seed, then aggregate and write the tables.

    A run whose folder already holds a summary made with the same config is reused unless ``rerun``,
    so an interrupted task continues where it stopped and new seeds or variants can be added later.
    """
    console = console or Console()
    variants = select_variants(task, only)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n_seeds = seeds or (1 if quick else task.seeds)
    extra = {**(task.quick if quick else {}), **(overrides or {})}
    if backend:
        extra["backend.name"] = backend
    runs: list[dict[str, Any]] = []
    for variant in variants:
        for seed in range(n_seeds):
            cfg = variant_config(task, variant, seed, extra)
            folder = out / "runs" / f"{variant.label}-seed{seed}".replace(" ", "_").replace("/", "-")
            summary = None if rerun else finished_summary(folder, cfg)
            console.print(f"[dim]{task.name}: {variant.label} seed {seed}{' (reused)' if summary else ''}[/dim]")
            if summary is None:
                summary = run(cfg, folder).summary if task.compute is None else computed_summary(task, cfg, folder)
            if task.derive:
                summary |= task.derive(summary)
            runs.append({"variant": variant.label, "seed": seed, "folder": str(folder), **summary})
    rows = []
    for variant in variants:
        mine = [r for r in runs if r["variant"] == variant.label]
        row: dict[str, Any] = {"variant": variant.label}
        for column in task.columns:
            values = [r.get(column) for r in mine]
            mean, std = aggregate(values)
            row[column] = {"mean": mean, "std": std, "paper": variant.reference.get(column),
                           "runs": sum(v is not None for v in values), "of": len(values)}
            if column in task.tolerance:
                row[column]["pass"] = within(row[column], task.tolerance[column])
        rows.append(row)
    result = {"task": task.name, "description": task.description, "source": task.source, "seeds": n_seeds,
              "quick": quick, "rows": rows}
    (out / "results.json").write_text(json.dumps(runs, indent=2, default=float))
    (out / "table.json").write_text(json.dumps(result, indent=2, default=float))
    (out / "table.md").write_text(render_markdown(task, rows, n_seeds))
    console.print(render_table(task, rows, n_seeds))
    if task.finish:
        task.finish(out)
    return result


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
