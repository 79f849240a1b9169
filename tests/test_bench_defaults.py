"""The ``defaults`` bench task: every registered protocol, nothing set but protocol and dataset."""

from __future__ import annotations

import json
from pathlib import Path

from fedgl.bench import get_task
from fedgl.bench.core import variant_config
from fedgl.bench.defaults import DATASETS
from fedgl.config.registry import REGISTRY


def test_defaults_task_runs_every_registered_protocol_on_every_dataset_at_its_defaults():
    task = get_task("defaults")
    assert {v.label for v in task.variants} == {f"{d} {p}" for d in DATASETS for p in REGISTRY}
    for variant in task.variants:
        assert set(variant.overrides) == {"dataset.name", "protocol.name"}
        cfg = variant_config(task, variant, 0, {})
        assert (cfg.protocol_name, cfg.dataset.name) == (variant.overrides["protocol.name"],
                                                         variant.overrides["dataset.name"])
    assert {"test_accuracy", "final_train_loss", "bytes_total"} <= set(task.columns)


def test_a_run_summary_keeps_the_last_rounds_training_loss(tmp_path):
    from fedgl import api
    from fedgl.results import read_jsonl

    result = api.run(out_dir=tmp_path / "run", train__rounds=2)
    last = read_jsonl(tmp_path / "run" / "metrics.jsonl")[-1]
    assert result.summary["final_train_loss"] == last["train_loss"] > 0


def test_a_protocol_fills_the_settings_its_defaults_need_and_keeps_given_ones(tmp_path):
    """At its defaults LLCG trains the paper's GraphSAGE (the shared GCN is refused) and FedAAS's clients
    hold every node but the test nodes (its server-side interval loss reads those); a given setting is kept, and
    refused in one line where it does not fit."""
    import pytest

    from fedgl.config import build_config
    from fedgl.errors import ConfigError
    from fedgl.runner import Run

    llcg = build_config({"protocol": {"name": "llcg"}})
    assert llcg.model.name == "sage" and build_config({"protocol": {"name": "fedavg"}}).model.name == "gcn"
    for name in ("fedaas", "fedaas2"):
        assert build_config({"protocol": {"name": name}}).partition.client_nodes == "non-test"
    assert build_config({"protocol": {"name": "fedaas", "interval_loss": "train"}}).partition.client_nodes == "all"
    given = {"dataset": {"name": "synthetic", "options": {"num_nodes": 120}}, "train": {"rounds": 1}}
    with pytest.raises(ConfigError, match="model.name 'gcn' cannot be split"):
        Run(build_config({**given, "protocol": {"name": "llcg"}, "model": {"name": "gcn"}}), tmp_path)
    with pytest.raises(ConfigError, match="interval_loss 'server' needs held-out nodes"):
        Run(build_config({**given, "protocol": {"name": "fedaas"}, "partition": {"client_nodes": "all"}}), tmp_path)


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "defaults"


def test_the_committed_defaults_table_has_every_protocol_on_every_dataset():
    runs = json.loads((RESULTS / "results.json").read_text())
    assert sorted(r["variant"] for r in runs) == sorted(f"{d} {p}" for d in DATASETS for p in REGISTRY)


def test_every_protocol_learns_at_its_defaults(data_root):
    """Each committed run at the defaults beats always answering its test split's most common class by 10
    points: a protocol whose defaults leave it at chance on a dataset fails here (docs/defaults.md)."""
    from fedgl.data import load_dataset

    runs = json.loads((RESULTS / "results.json").read_text())
    for dataset in DATASETS:
        data = load_dataset(dataset, str(data_root))
        labels = data.y[data.test_mask]
        majority = labels.bincount().max().item() / labels.numel()
        for run in (r for r in runs if r["dataset"] == dataset):
            assert run["test_accuracy"] >= majority + 0.10, (run["variant"], run["test_accuracy"], majority)
