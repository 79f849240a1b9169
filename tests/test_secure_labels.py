"""A retry reloads the checkpoint into the live server: the secure-sum labels used since then must stay
used, or every client that was not revived refuses the next sum (a repeated label would reuse masks)."""

from __future__ import annotations

import pytest

from fedgl.config import build_config
from fedgl.runner import Run
from support.configs import fedaas, tiny

SECURE = {"privacy": {"secure_aggregation": True}}
SETTINGS = {
    "fedavg": tiny("fedavg-secure", train={"rounds": 1}, checkpoint_every=1),
    "swift": tiny("swift", **SECURE, partition={"num_clients": 4}, train={"rounds": 1}, checkpoint_every=1),
    "fedaas": {**fedaas({}, rounds=1), **SECURE, "checkpoint_every": 1},
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_a_retry_from_the_checkpoint_keeps_the_labels_used_since(name, tmp_path):
    job = Run(build_config(SETTINGS[name]), tmp_path / "run")
    job.execute(progress=False)
    job.protocol.train_round(2)  # the round a failure interrupts: its sums' labels are used
    used = job.protocol.sums
    assert used > 0
    assert job.resume() and job.protocol.sums == used
    job.protocol.train_round(2)  # every client answers: no label is asked for twice
    assert job.protocol.sums > used
