"""Experiment tracking: what one run logs to TensorBoard and MLflow is read back and equals its folder."""

from __future__ import annotations

import sys

import pytest

import fedgl
from fedgl.errors import ConfigError
from fedgl.results import read_jsonl

TINY = {"dataset": {"options": {"num_nodes": 300}}, "partition": {"num_clients": 3}, "train": {"rounds": 3},
        "checkpoint_every": 1, "logging": ["tensorboard", "mlflow"]}


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A run of three rounds, then resumed from its checkpoint for a fourth."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    out = tmp_path_factory.mktemp("tracked")
    fedgl.run(TINY, out_dir=out)
    return out, fedgl.run(TINY, out_dir=out, resume=True, train__rounds=4)


@pytest.mark.slow  # starts Ray or trains on real data for seconds: with the slow tests
def test_tensorboard_events_equal_the_metrics(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, result = tracked
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0, "images": 0}).Reload()
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [row["round"] for row in metrics] == [1, 2, 3, 4]
    for key in ("val_accuracy", "test_accuracy", "train_loss", "bytes_total"):
        logged = [(e.step, e.value) for e in events.Scalars(key)]
        assert logged == [(row["round"], pytest.approx(row[key], rel=1e-6)) for row in metrics], key
    model_bytes = [e.value for e in events.Scalars("bytes/model")]
    assert model_bytes[-1] == result.summary["bytes_by_kind"]["model"] and model_bytes == sorted(model_bytes)
    assert "curves" in events.Tags()["images"] and "config" in str(events.Tags()["tensors"])


def test_mlflow_run_equals_the_metrics_and_holds_config_summary_and_plots(tracked):
    from mlflow.tracking import MlflowClient

    out, result = tracked
    client = MlflowClient(tracking_uri=f"sqlite:///{out.resolve() / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("fedgl")
    (run,) = client.search_runs([experiment.experiment_id])  # the resumed run continued the same MLflow run
    assert run.info.status == "FINISHED"
    for key in ("val_accuracy", "test_accuracy"):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert history == [(row["round"], row[key]) for row in result.metrics], key
    assert run.data.params["train.rounds"] == "3" and run.data.params["partition.num_clients"] == "3"
    assert run.data.metrics["summary/best_val_accuracy"] == result.summary["best_val_accuracy"]
    assert run.data.metrics["bytes/model"] == result.summary["bytes_by_kind"]["model"]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"curves.png", "summary.json"} <= artifacts


def test_a_missing_tracker_package_is_one_line_naming_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails as if not installed
    with pytest.raises(ConfigError, match=r"^logging: wandb needs the wandb package: pip install wandb$"):
        fedgl.run(TINY | {"logging": ["wandb"]}, out_dir=tmp_path)
    with pytest.raises(ConfigError, match="logging"):
        fedgl.load_config(logging=["neptune"])
