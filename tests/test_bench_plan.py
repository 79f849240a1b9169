"""``fedgl bench TASK --plan``: the runs a task would make, each with its wall time estimated from its
variant's runs in results.json, and nothing run."""

from __future__ import annotations

import json
import shutil

from fedgl.bench.core import BenchTask, Variant, run_task
from fedgl.bench.estimate import makespan


def _task() -> BenchTask:
    return BenchTask(
        name="tiny-plan", description="two variants on a small synthetic graph",
        base={"dataset": {"name": "synthetic", "options": {"num_nodes": 200, "num_features": 16}},
              "partition": {"num_clients": 3}, "model": {"hidden": 16}, "train": {"rounds": 2},
              "network": {"compute": "ignore"}, "protocol": {"name": "fedavg"}},
        variants=[Variant("gcn"), Variant("sage", {"model.name": "sage"})], columns=["test_accuracy"], seeds=1)


def test_the_pool_lays_the_runs_out_in_order_on_the_first_free_worker() -> None:
    assert makespan([10.0, 10.0, 10.0], 2) == 20.0
    assert makespan([30.0, 10.0, 10.0, 10.0], 2) == 30.0
    assert makespan([10.0, 30.0, 10.0], 1) == 50.0


def test_a_plan_estimates_the_new_seeds_from_the_committed_runs_and_runs_nothing(tmp_path, capsys) -> None:
    out = tmp_path / "task"
    run_task(_task(), out, only=["gcn"])
    shutil.rmtree(out / "runs")
    before = (out / "results.json").read_text()
    rows = json.loads(before)
    rows[0]["wall_time_s"] = 600.0  # a committed gcn run of ten minutes
    (out / "results.json").write_text(json.dumps(rows))
    capsys.readouterr()
    planned = run_task(_task(), out, seeds=3, extend=True, jobs=2, plan=True)
    said = " ".join(capsys.readouterr().out.split())  # as one line, however the console wrapped it
    assert planned["to_run"] == ["gcn seed 1", "gcn seed 2", "sage seed 0", "sage seed 1", "sage seed 2"]
    assert "5 runs to make, 1 reused" in said
    assert "about 20 minutes of runs, about 10 minutes of wall time with 2 at once" in said
    assert "3 runs without an estimate left out" in said  # sage has no run to estimate from
    assert not (out / "runs").exists() and json.loads((out / "results.json").read_text()) == rows
    # another config (here another learning rate) is not estimated from runs that computed something else
    run_task(_task(), out, seeds=3, extend=True, overrides={"train.lr": 0.02}, plan=True)
    assert "no run in results.json computed what these will" in " ".join(capsys.readouterr().out.split())
    # nor is a run ten times as long estimated from a shorter one (rounds are not part of a config's hash)
    run_task(_task(), out, seeds=3, extend=True, overrides={"train.rounds": 20}, plan=True)
    assert "no run in results.json computed what these will" in " ".join(capsys.readouterr().out.split())


def test_a_shorter_run_estimates_only_a_run_that_stops_at_the_same_target() -> None:
    from fedgl.bench.core import as_long, variant_config
    task = _task()
    plain = variant_config(task, task.variants[0], 0, {"train.rounds": 10})
    stops = variant_config(task, task.variants[0], 0, {"train.rounds": 10, "eval.target_val_accuracy": 0.5,
                                                       "eval.stop_at_target": True})
    reached, short = {"rounds": 4, "round_at_target": 4}, {"rounds": 4, "round_at_target": None}
    assert as_long({"rounds": 10}, plain) and not as_long(reached, plain)
    assert as_long(reached, stops) and not as_long(short, stops) and not as_long({"rounds": 12}, stops)


def test_a_plan_writes_nothing(tmp_path) -> None:
    planned = run_task(_task(), tmp_path / "new", plan=True)
    assert planned["to_run"] == ["gcn seed 0", "sage seed 0"] and not (tmp_path / "new").exists()
