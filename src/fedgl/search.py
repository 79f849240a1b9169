"""A run that chooses a setting on validation: one whole run per candidate, the best one kept.

A protocol whose config leaves a setting to be chosen (nFedGNN's ``lam: auto``) names the keys and their
candidates (``Protocol.search_space``), as its paper tunes them per dataset. Each candidate trains as a run
of its own in ``search/<key=value>/`` with the run's seed; the candidate of best validation accuracy (the
first on ties) is the run's result. Every candidate's messages were sent, so the run's ledger holds them all
(each row names its candidate) and its bytes, simulated time and wall time are their sums; its curves are
the chosen candidate's, counted from the bytes and time the others took. A finished candidate folder made
with the same config is reused, so an interrupted search continues where it stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .config import RunConfig, build_config
from .config.candidates import candidates, label, search_space
from .config.identity import config_hash
from .data import load_data
from .errors import ConfigError
from .results import CONFIG, FINISHED, LEDGER, METRICS, SUMMARY, load_run, read_jsonl, write_json, write_jsonl
from .runner import CHECKPOINT, Run, RunResult, default_out_dir

SEARCH = "search"
SUMMED = ("bytes_total", "eval_bytes", "sim_time_s", "wall_time_s")  # what every candidate adds to the run's cost


def _finished(folder: Path, cfg: RunConfig) -> RunResult | None:
    """The candidate run finished in ``folder`` with this very config (not merely a resumable one: a run of
    fewer rounds is continued, not kept)."""
    if not (folder / FINISHED).exists() or not (folder / CONFIG).exists():
        return None
    if build_config(yaml.safe_load((folder / CONFIG).read_text())).model_dump() != cfg.model_dump():
        return None
    summary, metrics = load_run(folder)
    return RunResult(folder, summary, metrics)


def _summed(values: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for value in values:
        for key, amount in value.items():
            out[key] = out.get(key, 0) + amount
    return out


class Search:
    """The run of a config with a search space; it answers as a ``Run`` does (``execute``, ``resume``,
    ``completed``, ``start_round``, ``out_dir``, ``close``)."""

    def __init__(self, cfg: RunConfig, out_dir: str | Path | None = None, *, data=None):
        if cfg.privacy.dp is not None:
            raise ConfigError(f"{', '.join(search_space(cfg))}: auto trains once per candidate, each spending the "
                              f"privacy budget again; under privacy.dp set a value")
        self.cfg = cfg
        self.out_dir = Path(out_dir) if out_dir else default_out_dir(cfg)
        self.candidates = candidates(cfg)
        self.choices = [choice for choice, _ in self.candidates]
        self.data = data if data is not None or cfg.backend.shards else load_data(cfg)
        self.resuming = False
        self.reuse = True  # finished candidate folders of the same config
        self.start_round, self.completed = 1, 0  # of the candidate training now

    def folder(self, choice: dict[str, Any]) -> Path:
        return self.out_dir / SEARCH / label(choice)

    def resume(self) -> bool:
        """Continue the candidate a checkpoint was left in; finished candidates are reused in any case."""
        self.resuming = any((self.folder(c) / CHECKPOINT).exists() for c in self.choices)
        return self.resuming

    def close(self) -> None:
        """Nothing stays open between candidates: each run stops its parties when it ends."""

    def execute(self, progress: bool = True) -> RunResult:
        (self.out_dir / FINISHED).unlink(missing_ok=True)
        results = [self._candidate(choice, cfg, progress) for choice, cfg in self.candidates]
        best = max(range(len(results)), key=lambda i: (results[i].summary["best_val_accuracy"] or 0.0, -i))
        summary, metrics = self._combine(results, best)
        (self.out_dir / CONFIG).write_text(yaml.safe_dump(self.cfg.model_dump(mode="json"), sort_keys=False))
        write_jsonl(self.out_dir / METRICS, metrics)
        write_jsonl(self.out_dir / LEDGER, [row | {"candidate": label(choice)} for choice, result in
                                            zip(self.choices, results) for row in read_jsonl(result.out_dir / LEDGER)])
        write_json(self.out_dir / SUMMARY, summary)
        (self.out_dir / FINISHED).write_text(config_hash(self.cfg) + "\n")
        return RunResult(self.out_dir, summary, metrics)

    def _candidate(self, choice: dict[str, Any], cfg: RunConfig, progress: bool) -> RunResult:
        folder = self.folder(choice)
        done = _finished(folder, cfg) if self.reuse else None
        if done is not None:
            return done
        job = Run(cfg, folder, data=self.data)
        job.title += f", {label(choice)} ({self.choices.index(choice) + 1} of {len(self.choices)})"
        if self.resuming and (folder / CHECKPOINT).exists():
            job.resume()
        self.start_round = job.start_round
        try:
            return job.execute(progress=progress)
        finally:
            self.completed = job.completed

    def _combine(self, results: list[RunResult], best: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The chosen candidate's summary and curves, with the cost of the whole search."""
        chosen = results[best].summary
        before = {key: sum(r.summary[key] or 0 for i, r in enumerate(results) if i != best) for key in SUMMED}
        metrics = [row | {"bytes_total": row["bytes_total"] + before["bytes_total"],
                          "sim_time_s": row["sim_time_s"] + before["sim_time_s"]} for row in results[best].metrics]
        summary = chosen | {key: (chosen[key] or 0) + before[key] for key in SUMMED} | {
            "bytes_by_kind": _summed([r.summary["bytes_by_kind"] for r in results]),
            "bytes_by_direction": _summed([r.summary["bytes_by_direction"] for r in results]),
            "compute_s_by_party": _summed([r.summary["compute_s_by_party"] for r in results]),
            "bytes_at_target": None if chosen["bytes_at_target"] is None else
            chosen["bytes_at_target"] + before["bytes_total"],
            "sim_time_at_target_s": None if chosen["sim_time_at_target_s"] is None else
            chosen["sim_time_at_target_s"] + before["sim_time_s"],
            "chosen": self.choices[best],
            "search": [{"choice": choice, "folder": f"{SEARCH}/{label(choice)}",
                        **{key: r.summary[key] for key in ("best_val_accuracy", "test_accuracy", "bytes_total")}}
                       for choice, r in zip(self.choices, results)],
            "config_hash": config_hash(self.cfg),
        }
        return summary, metrics


def open_run(cfg: RunConfig, out_dir: str | Path | None = None, *, data=None) -> Run | Search:
    """The run of ``cfg``: a ``Search`` where the config leaves a setting to choose, else a ``Run``."""
    return (Search if search_space(cfg) else Run)(cfg, out_dir, data=data)


def run(cfg: RunConfig, out_dir: str | Path | None = None, *, resume: bool = False, progress: bool = False,
        data=None) -> RunResult:
    """Build and execute a run (or search); with ``resume`` continue from the folder's last checkpoint."""
    job = open_run(cfg, out_dir, data=data)
    if resume and not job.resume():
        job.close()
        raise ConfigError(f"cannot resume: {job.out_dir} holds no checkpoint")
    return job.execute(progress=progress)
