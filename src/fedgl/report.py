"""``fedgl report``: one table and one comparison plot over several run folders, printed, written as
Markdown and as a self-contained HTML page (plots embedded as PNG)."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from .errors import ConfigError
from .progress import human_bytes
from .results import SUMMARY, load_run, plot_curves, read_config, round_unit
from .tables import markdown_table

# summary key -> column header (short, so the table fits a terminal)
COLUMNS = {
    "protocol": "protocol",
    "dataset": "dataset",
    "seed": "seed",
    "rounds": "rounds",
    "best_val_accuracy": "best val acc",
    "best_round": "best round",
    "test_accuracy": "test acc",
    "bytes_total": "bytes sent",
    "sim_time_s": "sim time",
    "round_at_target": "round at target",
}
TEXT_COLUMNS = ("protocol", "dataset")
SHARED_COLUMNS = ("protocol", "dataset", "seed")  # named once in the terminal table's title when all runs agree
REPORT_MD, REPORT_PNG, REPORT_HTML = "report.md", "curves.png", "report.html"


def _fmt(key: str, value) -> str:
    if value is None:
        return ""
    if key.startswith("bytes"):
        return human_bytes(value)
    if key.endswith("_s"):
        return f"{value:,.2f} s"
    if isinstance(value, float):
        return f"{value:.4f}" if value < 10 else f"{value:,.1f}"
    return str(value)


def load_runs(folders: list[Path]) -> dict[str, tuple[dict, list[dict], str]]:
    """{label: (summary, metric rows, x-axis label)}; labels are folder names, paths where names repeat."""
    names = [folder.name for folder in folders]
    runs = {}
    for folder in folders:
        if not (folder / SUMMARY).exists():
            raise ConfigError(f"{folder} is not a finished run folder (no {SUMMARY})")
        summary, rows = load_run(folder)
        config = read_config(folder)
        section = config.get("protocol")
        unit = round_unit(section if isinstance(section, dict) else {"name": summary.get("protocol")})
        runs[folder.name if names.count(folder.name) == 1 else str(folder)] = (summary, rows, unit)
    return runs


def comparison_plot(runs: dict[str, tuple[dict, list[dict], str]]) -> bytes:
    """The runs' curves on shared axes as PNG; the x label lists each unit of a round present."""
    units = dict.fromkeys(unit for _, _, unit in runs.values())
    png = io.BytesIO()
    plot_curves({name: rows for name, (_, rows, _) in runs.items()}, png, xlabel=" / ".join(units))
    return png.getvalue()


def html_page(runs: dict[str, tuple[dict, list[dict], str]], png: bytes) -> str:
    """A self-contained page: the summary table, bytes by kind and the comparison plot."""
    kinds = sorted({kind for summary, _, _ in runs.values() for kind in summary.get("bytes_by_kind") or {}})

    def table(header: list[str], rows: list[list[str]]) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    summary_rows = [[name, *(_fmt(k, s.get(k)) for k in COLUMNS)] for name, (s, _, _) in runs.items()]
    kind_rows = [[name, *(_fmt("bytes", (s.get("bytes_by_kind") or {}).get(k)) for k in kinds)]
                 for name, (s, _, _) in runs.items()]
    image = base64.b64encode(png).decode()
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>fedgl report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1.5em; }}
th, td {{ border: 1px solid #bbb; padding: 0.3em 0.7em; text-align: right; }}
th {{ background: #eef; }} td:first-child, th:first-child {{ text-align: left; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>fedgl report: {len(runs)} run{"s" if len(runs) != 1 else ""}</h1>
<h2>Summary</h2>
{table(["run", *COLUMNS.values()], summary_rows)}
<h2>Training bytes by kind</h2>
{table(["run", *kinds], kind_rows)}
<h2>Curves</h2>
<img alt="loss and accuracy against rounds and bytes" src="data:image/png;base64,{image}">
</body></html>
"""


def terminal_table(runs: dict[str, tuple[dict, list[dict], str]], *, narrow: bool) -> Table:
    """The printed summary table: protocol, dataset and seed shared by every run go to the title; when
    ``narrow`` (a terminal) headers take a line per word and names wrap, numbers stay whole."""
    shared = [key for key in SHARED_COLUMNS if len({str(s.get(key)) for s, _, _ in runs.values()}) == 1]
    first = next(iter(runs.values()))[0]
    title = ", ".join(f"{key} {first.get(key)}" if key == "seed" else str(first.get(key)) for key in shared)
    table = Table(title=f"runs: {title}" if title else "runs", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("run", overflow="fold")
    columns = [key for key in COLUMNS if key not in shared]
    for key in columns:
        text = key in TEXT_COLUMNS
        header = COLUMNS[key].replace(" ", "\n") if narrow else COLUMNS[key]
        table.add_column(header, justify="left" if text else "right", overflow="fold", no_wrap=not text)
    for name, (summary, _, _) in runs.items():
        table.add_row(name, *(_fmt(key, summary.get(key)) for key in columns))
    return table


def report(folders: list[Path], out: Path | None, console: Console, html_path: Path | None = None) -> None:
    """Print the runs' summary table; with ``out`` write report.md, curves.png and report.html there;
    with ``html_path`` the HTML page there."""
    for flag, path, kind in (("--out", out, "folder"), ("--html", html_path, "file")):
        if path is not None and path.exists() and path.is_dir() != (kind == "folder"):
            raise ConfigError(f"{flag} {path} is a {'file' if kind == 'folder' else 'folder'}, not a {kind}")
    runs = load_runs(folders)
    table = terminal_table(runs, narrow=console.is_terminal)
    # A terminal gets a table that fits its width; logs and pipes get the whole table, never cut.
    if not console.is_terminal:
        width = Measurement.get(console, console.options.update_width(10_000), table).maximum
        console = Console(file=console.file, width=max(width, console.width))
    console.print(table)
    if not (out or html_path):
        return
    png, written = comparison_plot(runs), []
    try:
        if out:
            out.mkdir(parents=True, exist_ok=True)
            lines = markdown_table(["run", *COLUMNS.values()], [[name, *(_fmt(key, s.get(key)) for key in COLUMNS)]
                                                                for name, (s, _, _) in runs.items()])
            (out / REPORT_MD).write_text("\n".join(lines) + "\n")
            (out / REPORT_PNG).write_bytes(png)
            written += [out / REPORT_MD, out / REPORT_PNG]
            html_path = html_path or out / REPORT_HTML
        html_path.parent.mkdir(parents=True, exist_ok=True)
        html_path.write_text(html_page(runs, png))
    except OSError as err:
        raise ConfigError(f"the report cannot be written to {err.filename or out or html_path}: "
                          f"{err.strerror or err}") from None
    written.append(html_path)
    console.print("report: " + ", ".join(map(str, written)))
