"""Markdown tables: the one writer every table file (bench tables, reports, benchmark results) uses."""

from __future__ import annotations

from typing import Any, Iterable, Sequence


def markdown_table(header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> list[str]:
    """The lines of a markdown table: the header, its separator, one line per row (cells as text)."""
    def line(cells: Sequence[Any]) -> str:
        return "| " + " | ".join(str(cell) for cell in cells) + " |"
    return [line(header), "|" + "---|" * len(header), *(line(row) for row in rows)]
