"""Runs that survive faults: a lost Ray party under each policy, and kills during checkpointing."""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest
import torch

from fedgl.config import build_config
from fedgl.errors import RunFailed
from fedgl.runner import CHECKPOINT, Run

BASE = {"dataset": {"options": {"num_nodes": 400}}, "partition": {"num_clients": 4},
        "protocol": {"name": "fedavg", "group_size": 1}, "train": {"rounds": 6}, "checkpoint_every": 1,
        "network": {"compute": "ignore"}}


def config(**backend):
    return build_config({**BASE, "backend": {"name": "ray", "actors": 2, **backend}})


def kill_host_before_round(job: Run, round_index: int, host: int = 1) -> None:
    """Kill the Ray actor hosting half the clients when round ``round_index`` starts (once)."""
    inner = job.protocol.train_round
    state = {"done": False}

    def train_round(r):
        if r == round_index and not state["done"]:
            state["done"] = True
            job.transport._ray.kill(job.transport._hosts[host], no_restart=True)
        return inner(r)

    job.protocol.train_round = train_round


def same_trajectory(a: list[dict], b: list[dict]) -> None:
    assert [r["round"] for r in a] == [r["round"] for r in b]
    for x, y in zip(a, b):
        for key in ("train_loss", "val_accuracy", "test_accuracy", "bytes_total"):
            assert x[key] == y[key], (key, x["round"], x[key], y[key])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> list[dict]:
    local = build_config({**BASE, "checkpoint_every": 0})
    return Run(local, tmp_path_factory.mktemp("straight")).execute(progress=False).metrics


@pytest.mark.ray
@pytest.mark.slow
def test_retry_recreates_the_party_and_equals_an_uninterrupted_run(ray_session, tmp_path):
    """With secure aggregation: keys are not checkpointed, so the revived parties' new keys are agreed
    again before the federation restarts from the checkpoint."""
    secure = {"privacy": {"secure_aggregation": True}}
    straight = Run(build_config({**BASE, **secure, "checkpoint_every": 0}), tmp_path / "straight")
    job = Run(build_config({**BASE, **secure, "backend": {"name": "ray", "actors": 2, "on_client_failure": "retry"}}),
              tmp_path / "retried")
    kill_host_before_round(job, 4)
    result = job.execute(progress=False)
    assert result.summary["retries"] == 1 and result.summary["finished"]
    same_trajectory(straight.execute(progress=False).metrics, result.metrics)


@pytest.mark.ray
@pytest.mark.slow
def test_stop_leaves_a_checkpoint_that_resumes_to_the_same_run(ray_session, tmp_path, uninterrupted):
    job = Run(config(), tmp_path)
    kill_host_before_round(job, 4)
    with pytest.raises(RunFailed) as failure:
        job.execute(progress=False)
    message = str(failure.value)
    assert len(message.splitlines()) == 1 and "round 4" in message and "--resume" in message
    assert json.loads((tmp_path / "summary.json").read_text())["finished"] is False
    resumed = Run(config(), tmp_path)
    assert resumed.resume() and resumed.start_round == 4
    same_trajectory(uninterrupted, resumed.execute(progress=False).metrics)


@pytest.mark.ray
@pytest.mark.slow
def test_skip_continues_without_the_lost_clients(ray_session, tmp_path):
    job = Run(config(on_client_failure="skip"), tmp_path)
    kill_host_before_round(job, 3)
    result = job.execute(progress=False)
    lost = {entry["party"] for entry in result.summary["lost_parties"]}
    assert lost == {"client1", "client3"} and result.summary["rounds"] == 6  # actor 1 hosted clients 1 and 3
    rows = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert {r["src"] for r in rows if r["method"] == "lost"} == lost
    late = {r["dst"] for r in rows if r["round"] > 3 and r["kind"] == "model" and r["direction"] == "down"}
    assert late == {"client0", "client2"}
    assert result.metrics[-1]["train_loss"] < result.metrics[0]["train_loss"]


def test_skip_and_retry_are_checked_before_the_run(tmp_path):
    from fedgl.errors import ConfigError

    with pytest.raises(ConfigError, match="cannot continue without a client"):
        Run(build_config({**BASE, "protocol": {"name": "centralized"}, "backend": {"on_client_failure": "skip"}}),
            tmp_path / "a")
    with pytest.raises(ConfigError, match="set checkpoint_every"):
        Run(build_config({**BASE, "checkpoint_every": 0, "backend": {"on_client_failure": "retry"}}), tmp_path / "b")


@pytest.mark.slow
def test_kills_during_checkpointing_never_leave_a_corrupt_checkpoint(tmp_path):
    """20 SIGKILLs at random moments of a run that checkpoints every round: each time, the folder
    holds a checkpoint that resumes (or none yet)."""
    cfg = build_config({**BASE, "train": {"rounds": 10_000}, "backend": {"name": "local"}})
    rng = random.Random(0)
    loaded = 0
    for attempt in range(20):
        out = tmp_path / f"kill{attempt}"
        pid = os.fork()
        if pid == 0:  # the child trains until killed
            try:
                torch.set_num_threads(1)
                Run(cfg, out).execute(progress=False)
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.3, 1.5))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        if (out / CHECKPOINT).exists():
            job = Run(cfg, out)
            assert job.resume() and job.start_round > 1
            job.transport.close()
            loaded += 1
    assert loaded >= 10, f"only {loaded} of 20 kills came after a first checkpoint"

