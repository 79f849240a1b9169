"""A run's results folder: config, per-round metrics, ledger, summary and plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any, Iterable

from .errors import ConfigError
from .progress import human_bytes

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


def load_summary(folder: str | Path, damaged: str = "") -> dict:
    """A run folder's summary; a damaged one (a crash, a partial copy, a hand edit) is one line naming it,
    ending with ``damaged``, what to do about it."""
    return _mapping(Path(folder) / SUMMARY, json.loads, json.JSONDecodeError, "JSON", "a JSON object", damaged)


def read_config(folder: str | Path, damaged: str = "") -> dict:
    """A run folder's ``config.yaml`` as a dict ({} when there is none); a damaged one is one line naming it,
    ending with ``damaged``."""
    import yaml

    path = Path(folder) / CONFIG
    if not path.exists():
        return {}
    return _mapping(path, yaml.safe_load, yaml.YAMLError, "YAML", "a mapping of settings", damaged)


def _mapping(path: Path, parse: Any, error: type[Exception], form: str, kind: str, damaged: str) -> dict:
    """The mapping the file ``path`` holds as ``form``; one line naming it when it is not."""
    advice = f"; {damaged}" if damaged else ""
    try:
        value = parse(path.read_text(errors="replace"))
    except error:
        raise ConfigError(f"{path} is corrupt: not {form}{advice}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path} is corrupt: not {kind}{advice}")
    return value


def load_run(folder: str | Path) -> tuple[dict, list[dict]]:
    """The summary and metric rows of a finished run folder."""
    folder = Path(folder)
    summary = load_summary(folder)
    if not (folder / METRICS).is_file():
        raise ConfigError(f"{folder} is not a finished run folder (no {METRICS})")
    return summary, read_jsonl(folder / METRICS)


def best_row(rows: list[dict]) -> dict | None:
    """The evaluated round of best validation accuracy (the earliest on ties)."""
    return max(rows, key=lambda row: (row["val_accuracy"], -row["round"])) if rows else None


# What one training round of a protocol is, for the x axis: the Swift family counts mini-batch
# iterations, a GLASU training round holds ``batches`` GLASU rounds (one mini-batch each).
ITERATION_PROTOCOLS = ("swift", "fedgnn-g", "fedgnn-pns", "llcg")


def round_unit(protocol: dict[str, Any]) -> str:
    """The x-axis label of a protocol's rounds, from its config section."""
    name = str(protocol.get("name", "")).lower()
    if name in ITERATION_PROTOCOLS:
        return "iteration"
    if name == "glasu":
        return f"training round ({protocol.get('batches')} GLASU rounds each)"
    return "round"


SPLIT_STYLE = {"train": ":", "val": "-", "test": "--"}


def plot_curves(runs: dict[str, list[dict]], path: Path | IO[bytes], title: str = "", xlabel: str = "round") -> None:
    """Loss and accuracy against rounds and accuracy against cumulative bytes (log axis), one colour per
    run, line style per split, the round of best validation accuracy starred."""
    # Imported here, and without pyplot (a Figure draws on the Agg canvas by itself): matplotlib is
    # loaded only when a plot is drawn, which keeps it out of every command's start-up.
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    fig = Figure(figsize=(15, 4.6))
    loss_ax, acc_ax, bytes_ax = fig.subplots(1, 3)
    colours = colormaps["tab10" if len(runs) <= 10 else "tab20"].colors
    handles = []
    for (label, rows), colour in zip(runs.items(), colours * (len(runs) // len(colours) + 1)):
        rounds = [r["round"] for r in rows]
        for split in ("train", "val"):
            if rows and f"{split}_loss" in rows[0]:
                loss_ax.plot(rounds, [r[f"{split}_loss"] for r in rows], SPLIT_STYLE[split], color=colour)
        sent = [(r["bytes_total"], r) for r in rows if r["bytes_total"] > 0]
        for split in ("val", "test"):
            acc_ax.plot(rounds, [r[f"{split}_accuracy"] for r in rows], SPLIT_STYLE[split], color=colour)
            bytes_ax.plot([b for b, _ in sent], [r[f"{split}_accuracy"] for _, r in sent], SPLIT_STYLE[split],
                          color=colour)
        best = best_row(rows)
        if best is not None:
            for ax in (loss_ax, acc_ax):
                ax.axvline(best["round"], color=colour, alpha=0.35, linewidth=1)
            acc_ax.plot(best["round"], best["val_accuracy"], "*", color=colour, markersize=13, markeredgecolor="k")
            if best["bytes_total"] > 0:
                bytes_ax.plot(best["bytes_total"], best["val_accuracy"], "*", color=colour, markersize=13,
                              markeredgecolor="k")
        if label:
            handles.append(Line2D([], [], color=colour, linewidth=3, label=label))
    handles += [Line2D([], [], color="0.3", linestyle=style, label=split) for split, style in SPLIT_STYLE.items()]
    handles.append(Line2D([], [], marker="*", color="0.5", markeredgecolor="k", markersize=12, linestyle="",
                          label="best validation round"))
    loss_ax.set(xlabel=xlabel, ylabel="cross-entropy loss", title="loss")
    acc_ax.set(xlabel=xlabel, ylabel="accuracy", title="accuracy")
    bytes_ax.set(xlabel="bytes sent, cumulative (log scale)", ylabel="accuracy", title="accuracy against bytes")
    if bytes_ax.lines:
        bytes_ax.set_xscale("log")
        low, high = bytes_ax.get_xlim()
        # Label 1-2-5 steps when the data span few decades; sizes read as KB/MB/GB.
        bytes_ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0) if high / low < 1e3 else (1.0,)))
        bytes_ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: human_bytes(x).replace(".0 ", " ")))
        bytes_ax.xaxis.set_minor_formatter(NullFormatter())
    else:
        bytes_ax.text(0.5, 0.5, "no training traffic", ha="center", va="center", transform=bytes_ax.transAxes)
    for ax in (loss_ax, acc_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (loss_ax, acc_ax, bytes_ax):
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    columns = min(len(handles), 6)
    fig.legend(handles=handles, loc="lower center", ncol=columns, frameon=False, fontsize="medium")
    fig.tight_layout(rect=(0, 0.06 * (1 + (len(handles) - 1) // columns), 1, 1))
    fig.savefig(path, dpi=110)
