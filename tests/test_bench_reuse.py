"""``extend``: a bench task adds seeds to a results folder that keeps only its results.json (as committed):
the runs it lists are reused when they compute what the task asks, and run again when they do not; without
``extend`` (reproducing a committed table) every run is made again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fedgl.bench.core import BenchTask, Variant, committed_summary, run_task
from fedgl.errors import ConfigError


def _task(drawn: list[Path], variants: list[Variant] | None = None) -> BenchTask:
    return BenchTask(
        name="tiny-reuse", description="one variant on a small synthetic graph",
        base={"dataset": {"name": "synthetic", "options": {"num_nodes": 200, "num_features": 16}},
              "partition": {"num_clients": 3}, "model": {"hidden": 16}, "train": {"rounds": 3},
              "network": {"compute": "ignore"}, "protocol": {"name": "fedavg"}},
        variants=variants or [Variant("gcn")], columns=["test_accuracy", "bytes_total"], seeds=1, finish=drawn.append)


def _committed(tmp_path: Path, drawn: list[Path]) -> tuple[Path, list[dict]]:
    """A task folder as committed: results.json and the tables, no run folders."""
    out = tmp_path / "task"
    run_task(_task(drawn), out)
    shutil.rmtree(out / "runs")
    return out, json.loads((out / "results.json").read_text())


def _rows(out: Path) -> dict[int, dict]:
    return {r["seed"]: r for r in json.loads((out / "results.json").read_text())}


def test_a_committed_run_is_reused_and_only_the_new_seed_runs(tmp_path, capsys):
    drawn: list[Path] = []
    out, before = _committed(tmp_path, drawn)
    assert len(drawn) == 1  # the first invocation drew its figures
    capsys.readouterr()
    run_task(_task(drawn), out, seeds=2, extend=True)
    said = capsys.readouterr().out
    assert "gcn seed 0 (reused from results.json)" in said and "figures not redrawn" in said
    assert not (out / "runs" / "gcn-seed0").exists()  # not run again
    assert (out / "runs" / "gcn-seed1" / "metrics.jsonl").is_file()
    rows = _rows(out)
    assert rows[0] == before[0]  # the committed row, as it was
    assert len(drawn) == 1  # the figures need seed 0's folder, which is not here
    assert json.loads((out / "table.json").read_text())["seeds"] == 2


@pytest.mark.parametrize("change", [{"train.lr": 0.02}, {"train.rounds": 2}])
def test_a_committed_run_of_another_config_or_length_runs_again(tmp_path, capsys, change):
    drawn: list[Path] = []
    out, _ = _committed(tmp_path, drawn)
    capsys.readouterr()
    run_task(_task(drawn), out, overrides=change, extend=True)
    assert "reused" not in capsys.readouterr().out
    assert (out / "runs" / "gcn-seed0" / "metrics.jsonl").is_file()
    assert _rows(out)[0]["rounds"] == change.get("train.rounds", 3)
    assert len(drawn) == 2  # every run has its folder again


@pytest.mark.parametrize("how", [{}, {"rerun": True, "extend": True}])
def test_without_extend_or_with_rerun_the_committed_runs_run_again(tmp_path, capsys, how):
    drawn: list[Path] = []
    out, _ = _committed(tmp_path, drawn)
    capsys.readouterr()
    run_task(_task(drawn), out, **how)
    assert "reused" not in capsys.readouterr().out and (out / "runs" / "gcn-seed0").is_dir()
    assert len(drawn) == 2


def test_an_unreadable_results_file_is_named(tmp_path):
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(ConfigError, match="results.json is not valid JSON"):
        run_task(_task([]), tmp_path, extend=True)


def test_a_run_made_before_a_protocol_option_existed_is_reused_where_it_behaved_as_asked():
    """FedAAS's ``sync_counter`` arrived after runs that counted as ``round`` does (its ``earlier``): a row
    hashed without the key is today's ``round`` run, and never today's ``global`` one."""
    from fedgl.config import build_config
    from fedgl.config.identity import hash_without

    def cfg(counter: str):
        return build_config({"dataset": {"name": "synthetic"}, "train": {"rounds": 3},
                             "protocol": {"name": "fedaas", "sync_counter": counter}})

    old = {"variant": "v", "seed": 0, "rounds": 3, "finished": True,
           "config_hash": hash_without(cfg("round"), {"protocol.sync_counter"})}
    assert committed_summary(old, cfg("round")) is not None
    assert committed_summary(old, cfg("global")) is None
    assert committed_summary(old | {"finished": False}, cfg("round")) is None


def test_a_run_hashed_before_a_key_was_declared_added_is_reused():
    """GLASU's ``inference`` was hashed at its value from its arrival until it joined ``ADDED_KEYS`` (which
    leaves such keys out at the value earlier runs behaved as): a row of that time is today's run."""
    import hashlib

    from fedgl.config import build_config
    from fedgl.config.identity import ADDED_KEYS, flat_config, resumable_change

    def cfg(inference: str):
        return build_config({"dataset": {"name": "synthetic"}, "train": {"rounds": 3},
                             "protocol": {"name": "glasu", "inference": inference}})

    flat = flat_config(cfg("full"))
    hashed = {"protocol.inference", "protocol.train_clients"}  # both joined ADDED_KEYS in one change
    kept = {k: v for k, v in flat.items() if not resumable_change(k)
            and (k in hashed or not (k in ADDED_KEYS and ADDED_KEYS[k] == v))}
    then = hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]
    row = {"variant": "v", "seed": 0, "rounds": 3, "finished": True, "config_hash": then}
    assert committed_summary(row, cfg("full")) is not None
    assert committed_summary(row, cfg("sampled")) is None


