"""A run's results folder: config, per-round metrics, ledger, summary and plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import matplotlib

from .errors import ConfigError

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CONFIG = "config.yaml"
LEDGER = "ledger.jsonl"
PLOT = "curves.png"
FINISHED = "finished"  # written last: the folder holds a complete run (its config hash inside)


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, default=float) + "\n")


def write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    path.write_text("".join(json.dumps(row, default=float) + "\n" for row in rows))


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            raise ConfigError(f"{path} is corrupt: line {number} is not JSON") from None
    return rows


def load_run(folder: str | Path) -> tuple[dict, list[dict]]:
    """The summary and metric rows of a finished run folder."""
    folder = Path(folder)
    try:
        summary = json.loads((folder / SUMMARY).read_text(errors="replace"))
    except json.JSONDecodeError:
        raise ConfigError(f"{folder / SUMMARY} is corrupt: not JSON") from None
    return summary, read_jsonl(folder / METRICS)


def plot_curves(runs: dict[str, list[dict]], path: Path, title: str = "") -> None:
    """Validation and test accuracy against rounds and against megabytes sent, one line per run."""
    fig, (by_round, by_mb) = plt.subplots(1, 2, figsize=(11, 4))
    for label, rows in runs.items():
        rounds = [r["round"] for r in rows]
        mb = [r["bytes_total"] / 1e6 for r in rows]
        for key, style in (("val_accuracy", "-"), ("test_accuracy", "--")):
            acc = [r[key] for r in rows]
            name = f"{label} {key.split('_')[0]}" if label else key.split("_")[0]
            by_round.plot(rounds, acc, style, label=name)
            by_mb.plot(mb, acc, style, label=name)
    by_round.set(xlabel="round", ylabel="accuracy")
    by_mb.set(xlabel="megabytes communicated", ylabel="accuracy")
    by_round.legend(fontsize="small")
    for ax in (by_round, by_mb):
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
