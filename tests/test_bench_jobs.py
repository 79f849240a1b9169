"""A bench task's runs spread over worker processes or Ray tasks give the folders and numbers of one
run after another; a failed run is named while the others finish."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedgl.bench.core import COST, BenchTask, Variant, run_task
from fedgl.errors import ConfigError, RunFailed

# measured durations: the only values that differ from one execution of a run to the next
TIMING = {"wall_time_s", "wall_ms_per_round", "compute_s_by_party", "cpu_s"}

TINY = BenchTask(
    name="tiny", description="two variants on a small synthetic graph",
    base={"dataset": {"name": "synthetic", "options": {"num_nodes": 200, "num_features": 16}},
          "partition": {"num_clients": 3}, "model": {"hidden": 16}, "train": {"rounds": 3},
          "network": {"compute": "ignore"}, "protocol": {"name": "fedavg"}},
    variants=[Variant("gcn"), Variant("sage", {"model.name": "sage"})],
    columns=["test_accuracy", "bytes_total"], seeds=2)


def _contents(path: Path, root: Path) -> object:
    """A result file as compared: JSON without measured durations, with the task folder's own path
    written as ROOT; anything else as its bytes."""
    text = path.read_bytes()
    if path.suffix not in (".json", ".jsonl"):
        return text
    text = text.decode().replace(str(root), "ROOT")
    rows = [json.loads(line) for line in text.splitlines()] if path.suffix == ".jsonl" else json.loads(text)
    return _without_timing(rows)


def _without_timing(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_timing(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [_without_timing(v) for v in value]
    return value


def _folder(root: Path) -> dict[str, object]:
    return {p.relative_to(root).as_posix(): _contents(p, root) for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != COST}


@pytest.fixture(scope="module")
def sequential(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sequential")
    run_task(TINY, out)
    return out


def _same_as(sequential: Path, out: Path, executor: str) -> None:
    expected, found = _folder(sequential), _folder(out)
    assert len(expected) == 3 + 4 * 5  # results.json, table.json, table.md; 4 runs of 5 files each
    assert found.keys() == expected.keys()
    for name in expected:
        assert found[name] == expected[name], f"{name} differs from the sequential run's"
    cost = json.loads((out / COST).read_text())
    assert cost["executor"] == executor and cost["ran"] == cost["runs"] == 4 and cost["cpu_s"] > 0
    assert cost["wall_s"] > 0


def test_two_jobs_give_the_sequential_folders(sequential, tmp_path, capsys):
    run_task(TINY, tmp_path, jobs=2)
    _same_as(sequential, tmp_path, "processes")
    out = capsys.readouterr().out
    assert "tiny: run 4/4" in out  # one progress display for the task
    run_task(TINY, tmp_path, jobs=2)  # every run is reused: nothing starts
    assert "(reused)" in capsys.readouterr().out


@pytest.mark.ray
@pytest.mark.slow  # starts a Ray instance of its own: tens of seconds
def test_ray_tasks_give_the_sequential_folders(sequential, tmp_path, ray_session):
    run_task(TINY, tmp_path, executor="ray")
    _same_as(sequential, tmp_path, "ray")


def unlucky(cfg) -> dict[str, float]:
    """A summary without training, except that seed 1 fails."""
    if cfg.seed == 1:
        raise ValueError("seed 1 is unlucky")
    return {"value": float(cfg.seed)}


def test_a_failed_run_is_named_and_the_others_finish(tmp_path, capsys):
    task = BenchTask(name="unlucky", description="", base={"dataset": {"name": "synthetic"}},
                     variants=[Variant("only")], columns=["value"], seeds=3, compute=unlucky)
    with pytest.raises(RunFailed, match="1 of 3 runs failed"):
        run_task(task, tmp_path, executor="processes")  # one worker process, which goes on after the failure
    assert "fedgl: bench: only seed 1 failed: ValueError: seed 1 is unlucky" in capsys.readouterr().err
    assert [p.name for p in sorted((tmp_path / "runs").iterdir())] == ["only-seed0", "only-seed2"]
    assert not (tmp_path / "table.json").exists()  # no table from part of the runs


def test_the_party_backend_and_the_executor_are_not_mixed(tmp_path):
    with pytest.raises(ConfigError, match="use one or the other"):
        run_task(TINY, tmp_path, jobs=2, backend="ray")
    with pytest.raises(ConfigError, match="--jobs must be at least 1"):
        run_task(TINY, tmp_path, jobs=0)


def test_the_command_line_names_a_cluster_without_its_executor(capsys, tmp_path):
    from fedgl.cli import main

    assert main(["bench", "foundation-cora", "--cluster", "127.0.0.1:6379", "--out", str(tmp_path)]) == 2
    assert "--cluster names the Ray cluster of --executor ray" in capsys.readouterr().err
    assert main(["bench", "foundation-cora", "--jobs", "0", "--out", str(tmp_path)]) == 2
    assert "--jobs must be at least 1 (got 0)" in capsys.readouterr().err
