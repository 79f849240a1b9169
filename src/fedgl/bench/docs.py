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
columns (by header) of the rows whose first cell contains ``cora``. ``python -m fedgl.bench.docs``
rewrites every block from its file after a bench run.

A number in prose carries its source in a comment right after it, invisible once rendered::

    FedPNS reaches 94.52<!-- = [fedaas-baselines-cs|FedPNS iid|final_test_accuracy] -->% ...
    with 1.6<!-- = [t|FedCross iid|bytes_embedding] / [t|FedPNS iid|bytes_embedding] -->x the bytes

``[FOLDER|VARIANT|COLUMN]`` is the mean of that cell of ``benchmarks/results/FOLDER/table.json``, in
the table's units (percentages, MB; a script's table of shown cells, its first number);
``COLUMN (paper)`` is the paper's number beside it and ``COLUMN std`` the standard deviation.
``COLUMN seed N`` is one run's value (``results.json``) and ``seeds`` how many seeds the variant was run
with there, so a "3 seeds" in prose goes stale with its table; ``[FOLDER|summary|COLUMN]`` and
``[FOLDER|round N|COLUMN]`` read a single committed run (``summary.json``, ``metrics.jsonl``);
``[FOLDER/NAME.md|ROW|COLUMN]`` a task's extra markdown table, its rows named by their leading cells that
are not numbers joined by " / " (``[fedaas-cost/savings.md|FedAAS / FedCross|embedding saving]``).
``[perf|MEASURE|value]`` (or ``target``) reads the performance suite's ``perf.json``. Around
references go numbers, ``+ - * /``, ``abs``, ``min`` and ``max``. The prose number must equal the
expression rounded to the digits the prose shows; a marker after no number is itself a problem.

