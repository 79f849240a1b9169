"""What the privacy benchmark scripts share: mean ± std cells, a markdown table and writing the
results folder (results.json, table.json, table.md)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from fedgl.tables import markdown_table


def mean_std(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    values = [v * scale for v in values]
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {std:.{digits}f}"


def markdown_rows(entries: list[dict]) -> list[str]:
    """A markdown table of ``entries``, one row each, the first entry's keys as the header."""
    header = list(entries[0])
    return markdown_table(header, [[entry[h] for h in header] for entry in entries])


def write_results(out: Path, rows: list[dict], summary: list[dict], markdown: str) -> None:
    (out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "table.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    (out / "table.md").write_text(markdown)
    print(markdown)
