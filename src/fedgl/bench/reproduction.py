"""docs/reproduction.md: every paper table and figure fedgl has a task for, the paper's number beside
fedgl's committed one and a verdict, written by ``python -m fedgl.bench.reproduction``.

Nothing in the page is typed by hand: the paper's numbers are the references of the task definitions
(``Variant.reference``, the ``(paper)`` columns of the tables), fedgl's are the committed
``benchmarks/results/*/table.json`` (a task's rows may sit in several folders; each row is read from the
folder holding the most runs of it, the task's own folder on a tie). What is compared is listed in
``fedgl.bench.papers``. A task whose results are not committed shows "not run yet" and fills in when
they are; ``tests/test_reproduction.py`` fails when the committed page is not what this module writes.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from ..tables import markdown_table
from . import all_tasks
from .core import BenchTask, Variant, display_scale
from .docs import REF, ROOT, evaluate, ref_value, table_drift
from .papers import NOT_OFFLINE, PAPERS, Item, Measure, Paper

PAGE = Path("docs") / "reproduction.md"
POINTS = 1.0  # tolerance in percentage points (accuracy, F1, AUC and other % columns)
RELATIVE = 0.05  # tolerance as a share of the paper's number (every other column)
REPRODUCED, NOT_RUN, NO_PAPER = "reproduced", "not run yet", "no paper number"
INCONCLUSIVE = "inconclusive: the seeds spread too widely"
NOT_AHEAD = "inconclusive: within the tolerance, but not ahead"
NO_SPREAD = "inconclusive: within the tolerance, with no spread over seeds to judge by"
WIDEST = 5.0  # a seed band (2 x std) wider than this many tolerances decides nothing beyond the tolerance
STALE = "stale: the task changed since this run"
OFFLINE = "cannot run here: dataset not offline"


class Missing(ValueError):
    """A reference whose result is not committed (or empty)."""


def committed(root: Path) -> dict[tuple[str, str], tuple[str, dict[str, Any]]]:
    """Every committed table row by (task, variant): its folder and the row."""
    found: dict[tuple[str, str], tuple[tuple[int, bool], str, dict[str, Any]]] = {}
    for path in sorted((root / "benchmarks" / "results").glob("*/table.json")):
        data = json.loads(path.read_text())
        if not isinstance(data, dict):  # a script's table: no task behind it
            continue
        for row in data["rows"]:
            key = (data["task"], row["variant"])
            rank = (max((c.get("of", 0) for c in row.values() if isinstance(c, dict)), default=0),
                    path.parent.name == data["task"])
            if key not in found or rank > found[key][0]:
                found[key] = (rank, path.parent.name, row)
    return {key: (folder, row) for key, (_, folder, row) in found.items()}


def _percent(task: BenchTask, column: str) -> bool:
    return display_scale(column, task.formats.get(column)) == 100.0 or column.endswith("_pct")


def paper_value(task: BenchTask, variant: Variant, column: str) -> float | None:
    """The paper's number in the table's units (a fraction of one becomes a percentage, as in the tables)."""
    value = variant.reference.get(column)
    if value is None:
        return None
    return 100 * value if task.formats.get(column) is None and "accuracy" in column and value <= 1 else value


def tolerance(task: BenchTask, column: str, paper: float) -> float:
    """The task's own gate where it has one, else 1 point for % columns and 5% of the paper's number."""
    if column in task.tolerance:
        return task.tolerance[column]
    return POINTS if _percent(task, column) else RELATIVE * abs(paper)


def dataset_of(task: BenchTask, variant: Variant) -> str:
    return variant.overrides.get("dataset.name", task.base.get("dataset", {}).get("name", ""))


def _fmt(value: float, spec: str | None, sign: bool = False) -> str:
    """``value`` in the column's format; without one, whole numbers from 1,000 up and 4 significant digits below."""
    value = 0.0 if value == 0 else value  # no "-0.00"
    spec = spec or (",.0f" if abs(value) >= 1000 else ".4g")
    text = f"{value:{'+' if sign else ''}{spec}}"
    return "+0.00" if sign and text == "-0.00" else text


