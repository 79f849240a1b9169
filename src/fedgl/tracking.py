"""Experiment tracking: a run's metrics, bytes, config, summary and plots sent to TensorBoard, MLflow or
Weights & Biases, chosen by the config's ``logging`` list.

Each backend is an optional package, imported only when a run names it, so a missing one fails with one
line before training starts. Every tracker receives the same calls: ``start`` with the flattened config,
``log_round`` after every evaluated round (the metric row and the cumulative training bytes by kind) and
``finish`` with the summary and the plot files (summary ``None``: the run ended by an error).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, ClassVar

from .errors import ConfigError

PROJECT = "fedgl"  # MLflow experiment and W&B project, unless configured otherwise


def _scalars(values: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a dict (bools and nested values are left out)."""
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def round_scalars(metrics: dict[str, Any], bytes_by_kind: dict[str, int]) -> dict[str, float]:
    """What one evaluated round logs: its metric row (without the round number) and ``bytes/<kind>``."""
    return {**_scalars({k: v for k, v in metrics.items() if k != "round"}),
            **{f"bytes/{kind}": float(n) for kind, n in bytes_by_kind.items()}}


def _require(module: str, tracker: str, install: str):
    """Import a backend's package, or fail with one line saying what to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"logging: {tracker} needs the {module} package: pip install {install}") from None


class Tracker:
    """One tracking backend; ``first_round`` > 1 when the run resumes from a checkpoint."""

    name: ClassVar[str]

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir

    def start(self, config: dict[str, Any], first_round: int = 1) -> None:
        raise NotImplementedError

    def log_round(self, round_index: int, metrics: dict[str, Any], bytes_by_kind: dict[str, int]) -> None:
        raise NotImplementedError

    def finish(self, summary: dict[str, Any] | None, artifacts: list[Path]) -> None:
        raise NotImplementedError


class TensorBoardTracker(Tracker):
    """Scalars per round, the config and summary as text and the plots as images under ``<out>/tensorboard``."""

    name = "tensorboard"

    def __init__(self, out_dir: Path):
        super().__init__(out_dir)
        _require("tensorboard", self.name, "'fedgl[tracking]'")
        from torch.utils.tensorboard import SummaryWriter

        self._writer_class = SummaryWriter

    def start(self, config: dict[str, Any], first_round: int = 1) -> None:
        # A resumed run hides what an earlier attempt logged after its checkpoint.
        self.writer = self._writer_class(str(self.out_dir / "tensorboard"),
                                         purge_step=first_round if first_round > 1 else None)
        self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in sorted(config.items())))

    def log_round(self, round_index: int, metrics: dict[str, Any], bytes_by_kind: dict[str, int]) -> None:
        for key, value in round_scalars(metrics, bytes_by_kind).items():
            self.writer.add_scalar(key, value, round_index)
        self.writer.flush()

    def finish(self, summary: dict[str, Any] | None, artifacts: list[Path]) -> None:
        if summary is not None:
            import matplotlib.image

            step = summary.get("rounds") or 0
            self.writer.add_text("summary", "    " + json.dumps(summary, indent=2, default=str).replace("\n", "\n    "),
                                 step)
            for path in artifacts:
                if path.suffix == ".png":
                    self.writer.add_image(path.stem, matplotlib.image.imread(path), step, dataformats="HWC")
        self.writer.close()


class MLflowTracker(Tracker):
    """One MLflow run: params from the config, metrics per round, the summary's numbers as metrics and
    ``summary.json`` and the plots as artifacts. Without ``MLFLOW_TRACKING_URI`` the store is local:
    ``<out>/mlruns/mlflow.db`` (SQLite; MLflow refuses plain file stores) with artifacts beside it."""

    name = "mlflow"

    def __init__(self, out_dir: Path):
        super().__init__(out_dir)
        _require("mlflow", self.name, "'fedgl[tracking]'")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self._metric, self._param = Metric, Param
        store = out_dir.resolve() / "mlruns"
        self.uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{store / 'mlflow.db'}"
        self.artifacts = None if os.environ.get("MLFLOW_TRACKING_URI") else store.as_uri()
        self._client_class = MlflowClient

    def start(self, config: dict[str, Any], first_round: int = 1) -> None:
        (self.out_dir / "mlruns").mkdir(parents=True, exist_ok=True)
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # "creating tables" on every new store
        self.client = client = self._client_class(tracking_uri=self.uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT)
        experiment = client.get_experiment_by_name(name)
        experiment_id = (experiment.experiment_id if experiment else
                         client.create_experiment(name, artifact_location=self.artifacts))
        folder = str(self.out_dir.resolve())
        earlier = client.search_runs([experiment_id], f"tags.`fedgl.out_dir` = '{folder}'", max_results=1) \
            if first_round > 1 else []
        if earlier:  # a resumed run continues its MLflow run; its params were logged at the start
            self.run_id = earlier[0].info.run_id
            client.update_run(self.run_id, status="RUNNING")
            return
        self.run_id = client.create_run(experiment_id, run_name=self.out_dir.name,
                                        tags={"fedgl.out_dir": folder}).info.run_id
        params = [self._param(k, json.dumps(v) if isinstance(v, (list, dict)) else str(v))
                  for k, v in sorted(config.items())]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            client.log_batch(self.run_id, params=params[i:i + 100])

    def _log(self, values: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self._metric(k, v, now, step) for k, v in values.items()])

    def log_round(self, round_index: int, metrics: dict[str, Any], bytes_by_kind: dict[str, int]) -> None:
        self._log(round_scalars(metrics, bytes_by_kind), round_index)

    def finish(self, summary: dict[str, Any] | None, artifacts: list[Path]) -> None:
        if summary is None:
            self.client.set_terminated(self.run_id, status="FAILED")
            return
        self._log({f"summary/{k}": v for k, v in _scalars(summary).items()}, summary.get("rounds") or 0)
        self.client.log_dict(self.run_id, summary, "summary.json")
        for path in artifacts:
            self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, status="FINISHED" if summary.get("finished") else "KILLED")


class WandbTracker(Tracker):
    """A W&B run in ``<out>/wandb``; offline (synced later with ``wandb sync``) unless ``WANDB_MODE`` says
    otherwise; project ``WANDB_PROJECT`` or fedgl."""

    name = "wandb"

    def __init__(self, out_dir: Path):
        super().__init__(out_dir)
        self.wandb = _require("wandb", self.name, "wandb")

    def start(self, config: dict[str, Any], first_round: int = 1) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.run = self.wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=self.out_dir.name,
                                   dir=str(self.out_dir), config=config,
                                   mode=os.environ.get("WANDB_MODE", "offline"))

    def log_round(self, round_index: int, metrics: dict[str, Any], bytes_by_kind: dict[str, int]) -> None:
        self.run.log(round_scalars(metrics, bytes_by_kind), step=round_index)

    def finish(self, summary: dict[str, Any] | None, artifacts: list[Path]) -> None:
        if summary is not None:
            self.run.summary.update(_scalars(summary))
            self.run.log({path.stem: self.wandb.Image(str(path)) for path in artifacts if path.suffix == ".png"})
        self.run.finish(exit_code=0 if summary and summary.get("finished") else 1)


TRACKERS: dict[str, type[Tracker]] = {t.name: t for t in (TensorBoardTracker, MLflowTracker, WandbTracker)}


class Tracking:
    """The trackers a run's ``logging`` names, driven together; ``finish`` acts once."""

    def __init__(self, names: list[str], out_dir: Path):
        self.trackers = [TRACKERS[name](out_dir) for name in dict.fromkeys(names) if name in TRACKERS]
        self.finished = False

    def start(self, config: dict[str, Any], first_round: int = 1) -> None:
        self.finished = False
        for tracker in self.trackers:
            tracker.start(config, first_round)

    def log_round(self, round_index: int, metrics: dict[str, Any], bytes_by_kind: dict[str, int]) -> None:
        for tracker in self.trackers:
            tracker.log_round(round_index, metrics, bytes_by_kind)

    def finish(self, summary: dict[str, Any] | None, artifacts: list[Path]) -> None:
        if self.finished:
            return
        self.finished = True
        for tracker in self.trackers:
            tracker.finish(summary, artifacts)
