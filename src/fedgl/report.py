"""``fedgl report``: one table and one plot over several run folders."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from .errors import ConfigError
from .results import SUMMARY, load_run, plot_curves

COLUMNS = ("protocol", "dataset", "seed", "rounds", "best_val_accuracy", "test_accuracy", "bytes_total", "sim_time_s",
           "round_at_target")


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if value < 10 else f"{value:,.1f}"
    return "" if value is None else str(value)


def report(folders: list[Path], out: Path | None, console: Console) -> None:
    runs = {}
    for folder in folders:
        if not (folder / SUMMARY).exists():
            raise ConfigError(f"{folder} is not a finished run folder (no {SUMMARY})")
        runs[folder.name] = load_run(folder)
    table = Table(title="runs")
    table.add_column("run")
    for column in COLUMNS:
        table.add_column(column)
    lines = ["| run | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for name, (summary, _) in runs.items():
        cells = [_fmt(summary.get(c)) for c in COLUMNS]
        table.add_row(name, *cells)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    console.print(table)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").write_text("\n".join(lines) + "\n")
        plot_curves({name: rows for name, (_, rows) in runs.items()}, out / "curves.png")
        console.print(f"report: {out / 'report.md'}, {out / 'curves.png'}")
