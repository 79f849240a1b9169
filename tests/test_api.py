"""The Python API: a script needs nothing but ``import fedgl``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fedgl


def test_a_script_runs_reads_and_repeats_a_run(data_root, tmp_path):
    result = fedgl.run("examples/fedavg-cora.yaml", out_dir=tmp_path / "first", train__rounds=5,
                       dataset__data_root=str(data_root))
    summary = result.summary
    assert summary["rounds"] == 5 and 0.3 < summary["best_val_accuracy"] <= 1
    assert summary["bytes_by_kind"]["model"] > 0
    assert sum(r["bytes"] for r in result.ledger()) == summary["bytes_total"] + summary["eval_bytes"]
    again = fedgl.run(result.config_path, out_dir=tmp_path / "again")
    timing = {"wall_time_s", "sim_time_s"}  # measured compute: the same work, not the same seconds
    assert [{k: v for k, v in row.items() if k not in timing} for row in again.metrics] == \
        [{k: v for k, v in row.items() if k not in timing} for row in result.metrics]


def test_configs_from_dicts_and_overrides():
    cfg = fedgl.load_config({"protocol": {"name": "swift"}, "model": {"name": "sage"}}, protocol__K=2,
                            partition__num_clients=4)
    assert cfg.protocol["K"] == 2 and cfg.partition.num_clients == 4
    assert fedgl.load_config(cfg, seed=3).seed == 3 and cfg.seed == 0
    with pytest.raises(fedgl.errors.ConfigError, match="train.lr"):
        fedgl.load_config(train__lr=-1)


def test_bad_configs_and_overrides_are_one_line_errors():
    with pytest.raises(fedgl.errors.ConfigError, match="got int"):
        fedgl.load_config(5)
    with pytest.raises(fedgl.errors.ConfigError, match="train is not a section"):
        fedgl.load_config({"train": 5}, train__rounds=1)
    with pytest.raises(fedgl.errors.ConfigError, match="train__rounds"):
        fedgl.load_config(**{"train.rounds": 3})


def test_a_finished_run_is_replaced_only_when_asked_and_resume_needs_a_checkpoint(tmp_path):
    tiny = {"dataset": {"options": {"num_nodes": 300}}, "train": {"rounds": 2}}
    first = fedgl.run(tiny, out_dir=tmp_path / "run")
    with pytest.raises(fedgl.errors.ConfigError, match="holds a finished run; pass overwrite=True"):
        fedgl.run(tiny, out_dir=tmp_path / "run", seed=5)
    assert first.summary == fedgl.run(tiny, out_dir=tmp_path / "run", overwrite=True).summary | {
        k: first.summary[k] for k in ("wall_time_s", "wall_ms_per_round", "sim_time_s", "compute_s_by_party")}
    with pytest.raises(fedgl.errors.ConfigError, match="resume=True needs out_dir"):
        fedgl.run(tiny, resume=True)
    with pytest.raises(fedgl.errors.ConfigError, match="no checkpoint"):
        fedgl.run(tiny, out_dir=tmp_path / "empty", resume=True)


@pytest.mark.slow  # starts Ray or trains on real data for seconds: with the slow tests
def test_the_example_script_runs_and_repeats_itself(data_root, tmp_path):
    script = Path(__file__).resolve().parents[1] / "examples" / "api_fedavg_cora.py"
    assert "from fedgl" not in script.read_text()  # the public API only
    proc = subprocess.run([sys.executable, str(script), "3"], cwd=tmp_path, capture_output=True, text=True,
                          env=os.environ | {"FEDGL_DATA_ROOT": str(data_root)}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "best validation accuracy" in proc.stdout and "model:" in proc.stdout and "same result" in proc.stdout
    assert len(list((tmp_path / "results").iterdir())) == 2


def test_datasets_partition_and_protocols_are_reachable_from_the_package():
    data = fedgl.datasets.load_dataset("synthetic", num_nodes=120, seed=1)
    parts = fedgl.partition.partition_horizontal(data, 3, "random", seed=1)
    assert parts.num_clients == 3 and sum(s.num_nodes for s in parts.shards) == data.num_nodes
    assert fedgl.protocols.protocol_class("fedavg").name == "fedavg"
    with pytest.raises(AttributeError):
        fedgl.no_such_thing


def test_a_run_refused_after_its_parties_started_stops_them(monkeypatch, tmp_path):
    """A notebook that gets a one-line error keeps no parties (on Ray: no actors holding data)."""
    from fedgl.comm.transport import Transport

    closed = []
    monkeypatch.setattr(Transport, "close", lambda self: closed.append(self))
    with pytest.raises(fedgl.errors.ConfigError, match="no party nobody"):
        fedgl.run({"dataset": {"options": {"num_nodes": 300}}, "backend": {"parties": {"nobody": {"node": "x"}}}},
                  out_dir=tmp_path / "run")
    assert len(closed) == 1


def test_a_setting_the_run_never_reads_is_a_warning(tmp_path):
    with pytest.warns(fedgl.UnreadSetting, match=r"partition.edge_drop \(0.2\) is not read: .* glasu splits features"):
        fedgl.run(None, out_dir=tmp_path, protocol__name="glasu", partition__edge_drop=0.2, train__rounds=1,
                  dataset__options={"num_nodes": 120})
