"""The privacy bench tasks (fedgl.bench.privacy): every variant builds a valid config, and the audit
task trains, audits and tables a run the way `fedgl bench privacy-audit` does."""

from __future__ import annotations

import json

from fedgl.bench import get_task, run_task
from fedgl.bench.core import variant_config
from fedgl.bench.privacy import TASKS

SYNTHETIC = {"name": "synthetic", "options": {"num_nodes": 300, "num_features": 16, "avg_degree": 8}}


def test_every_privacy_task_builds_its_configs():
    for name, task in TASKS.items():
        assert get_task(name) is task
        for variant in task.variants:
            cfg = variant_config(task, variant, 0, {})
            assert cfg.dataset.name == "cora"
            if name == "privacy-audit":
                assert cfg.privacy.record_messages and cfg.eval.every == cfg.train.rounds


def test_the_audit_task_tables_what_the_audit_recovers(tmp_path):
    task = get_task("privacy-audit")
    result = run_task(task, tmp_path, only=["LLCG"],
                      overrides={"dataset": SYNTHETIC, "train.rounds": 2, "eval.every": 2, "protocol.local_steps": 2})
    row = result["rows"][0]
    assert row["variant"] == "LLCG" and row["raw_row_match"]["mean"] > 0 and row["labels"]["mean"] > 0
    assert row["raw_row_match attacked"]["mean"] == 300
    (run,) = json.loads((tmp_path / "results.json").read_text())
    assert run["audit"]["flagged"] == [] and set(run["audit"]["attacks"]) >= {"masking", "noise_replay"}
    assert "| LLCG | 2 ± 0 |" in (tmp_path / "table.md").read_text()