``tests/test_docs.py`` fails when a block and its file differ, a file is missing or a marked number
no longer equals its expression, so no number can stay in the docs after the code stops
reproducing it; when a result-like number carries no marker (``unmarked``); and when a committed
``table.md`` or ``table.json`` is not what its task makes of its ``results.json`` (``table_drift``).
"""

from __future__ import annotations

import ast
import json
import operator
import re
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

from ..results import METRICS, SUMMARY
from ..tables import markdown_table

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
    return markdown_table([header[i] for i in keep], [[row[i] for i in keep] for row in map(cells, body)])


def blocks(text: str) -> list[tuple[str, str, list[str]]]:
    """(cited path, selection, table lines) of every marked block of a document."""
    return [(m["path"], m["select"], table_lines(m["body"])) for m in BLOCK.finditer(text)]


def expected(root: Path, path: str, selection: str) -> list[str]:
    return select(table_lines((root / path).read_text()), selection)


# a minus right after a word, a number or a marker is a range's dash (88.07-88.43), not a sign
VALUE = re.compile(r"(?P<number>(?:(?<![\w>)])-)?\d[\d,]*(?:\.\d+)?)<!-- = (?P<expr>.+?) -->")
MARKER = re.compile(r"<!-- = (?P<expr>.+?) -->")
REF = re.compile(r"\[(?P<folder>[^|\][]+)\|(?P<variant>[^|]+?)\|(?P<column>[^|\]]+)\]")  # a variant may hold [ ]
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.USub: operator.neg}
_FUNCTIONS = {"abs": abs, "min": min, "max": max}


def _table(root: Path, folder: str) -> dict[str, dict[str, dict[str, float | None]]]:
    """A committed table's cells by variant and column, each as mean, std and paper number in the
    units the table shows."""
    results = root / "benchmarks" / "results"
    if folder == "perf":  # the performance suite's measures, by name: value and target
        path = results / "perf.json"
        return _read_perf(path, _version(path))
    if folder.endswith(".md"):  # a task's extra table, e.g. fedaas-cost/savings.md
        path = results / folder
        return _read_markdown(path, _version(path))
    path = results / folder / "table.json"
    if not path.exists() and (results / folder / SUMMARY).exists():  # a single committed run
        path = results / folder / SUMMARY
        return _read_summary(path, _version(path))
    return _read_table(path, _version(path))


def _version(path: Path) -> tuple[int, int]:
    """What tells a rewritten file from the one read before (a cache key)."""
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


@cache
def _read_perf(path: Path, version: tuple[int, int]) -> dict[str, dict[str, dict[str, float | None]]]:
    measures = json.loads(path.read_text())["measures"]
    return {m["name"]: {"value": {"mean": m["value"], "std": None, "paper": None},
                        "target": _shown(m["target"])}  # a target reads "<= 4"
            for m in measures}


@cache
def _read_table(path: Path, version: tuple[int, int]) -> dict[str, dict[str, dict[str, float | None]]]:
    from . import all_tasks
    from .core import display_scale

    data = json.loads(path.read_text())
    if isinstance(data, list):  # a script's table: rows of cells as shown ("69.00 ± 1.39")
        return {str(row["variant"]): {column: _shown(cell) for column, cell in row.items()} for row in data}
    task = all_tasks().get(data.get("task", ""))
    formats = task.formats if task else {}

    def entry(column: str, cell: dict) -> dict[str, float | None]:
        scale = display_scale(column, formats.get(column))
        return {"mean": None if cell["mean"] is None else cell["mean"] * scale,
                "std": None if cell.get("std") is None else cell["std"] * scale, "paper": cell.get("paper")}
    return {row["variant"]: {c: entry(c, cell) for c, cell in row.items() if isinstance(cell, dict)}
            for row in data["rows"]}


@cache
def _read_markdown(path: Path, version: tuple[int, int]) -> dict[str, dict[str, dict[str, float | None]]]:
    """A markdown table's cells as shown, each row named by its leading cells that are not numbers,
    joined by " / " (``FedAAS / FedCross``)."""
    lines = table_lines(path.read_text())
    header = cells(lines[0])
    rows = {}
    for line in lines[2:]:
        row = cells(line)
        lead = next((i for i, cell in enumerate(row) if _shown(cell)["mean"] is not None), len(row))
        rows[" / ".join(row[:max(lead, 1)])] = {column: _shown(cell) for column, cell in zip(header, row)}
    return rows


@cache
def _read_summary(path: Path, version: tuple[int, int]) -> dict[str, dict[str, dict[str, float | None]]]:
    """A single committed run: its summary as the row ``summary`` and each metrics row as ``round N``,
    every number in table units."""
    from .core import display_scale

    def row(values: dict) -> dict[str, dict[str, float | None]]:
        return {key: {"mean": value * display_scale(key), "std": None, "paper": None}
                for key, value in values.items() if isinstance(value, (int, float)) and not isinstance(value, bool)}

    metrics = path.with_name(METRICS)
    rounds = [json.loads(line) for line in metrics.read_text().splitlines() if line] if metrics.exists() else []
    return {"summary": row(json.loads(path.read_text())), **{f"round {r['round']}": row(r) for r in rounds}}


def _runs(root: Path, folder: str, variant: str) -> list[dict]:
    """The runs of ``variant`` in the ``results.json`` of ``folder``."""
    runs = json.loads((root / "benchmarks" / "results" / folder / "results.json").read_text())
    return [r for r in runs if r["variant"] == variant]


def _seed_value(root: Path, folder: str, variant: str, column: str, seed: int) -> float:
    """One run's ``column`` (``results.json`` of ``folder``) in the units of the task's table."""
    from . import all_tasks
    from .core import display_scale

    run = next((r for r in _runs(root, folder, variant) if r["seed"] == seed), None)
    if run is None or run.get(column) is None:
        raise ValueError(f"{folder} has no run of {variant!r} with seed {seed} and a {column!r}")
    task = all_tasks().get(json.loads((root / "benchmarks" / "results" / folder / "table.json").read_text())["task"])
    return float(run[column]) * display_scale(column, task.formats.get(column) if task else None)


def _seed_count(root: Path, folder: str, variant: str) -> int:
    """How many seeds of ``variant`` the ``results.json`` of ``folder`` holds."""
    count = len({r["seed"] for r in _runs(root, folder, variant)})
    if not count:
        raise ValueError(f"{folder} has no run of {variant!r}")
    return count


def _shown(cell: object) -> dict[str, float | None]:
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", str(cell))]
    return {"mean": numbers[0] if numbers else None, "std": numbers[1] if "±" in str(cell) and len(numbers) > 1
            else None, "paper": None}


def ref_value(root: Path, folder: str, variant: str, column: str) -> float:
    """The number ``[folder|variant|column]`` names, in the table's units."""
    try:
        rows = _table(root, folder)
    except FileNotFoundError:
        name = "perf.json" if folder == "perf" else folder if folder.endswith(".md") else f"{folder}/table.json"
        raise ValueError(f"benchmarks/results/{name} is not committed") from None
    has_runs = not (folder == "perf" or folder.endswith(".md"))  # an extra table's "seeds" is a column of its own
    seed = re.fullmatch(r"(?P<name>.+) seed (?P<seed>\d+)", column) if has_runs else None
    if column == "seeds" and has_runs:
        try:
            return float(_seed_count(root, folder, variant))
        except FileNotFoundError:
            raise ValueError(f"benchmarks/results/{folder}/results.json is not committed") from None
    if seed:
        try:
            return _seed_value(root, folder, variant, seed["name"], int(seed["seed"]))
        except FileNotFoundError:
            raise ValueError(f"benchmarks/results/{folder}/results.json is not committed") from None
    part = next((p for p in ("(paper)", "std") if column.endswith(f" {p}")), "")
    name = column.removesuffix(f" {part}") if part else column
    if variant not in rows:
        raise ValueError(f"{folder} has no variant {variant!r}")
    if name not in rows[variant]:
        raise ValueError(f"{folder} has no column {name!r}")
    value = rows[variant][name][{"(paper)": "paper", "std": "std", "": "mean"}[part]]
    if value is None:
        raise ValueError(f"{folder}: {variant} / {column} is empty")
    return float(value)


