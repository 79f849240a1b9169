"""Tables in the docs are copies of committed bench results, kept in step by a test.

A documented table sits between two markers naming the committed file it copies::

    <!-- table: benchmarks/results/glasu-table2/table.md -->
    | variant | test_accuracy | ... |
    |---|---|---|
    | ... |
    <!-- /table -->

The table lines of the block (lines starting with ``|``) must equal the table lines of the cited
file. A marker may keep some columns and rows only, for a compact table in the README:
``<!-- table: PATH | variant; test_accuracy; test_accuracy (paper) | rows: cora -->`` keeps those
columns (by header) of the rows whose first cell contains ``cora``. ``python -m fedgl.bench.docs`` rewrites every block from its file after a bench run;
``tests/test_docs.py`` fails when a block and its file differ or the file is missing, so no number
can stay in the docs after the code stops reproducing it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BLOCK = re.compile(r"(<!-- table: (?P<path>\S+)(?P<select>[^\n]*?) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


def documents(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", root / "ARCHITECTURE.md", *sorted((root / "docs").glob("*.md"))]


def table_lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.startswith("|")]


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def select(lines: list[str], selection: str) -> list[str]:
    """The columns and rows a marker's ``| col; col | rows: text`` keeps."""
    parts = [part.strip() for part in selection.split("|") if part.strip()]
    columns = next((p for p in parts if not p.startswith("rows:")), None)
    rows = next((p[len("rows:"):].strip() for p in parts if p.startswith("rows:")), None)
    if not lines:
        return lines
    header = cells(lines[0])
    keep = list(range(len(header)))
    if columns:
        names = [c.strip() for c in columns.split(";")]
        missing = [n for n in names if n not in header]
        if missing:
            raise ValueError(f"no column {', '.join(missing)}")
        keep = [header.index(n) for n in names]
    body = [line for line in lines[2:] if rows is None or rows in cells(line)[0]]
    if not body:
        raise ValueError(f"no row{'' if rows is None else f' whose first cell contains {rows!r}'}")

    def fmt(row: list[str]) -> str:
        return "| " + " | ".join(row[i] for i in keep) + " |"
    return [fmt(header), "|" + "---|" * len(keep), *(fmt(cells(line)) for line in body)]


def blocks(text: str) -> list[tuple[str, str, list[str]]]:
    """(cited path, selection, table lines) of every marked block of a document."""
    return [(m["path"], m["select"], table_lines(m["body"])) for m in BLOCK.finditer(text)]


def expected(root: Path, path: str, selection: str) -> list[str]:
    return select(table_lines((root / path).read_text()), selection)


def stale(root: Path = ROOT) -> list[str]:
    """One line per marked block that is missing its file or differs from it."""
    problems = []
    for doc in documents(root):
        if not doc.exists():
            continue
        for path, selection, lines in blocks(doc.read_text()):
            if not (root / path).exists():
                problems.append(f"{doc.name}: cites {path}, which is not committed")
                continue
            try:
                if lines != expected(root, path, selection):
                    problems.append(f"{doc.name}: the table citing {path} differs from it")
            except ValueError as err:
                problems.append(f"{doc.name}: the table citing {path}: {err}")
    return problems


def sync(root: Path = ROOT) -> list[Path]:
    """Rewrite every marked block from its file; returns the documents changed."""
    changed = []
    for doc in documents(root):
        if not doc.exists():
            continue
        text = doc.read_text()

        def fill(m: re.Match) -> str:
            if not (root / m["path"]).exists():
                return m[0]
            return m[1] + "\n".join(expected(root, m["path"], m["select"])) + "\n" + m[5]

        new = BLOCK.sub(fill, text)
        if new != text:
            doc.write_text(new)
            changed.append(doc)
    return changed


if __name__ == "__main__":
    for doc in sync():
        print(f"updated {doc}")
    problems = stale()
    print("\n".join(problems) or "every documented table matches its committed result")
    sys.exit(1 if problems else 0)
