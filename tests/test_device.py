"""``device``: parties compute on their device, and a run there equals the same run on the CPU.

The fake accelerator (``support/fake_device``) checks every operation as an accelerator would while
computing on the CPU, so these tests run on any machine; the last test runs where CUDA is present.
"""

from __future__ import annotations

import pytest
import torch

import fedgl
from support.fake_device import fake_accelerator

SMALL = {"dataset__name": "synthetic", "dataset__options": {"num_nodes": 300, "num_features": 24, "num_classes": 3},
         "train__rounds": 3, "partition__num_clients": 3, "network__compute": "ignore"}
def test_the_stand_in_accelerator_refuses_what_an_accelerator_refuses(monkeypatch):
    with fake_accelerator(monkeypatch) as device:
        x = torch.ones(3, device=device)
        assert torch.equal((x * 2)[torch.tensor([0, 2])].cpu(), torch.full((2,), 2.0))  # CPU indices are fine
        with pytest.raises(RuntimeError, match="same device"):
            x + torch.ones(3)
        with pytest.raises(RuntimeError, match="generator"):
            torch.rand(3, device=device, generator=torch.Generator())
        with pytest.raises(TypeError, match="numpy"):
            x.numpy()


# every protocol, with what it needs to run on three clients
PROTOCOLS = {"centralized": {}, "fedavg": {}, "glasu": {}, "nfedgnn": {}, "cnfgnn": {}, "swift": {"K": 1},
             "fedgnn-g": {}, "fedgnn-pns": {}, "llcg": {"local_steps": 1}, "fedaas": {"interval_loss": "train"}}


def _run(tmp_path, name, protocol, **overrides):
    config = {"protocol": {"name": protocol, **PROTOCOLS[protocol]}}
    if protocol == "llcg":
        config["model"] = {"name": "sage"}
    result = fedgl.run(config, out_dir=tmp_path / name, **SMALL, **overrides)
    return [{k: v for k, v in row.items() if k != "wall_time_s"} for row in result.metrics], result.ledger()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_run_on_the_accelerator_equals_the_run_on_the_cpu(tmp_path, monkeypatch, protocol):
    cpu = _run(tmp_path, "cpu", protocol)
    with fake_accelerator(monkeypatch):
        accelerated = _run(tmp_path, "acc", protocol, device="cuda")
    assert accelerated == cpu


PRIVATE = {"secure_aggregation": True, "dp": {"noise_multiplier": 0.5, "max_norm": 1.0}}


@pytest.mark.parametrize("protocol", ["fedavg", "glasu", "nfedgnn", "swift", "fedaas"])
def test_private_runs_on_the_accelerator_equal_the_cpu(tmp_path, monkeypatch, repeatable_keys, protocol):
    """Masks, clipping and noise are drawn where the party computes, in the same order."""
    privacy = {k: v for k, v in PRIVATE.items() if k != "secure_aggregation" or protocol != "nfedgnn"}
    cpu = _run(tmp_path, "cpu", protocol, privacy=privacy)
    repeatable_keys()
    with fake_accelerator(monkeypatch):
        accelerated = _run(tmp_path, "acc", protocol, privacy=privacy, device="cuda")
    assert accelerated == cpu


def test_parties_hold_and_roll_back_on_the_accelerator(tmp_path, monkeypatch):
    """FedAAS's tau_0 grid tries every interval from one held state and rolls back each time."""
    grid = {"protocol": {"name": "fedaas", "tau0": "grid"}, "partition": {"client_nodes": "train"}}
    cpu = fedgl.run(grid, out_dir=tmp_path / "cpu", **SMALL)
    with fake_accelerator(monkeypatch):
        accelerated = fedgl.run(grid, out_dir=tmp_path / "acc", device="cuda", **SMALL)
    assert accelerated.summary["tau0"] == cpu.summary["tau0"]
    assert accelerated.ledger() == cpu.ledger()


def test_a_resumed_accelerator_run_equals_an_uninterrupted_one(tmp_path, monkeypatch):
    with fake_accelerator(monkeypatch):
        whole = _run(tmp_path, "whole", "swift", device="cuda")
        fedgl.run({"protocol": {"name": "swift", "K": 1}}, out_dir=tmp_path / "cut", device="cuda",
                  **(SMALL | {"train__rounds": 2}), checkpoint_every=1)
        result = fedgl.run(tmp_path / "cut" / "config.yaml", out_dir=tmp_path / "cut", resume=True, train__rounds=3)
    assert [{k: v for k, v in row.items() if k != "wall_time_s"} for row in result.metrics] == whole[0]


def test_device_cuda_without_cuda_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(fedgl.errors.ConfigError, match="device: cuda: torch sees no CUDA device"):
        fedgl.run(None, device="cuda", **SMALL)
    with pytest.raises(fedgl.errors.ConfigError, match="device"):
        fedgl.run(None, device="gpu", **SMALL)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_ray_host_without_cuda_refuses_in_one_line(ray_session, tmp_path):
    """Each host resolves the device where its parties live; the refusal reaches the driver as it was."""
    with pytest.raises(fedgl.errors.ConfigError, match="device: cuda: torch sees no CUDA device"):
        fedgl.run(None, out_dir=tmp_path, device="cuda", backend__name="ray", **SMALL)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_every_protocol_trains_on_cuda(tmp_path, protocol):
    """On a real GPU: every protocol runs, learns like its CPU run and sends the same bytes."""
    cpu, cpu_ledger = _run(tmp_path, "cpu", protocol)
    cuda, cuda_ledger = _run(tmp_path, "cuda", protocol, device="cuda")
    assert [row["bytes_total"] for row in cuda] == [row["bytes_total"] for row in cpu]
    assert cuda[-1]["train_loss"] < cuda[0]["train_loss"] * 1.05
    assert abs(cuda[-1]["test_accuracy"] - cpu[-1]["test_accuracy"]) < 0.1