def evaluate(root: Path, expr: str, resolve: Callable[[Path, str, str, str], float] | None = None) -> float:
    """The value of a marker's expression (references, numbers, + - * /, abs, min, max); ``resolve``
    reads a reference (``ref_value`` unless given)."""
    values: list[float] = []
    resolve = resolve or ref_value

    def name(m: re.Match) -> str:
        values.append(resolve(root, m["folder"].strip(), m["variant"].strip(), m["column"].strip()))
        return f"_{len(values) - 1}"

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.Name) and node.id.startswith("_"):
            return values[int(node.id[1:])]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.operand))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
            return _FUNCTIONS[node.func.id](*(walk(a) for a in node.args))
        raise ValueError(f"cannot read {ast.unparse(node)!r} in {expr!r}")

    try:
        return walk(ast.parse(REF.sub(name, expr), mode="eval"))
    except SyntaxError:
        raise ValueError(f"cannot read {expr!r}") from None


def matches(number: str, value: float) -> bool:
    """Whether the prose ``number`` is ``value`` rounded to the digits it shows. A zero stands only for
    zero: a non-zero value shown as 0.0 says nothing (and hides an expression off by a scale)."""
    digits = len(number.partition(".")[2])
    shown = float(number.replace(",", ""))
    if shown == 0 and abs(value) > 1e-12:
        return False
    return abs(value - shown) <= 0.5 * 10.0**-digits + 1e-9


def stale_values(text: str, root: Path = ROOT) -> list[str]:
    """One line per marked prose number that differs from its expression or cannot be evaluated, and
    per marker that follows no number (it would check nothing)."""
    problems = []
    bound = {m.start("expr") for m in VALUE.finditer(text)}
    for m in MARKER.finditer(text):
        if m.start("expr") not in bound:
            problems.append(f"line {text.count(chr(10), 0, m.start()) + 1}: a marker right after no number "
                            f"({m[0]})")
    code = [span.span() for span in re.finditer(r"`[^`\n]*`", text)]  # a marker shown in code marks nothing
    for m in re.finditer(re.escape(PAPER), text):
        if not text[:m.start()][-1:].isdigit() and not any(a < m.start() < b for a, b in code):
            problems.append(f"line {text.count(chr(10), 0, m.start()) + 1}: a paper marker right after no number")
    for m in VALUE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        try:
            value = evaluate(root, m["expr"])
        except Exception as err:  # any marker or file fault is a problem line, never a crash
            problems.append(f"line {line}: {m['number']}: {err or type(err).__name__}")
            continue
        if not matches(m["number"], value):
            problems.append(f"line {line}: {m['number']} is not {m['expr']} = {value:.6g}")
    return problems


def stale(root: Path = ROOT) -> list[str]:
    """One line per marked block that is missing its file or differs from it, and per marked prose
    number that no longer equals its source."""
    problems = []
    for doc in documents(root):
        if not doc.exists():
            continue
        problems.extend(f"{doc.name}: {p}" for p in stale_values(doc.read_text(), root))
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


# The unmarked-number rule. Masked first: cited table blocks, code and comments. A result-like number is
# then a decimal with two or more digits after the point (81.23, 0.80) or any decimal with a percent sign
# (94.5%); it must carry a marker right after its digits, ``<!-- = EXPR -->`` (a committed result) or
# ``<!-- paper -->`` (a number quoted from a paper or its authors' code), unless the words right before
# it name a setting or a version (ALLOWED_BEFORE), or it follows such a number in a list ("lr 0.01 and
# 0.001"). docs/reproduction.md is generated from the results and checked whole (GENERATED).
MASKED = re.compile(r"<!-- table: .*?<!-- /table -->|```.*?```|`[^`\n]*`|<!--.*?-->", re.S)
RESULT_LIKE = re.compile(r"(?<![\w./])(?<!\w-)(?P<number>\d[\d,]*\.(?P<digits>\d+))(?P<percent>\s?%)?(?![\d.]\d)")
PAPER = "<!-- paper -->"
ALLOWED_BEFORE = re.compile(r"(?:\b(?:Python|Ray|flwr|lr|rate|Adam|defaults|cosine above|at least|norm about|"
                            r"ln \d+|log \d+)|σ|–,)\s*[(=]?\s*$")  # versions, settings, thresholds, constants