def verdict(diff: float, std: float, tol: float, why: str) -> str:
    """Reproduced when |fedgl - paper| <= max(2 x seed std, tolerance); differs, with the link, beyond. A
    difference beyond the tolerance that only a band of 2 x std wider than ``WIDEST`` tolerances covers is
    inconclusive: such seeds would call almost any paper number reproduced (one collapsed seed suffices)."""
    if abs(diff) <= tol + 1e-9:
        return REPRODUCED
    if abs(diff) > 2 * std + 1e-9:
        return f"differs ([why]({why}))"
    return REPRODUCED if 2 * std <= WIDEST * tol + 1e-9 else f"{INCONCLUSIVE} ([why]({why}))"


def claim_verdict(diff: float, std: float | None, tol: float, why: str, behind: bool = False) -> str:
    """A headline measure, an effect the paper claims (one method ahead of another, a saving): reproduced
    within the tolerance by seeds whose std is within it too; differs beyond both the tolerance and the band
    of 2 x std; inconclusive between, since seeds that spread more than the tolerance show neither the
    claimed effect nor its absence, and within the tolerance where no spread is known (one seed, or an extra
    table's means). A claimed lead that fedgl's value does not show (``behind``) is not reproduced by a
    tolerance wider than the lead itself: inconclusive."""
    if abs(diff) > max(tol, 2 * (std or 0.0)) + 1e-9:
        return f"differs ([why]({why}))"
    if abs(diff) <= tol + 1e-9 and std is None:
        return f"{NO_SPREAD} ([why]({why}))"
    if abs(diff) <= tol + 1e-9 and std <= tol + 1e-9:
        return f"{NOT_AHEAD} ([why]({why}))" if behind else REPRODUCED
    return f"{INCONCLUSIVE} ([why]({why}))"


