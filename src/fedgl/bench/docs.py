"""Tables in the docs are copies of committed bench results, kept in step by a test.

A documented table sits between two markers naming the committed file it copies::

    <!-- table: benchmarks/results/glasu-table2/table.md -->
    | variant | test_accuracy | ... |
    |---|---|---|
    | ... |
    <!-- /table -->

The table lines of the block (lines starting with ``|``) must equal the table lines of the cited
file. ``python -m fedgl.bench.docs`` rewrites every block from its file after a bench run;
``tests/test_docs.py`` fails when a block and its file differ or the file is missing, so no number
can stay in the docs after the code stops reproducing it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BLOCK = re.compile(r"(<!-- table: (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


def documents(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", root / "ARCHITECTURE.md", *sorted((root / "docs").glob("*.md"))]


def table_lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.startswith("|")]


def blocks(text: str) -> list[tuple[str, list[str]]]:
    """(cited path, table lines) of every marked block of a document."""
    return [(m["path"], table_lines(m["body"])) for m in BLOCK.finditer(text)]


def stale(root: Path = ROOT) -> list[str]:
    """One line per marked block that is missing its file or differs from it."""
    problems = []
    for doc in documents(root):
        if not doc.exists():
            continue
        for path, lines in blocks(doc.read_text()):
            source = root / path
            if not source.exists():
                problems.append(f"{doc.name}: cites {path}, which is not committed")
            elif lines != table_lines(source.read_text()):
                problems.append(f"{doc.name}: the table citing {path} differs from it")
    return problems


def sync(root: Path = ROOT) -> list[Path]:
    """Rewrite every marked block from its file; returns the documents changed."""
    changed = []
    for doc in documents(root):
        if not doc.exists():
            continue
        text = doc.read_text()

        def fill(m: re.Match) -> str:
            source = root / m["path"]
            if not source.exists():
                return m[0]
            return m[1] + "\n".join(table_lines(source.read_text())) + "\n" + m[4]

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