def test_the_committed_runs_hashed_then_are_reused():
    """glasu-centralized-gap's committed seed-0 runs were made in that window: --extend keeps every one."""
    from fedgl.bench import get_task
    from fedgl.bench.core import committed_summaries, plan_runs, select_variants

    task = get_task("glasu-centralized-gap")
    folder = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / task.name
    listed = committed_summaries(folder)
    jobs = plan_runs(task, select_variants(task, None), 1, {}, folder)
    assert jobs and all(committed_summary(listed[(job.variant, 0)], job.cfg) is not None for job in jobs)


def test_the_command_line_refuses_extend_with_rerun(capsys):
    from fedgl.cli import main

    assert main(["bench", "foundation-cora", "--extend", "--rerun"]) != 0
    assert "choose one" in capsys.readouterr().err


def test_extending_some_variants_keeps_the_listed_runs_of_the_others(tmp_path, capsys):
    drawn: list[Path] = []
    two = [Variant("gcn"), Variant("sage", {"model.name": "sage"})]
    out = tmp_path / "task"
    run_task(_task(drawn, two), out)
    shutil.rmtree(out / "runs")
    before = {(r["variant"], r["seed"]): r for r in json.loads((out / "results.json").read_text())}
    run_task(_task(drawn, two), out, seeds=2, only=["sage"], extend=True)
    after = {(r["variant"], r["seed"]): r for r in json.loads((out / "results.json").read_text())}
    assert list(after) == [("gcn", 0), ("sage", 0), ("sage", 1)]  # the task's order, then by seed
    assert after[("gcn", 0)] == before[("gcn", 0)] and after[("sage", 0)] == before[("sage", 0)]
    table = json.loads((out / "table.json").read_text())
    assert [row["variant"] for row in table["rows"]] == ["gcn", "sage"] and table["seeds"] == 2
    assert [row["test_accuracy"]["runs"] for row in table["rows"]] == [1, 2]
    assert len(drawn) == 1 and "figures not redrawn: 2 runs" in capsys.readouterr().out