class Report:
    """The page's rows, read from one repository root."""

    def __init__(self, root: Path = ROOT):
        self.root = root
        self.tasks = all_tasks()
        self.index = committed(root)
        self.stale = {line.split("/")[0].split(":")[0] for line in table_drift(root)}  # folders, as docs names them
        self.results: dict[str, list[dict[str, Any]]] = {}  # each folder's results.json, read once

    def task(self, name: str) -> BenchTask:
        if name not in self.tasks:
            raise ValueError(f"fedgl.bench.papers names {name!r}, which is no bench task")
        return self.tasks[name]

    def resolve(self, root: Path, name: str, label: str, column: str) -> float:
        """A reference of a measure: a committed mean (or std), a task's paper number, or an extra table's cell."""
        if name.endswith(".md"):
            try:
                return ref_value(root, name, label, column)
            except ValueError as err:
                raise Missing(str(err)) from None
        task = self.task(name)
        variant = next((v for v in task.variants if v.label == label), None)
        if variant is None:
            raise ValueError(f"{name} has no variant {label!r}")
        if column.endswith(" (paper)"):
            paper = paper_value(task, variant, column.removesuffix(" (paper)"))
            if paper is None:
                raise Missing(f"{name}: no paper number for {label} / {column}")
            return paper
        part = "std" if column.endswith(" std") else "mean"
        column = column.removesuffix(" std")
        entry = self.index.get((name, label), ("", {}))[1].get(column)
        if entry is None or entry[part] is None:
            raise Missing(f"{name}: {label} / {column} is not committed")
        return entry[part] * display_scale(column, task.formats.get(column))

    def value(self, expr: str) -> float | None:
        try:
            return evaluate(self.root, expr, self.resolve) if expr else None
        except Missing:
            return None

    def runs(self, name: str, label: str) -> dict[int, dict[str, Any]]:
        """The committed runs of a task's variant by seed (from the folder its table row is read from)."""
        folder = self.index.get((name, label), ("", {}))[0]
        path = self.root / "benchmarks" / "results" / folder / "results.json"
        if folder and folder not in self.results:
            self.results[folder] = json.loads(path.read_text()) if path.exists() else []
        return {r["seed"]: r for r in self.results.get(folder, []) if r["variant"] == label}

    def paired(self, expr: str) -> tuple[float | None, list[float], int]:
        """``expr`` over the seeds every result it reads was run with (runs of one seed share their partition,
        so a difference of methods is paired): its value on the results' means over those seeds, its value
        seed by seed, and how many results it reads; no values where they share no seed or it reads
        something without runs (a std, an extra table)."""
        refs = [(m["folder"].strip(), m["variant"].strip(), m["column"].strip()) for m in REF.finditer(expr)]
        ours = [(name, label, column) for name, label, column in refs if not column.endswith(" (paper)")]
        if not ours or any(name.endswith(".md") or column.endswith(" std") for name, _, column in ours):
            return None, [], 0
        runs = {(name, label): self.runs(name, label) for name, label, _ in ours}
        shared = sorted(set.intersection(*(set(by_seed) for by_seed in runs.values())))

        def at(seeds: list[int]) -> float:
            def resolve(root: Path, name: str, label: str, column: str) -> float:
                if column.endswith(" (paper)"):
                    return self.resolve(root, name, label, column)
                values = [runs[(name, label)][seed].get(column) for seed in seeds]
                if None in values:
                    raise Missing(f"{name}: {label} has a seed without {column}")
                return statistics.mean(values) * display_scale(column, self.task(name).formats.get(column))
            return evaluate(self.root, expr, resolve)

        try:
            return (at(shared), [at([seed]) for seed in shared], len(runs)) if shared else (None, [], len(runs))
        except (Missing, ZeroDivisionError):  # a seed without the column, or a ratio over a zero
            return None, [], len(runs)

    def task_rows(self, item: Item) -> list[list[str]]:
        rows = []
        for name in item.tasks:
            task = self.task(name)
            if not item.referenced and not any((name, v.label) in self.index for v in task.variants):
                offline = all(dataset_of(task, v) in NOT_OFFLINE for v in task.variants)
                rows.append([f"`{name}`", f"all {len(task.variants)} variants", ", ".join(item.columns), "", "", "",
                             OFFLINE if offline else NOT_RUN])  # a figure's task not run: one row, no paper number
                continue
            for variant in task.variants:
                for column in item.columns:
                    paper = paper_value(task, variant, column)
                    if paper is not None or not item.referenced:
                        rows.append(self.task_row(task, variant, column, paper, item.links.get(name, item.why)))
        return rows

    def task_row(self, task: BenchTask, variant: Variant, column: str, paper: float | None, why: str) -> list[str]:
        spec = task.formats.get(column) or (".2f" if _percent(task, column) else None)
        shown = "" if paper is None else _fmt(paper, spec or ",g")
        folder, row = self.index.get((task.name, variant.label), (None, None))
        if folder is None or column not in row:
            state = OFFLINE if dataset_of(task, variant) in NOT_OFFLINE else NOT_RUN
            return [f"`{task.name}`", variant.label, column, shown, "", "", state]
        source = f"[{folder}](../benchmarks/results/{folder}/table.md)"
        entry, scale = row[column], display_scale(column, task.formats.get(column))
        if entry["mean"] is None:
            return [source, variant.label, column, shown, f"not reached (0 of {entry['of']} runs)", "",
                    NO_PAPER if paper is None else f"differs ([why]({why}))"]
        mean, std = entry["mean"] * scale, (entry["std"] or 0.0) * scale
        runs = f"{entry['runs']} of {entry['of']} runs" if entry["runs"] < entry["of"] else \
            f"{entry['runs']} seed{'s' if entry['runs'] > 1 else ''}"
        spread = f" ± {_fmt(std, spec or (',.0f' if std >= 100 else '.2g'))}" if entry["runs"] > 1 else ""
        ours = f"{_fmt(mean, spec)}{spread} ({runs})"
        if folder in self.stale:
            return [source, variant.label, column, shown, ours, "", STALE]
        if paper is None:
            return [source, variant.label, column, "", ours, "", NO_PAPER]
        diff = mean - paper
        return [source, variant.label, column, shown, ours, _fmt(diff, spec, sign=True),
                verdict(diff, std, tolerance(task, column, paper), why)]

    def measured(self, measure: Measure) -> str | None:
        """fedgl's expression of ``measure``: against rivals, its method minus the rival best on the committed
        means, the same rival at every seed (None while one of them is not committed)."""
        if not measure.rivals:
            return measure.fedgl
        means = {rival: self.value(rival) for rival in measure.rivals}
        if None in means.values():
            return None
        return f"{measure.fedgl} - {max(means, key=means.get)}"

    def measure_row(self, measure: Measure, why: str) -> list[str]:
        """A headline measure over the seeds its results share (``paired``): its value on their means, its spread
        the std of its values seed by seed; from the committed means, without a spread, where it reads no runs."""
        expr, paper = self.measured(measure), self.value(measure.paper)
        ours, series, reads = self.paired(expr) if expr else (None, [], 0)
        if ours is None:  # no runs it reads, or none of one seed: the measure of the committed means
            ours, series = self.value(expr) if expr else None, []
        std = statistics.stdev(series) if len(series) > 1 else None
        unit = f" {measure.unit}" if measure.unit else ""
        seeds = f"{len(series)} seed{'s' if len(series) > 1 else ''}{', paired' if reads > 1 else ''}"
        band = f"{'' if std is None else f' ± {std:.2f}'}{unit}{f' ({seeds})' if series else ''}"
        cells = [measure.label, "" if paper is None else f"{paper:.2f}{unit}",
                 NOT_RUN if ours is None else f"{ours:.2f}{band}"]
        if ours is None or paper is None:
            return [*cells, "", NOT_RUN if ours is None else NO_PAPER]
        tol = RELATIVE * abs(paper) if measure.unit == "x" else POINTS
        behind = measure.lead and paper > 0 and ours <= 0
        return [*cells, f"{ours - paper:+.2f}", claim_verdict(ours - paper, std, tol, why, behind)]