LIST_GAP = re.compile(r"\s*(?:,|and|or|-)\s*")
GENERATED = ("reproduction.md",)


def unmarked_numbers(text: str) -> list[str]:
    """One line per result-like number of ``text`` that carries no source marker (the rule above)."""
    masked = MASKED.sub(lambda m: re.sub(r"[^\n]", " ", m[0]), text)
    plain = text.replace("`", " ")  # a setting's name in code still names it
    problems, allowed_end = [], -1
    for m in RESULT_LIKE.finditer(masked):
        if ALLOWED_BEFORE.search(plain[max(0, m.start() - 24):m.start()]) or (
                allowed_end >= 0 and LIST_GAP.fullmatch(masked[allowed_end:m.start()])):
            allowed_end = m.end("number")
            continue
        allowed_end = -1
        if (len(m["digits"]) < 2 and not m["percent"]) or text.startswith(("<!-- =", PAPER), m.end("number")):
            continue
        problems.append(f"line {text.count(chr(10), 0, m.start()) + 1}: {m['number']} has no source marker")
    return problems


def unmarked(root: Path = ROOT) -> list[str]:
    """Unmarked result-like numbers in README.md and docs/*.md (the generated pages aside)."""
    docs = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return [f"{doc.name}: {p}" for doc in docs if doc.exists() and doc.name not in GENERATED
            for p in unmarked_numbers(doc.read_text())]


def regenerated(folder: Path) -> tuple[str, list[dict]] | str | None:
    """``table.md`` and ``table.json``'s rows of a committed task folder as its task makes them today from
    ``results.json``; a line saying why it cannot (a variant no longer in the task); None for a script's
    table or a folder without results or task."""
    from . import all_tasks
    from .core import _row as row_of, render_markdown

    if not (folder / "results.json").exists() or not (folder / "table.json").exists():
        return None
    table = json.loads((folder / "table.json").read_text())
    task = all_tasks().get(table.get("task", "")) if isinstance(table, dict) else None
    if task is None:
        return None
    runs = json.loads((folder / "results.json").read_text())
    variants = {v.label: v for v in task.variants}
    labels = list(dict.fromkeys(r["variant"] for r in runs))
    if any(label not in variants for label in labels):
        return f"variants {', '.join(sorted(set(labels) - set(variants)))} are no longer in {task.name}"
    rows = [row_of(task, variants[label], [r for r in runs if r["variant"] == label]) for label in labels]
    return render_markdown(task, rows, table["seeds"]), json.loads(json.dumps(rows, default=float))


def table_drift(root: Path = ROOT) -> list[str]:
    """One line per committed ``table.md`` or ``table.json`` that differs from what its task makes of the
    ``results.json`` beside it (a task definition changed since the run, or a table edited by hand)."""
    problems = []
    for folder in sorted((root / "benchmarks" / "results").glob("*/")):
        made = regenerated(folder)
        if isinstance(made, str):
            problems.append(f"{folder.name}: {made}")
        elif made is not None:
            if made[0] != (folder / "table.md").read_text():
                problems.append(f"{folder.name}/table.md differs from its task's rendering of results.json")
            if made[1] != json.loads((folder / "table.json").read_text())["rows"]:
                problems.append(f"{folder.name}/table.json differs from its task's rows of results.json")
    return problems


def seed_excess(root: Path = ROOT) -> list[str]:
    """One line per committed task folder holding a seed its task does not run by default (``fedgl bench
    TASK`` makes seeds 0 to ``seeds`` - 1), so that the command would not make the committed table: raise
    the task's ``seeds`` with the table (as when ``--seeds N --extend`` added seeds to it)."""
    from . import all_tasks

    problems = []
    for path in sorted((root / "benchmarks" / "results").glob("*/results.json")):
        table_file = path.with_name("table.json")
        table = json.loads(table_file.read_text()) if table_file.exists() else None
        task = all_tasks().get(table.get("task", "")) if isinstance(table, dict) else None
        runs = [r for r in json.loads(path.read_text()) if isinstance(r, dict) and "seed" in r]
        if task is not None and runs and (top := max(r["seed"] for r in runs)) >= task.seeds:
            problems.append(f"{path.parent.name}: seed {top} is committed, and {task.name} runs "
                            f"seeds 0-{task.seeds - 1} (its seeds = {task.seeds})")
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