VERDICTS = (REPRODUCED, "differs", INCONCLUSIVE.split(":")[0], NOT_RUN, OFFLINE, NO_PAPER, STALE.split(":")[0])
TASK_HEADER = ["fedgl result", "variant", "column", "paper", "fedgl (mean ± std over seeds)", "difference", "verdict"]
MEASURE_HEADER = ["measure", "paper", "fedgl", "difference", "verdict"]


def explanation(paper: Paper, measure: Measure) -> str:
    """The docs section a headline measure's difference is explained in: that of the table it reads."""
    for item in paper.items:
        if measure in item.measures:
            return item.why
        for name in item.tasks:
            if f"[{name}|" in measure.fedgl:
                return item.links.get(name, item.why)
    return paper.doc


def paper_section(report: Report, paper: Paper) -> tuple[list[str], Counter]:
    """A paper's section: its headline claim, then one table per paper table or figure."""
    claims = [report.measure_row(m, explanation(paper, m)) for m in paper.measures]
    lines = [f"## {paper.name}", "", f"Paper text: `{paper.text}`; fedgl's explanations: [{paper.doc}]({paper.doc}).",
             "", "### Headline claims", "", f"> {paper.quote}", "", *markdown_table(MEASURE_HEADER, claims), "",
             *([paper.note, ""] if paper.note else [])]
    counts: Counter = Counter()
    for item in paper.items:
        rows = report.task_rows(item)
        extra = [report.measure_row(m, item.why) for m in item.measures]
        counts.update(next(k for k in VERDICTS if row[-1].startswith(k)) for row in [*rows, *extra])
        lines += [f"### {item.title}", "", *([item.note, ""] if item.note else [])]
        lines += [*markdown_table(TASK_HEADER, rows), ""] if rows else []
        lines += [*markdown_table(MEASURE_HEADER, extra), ""] if extra else []
    return lines, counts


INTRO = f"""# Reproduction of the four papers

Generated by `python -m fedgl.bench.reproduction` from the committed bench results; do not edit by hand
(`tests/test_reproduction.py` fails when this page differs from what the generator writes). The paper's numbers
are those the bench tasks carry beside their results (the `(paper)` columns); fedgl's are the committed
`benchmarks/results/*/table.json`, in the units of the task's table (accuracies in %), as the mean ± standard
deviation over the seeds run. A task whose results are not committed yet shows "{NOT_RUN}" and fills in when they
are and the page is generated again.

**Verdict rule.** *{REPRODUCED}* when |fedgl − paper| ≤ max(2 × the seed standard deviation, tolerance); the
tolerance is the task's own gate where it has one ({{gates}}), else {POINTS:g} percentage
point for accuracies, F1, AUC and other percentages, and {RELATIVE:.0%} of the paper's number for every other
column (ratios of the headline claims included). A single seed has no spread, so the tolerance alone decides.
*{INCONCLUSIVE.split(":")[0]}* marks a difference beyond the tolerance that only the seeds' band covers where that
band (2 × std) is wider than {WIDEST:g} tolerances: seeds that spread so widely (one collapsed run is enough) would
call almost any paper number reproduced.
*differs* links the section of the docs that explains the difference; *{OFFLINE}* marks the paper's datasets
that are not available offline here ({', '.join(sorted(NOT_OFFLINE))}); *{NO_PAPER}* marks a figure's curves,
which carry no printed number, and fedgl's rows beside them; *{STALE}* marks a committed result whose task
definition has changed since it ran (its `table.md` is no longer what the task renders; a re-run replaces it). A
headline claim's measures are differences or ratios of those cells, the paper's beside fedgl's. fedgl's value is
the measure over the seeds every result it reads was run with (runs of one seed share their partition, so a
difference between methods is paired): the measure of their means over those seeds (a ratio is a ratio of means),
± the standard deviation of the measure taken seed by seed. "Minus the best baseline" subtracts the baseline best on
fedgl's means, the same one at every seed, as the paper subtracts the best of its table. A measure reading no runs
(an extra table) is the measure of the committed means, without a spread. A measure is an effect the paper claims,
so it is *{REPRODUCED}* only within the tolerance and with a seed standard deviation within it too, *differs*
beyond both the tolerance and 2 × that std, and is *{INCONCLUSIVE.split(":")[0]}* between: seeds that spread more
than the tolerance show neither the effect nor its absence, and a measure within the tolerance with no spread known
(one shared seed, or an extra table) reads *{NO_SPREAD}*. A claimed lead (one method ahead of the others) smaller
than the tolerance is not reproduced by a fedgl value that is not ahead, however close to the paper's number: that
row reads *{NOT_AHEAD}*."""


def render(root: Path = ROOT) -> str:
    report = Report(root)
    sections, summary = [], []
    for paper in PAPERS:
        lines, counts = paper_section(report, paper)
        sections += lines
        summary.append([paper.name, *(str(counts[k]) for k in VERDICTS)])
    header = ["paper", *VERDICTS]
    gates = "; ".join(f"{task.name} {column}: ±{tol:g}" for task in report.tasks.values()
                      for column, tol in task.tolerance.items())
    lines = [INTRO.format(gates=gates), "", "Rows per verdict in the tables below (the headline claims aside):", "",
             *markdown_table(header, summary), "", *sections]
    return "\n".join(lines).rstrip() + "\n"


def write(root: Path = ROOT) -> Path:
    path = root / PAGE
    path.write_text(render(root))
    return path


if __name__ == "__main__":
    print(f"wrote {write()}")
