"""``device``: parties compute on their device, and a run there equals the same run on the CPU.

The fake accelerator (``support/fake_device``) checks every operation as an accelerator would while
computing on the CPU, so these tests run on any machine; the last test runs where CUDA is present.
"""

from __future__ import annotations

import math

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


def test_moving_a_graph_leaves_the_original_where_it_was(monkeypatch):
    """``Data.to`` replaces the tensors of the object it is called on; ``move`` must not."""
    from torch_geometric.data import Data

    from fedgl import device as devices

    data = Data(x=torch.ones(2, 3), edge_index=torch.tensor([[0], [1]]))
    with fake_accelerator(monkeypatch) as device:
        moved = devices.move({"graph": data}, device)["graph"]
        assert moved.x.device == device and moved.edge_index.device == device
        assert data.x.device.type == "cpu" and data.edge_index.device.type == "cpu"


# every protocol, with what it needs to run on three clients
PROTOCOLS = {"centralized": {}, "fedavg": {}, "glasu": {"batches": 2}, "nfedgnn": {}, "cnfgnn": {},
             "swift": {"K": 1}, "fedgnn-g": {}, "fedgnn-pns": {}, "llcg": {"local_steps": 1},
             "fedaas": {"interval_loss": "train", "batches": 2}}


def _observed(result) -> tuple[list[dict], list[dict]]:
    """A run's metric rows (without wall time, which no two runs share) and its ledger."""
    return [{k: v for k, v in row.items() if k != "wall_time_s"} for row in result.metrics], result.ledger()


def _run(tmp_path, name, protocol, **overrides):
    config = {"protocol": {"name": protocol, **PROTOCOLS[protocol]}}
    if protocol == "llcg":
        config["model"] = {"name": "sage"}
    return _observed(fedgl.run(config, out_dir=tmp_path / name, **SMALL, **overrides))


# Each protocol family once in the default suite; the others with the slow tests.
DEFAULT_DEVICE = ("centralized", "fedavg", "glasu", "nfedgnn", "swift", "fedaas")


def _default_or_slow(names, default=DEFAULT_DEVICE):
    return [n if n in default else pytest.param(n, marks=pytest.mark.slow) for n in names]


@pytest.mark.parametrize("protocol", _default_or_slow(PROTOCOLS))
def test_a_run_on_the_accelerator_equals_the_run_on_the_cpu(tmp_path, monkeypatch, protocol):
    cpu = _run(tmp_path, "cpu", protocol)
    with fake_accelerator(monkeypatch):
        accelerated = _run(tmp_path, "acc", protocol, device="cuda")
    assert accelerated == cpu


# Cora's bag-of-words features take the sparse paths (CSR inputs and the transposes their backward
# builds), which the synthetic graph's dense features do not; with the options that change the draws
SPARSE = {"glasu": {"name": "glasu", "batches": 4}, "glasu nodewise": {"name": "glasu", "batches": 4,
          "sampling": "nodewise"}, "glasu exact": {"name": "glasu", "batches": 4, "backward": "exact", "Q": 1},
          "fedavg": {"name": "fedavg"}, "swift": {"name": "swift", "K": 1}, "nfedgnn": {"name": "nfedgnn"},
          "fedaas": {"name": "fedaas", "interval_loss": "train", "batches": 4}}


@pytest.mark.parametrize("variant", _default_or_slow(SPARSE, ("glasu", "fedavg")))
def test_sparse_features_on_the_accelerator_equal_the_cpu(data_root, tmp_path, monkeypatch, variant):
    config = {"dataset": {"name": "cora", "data_root": str(data_root)}, "protocol": SPARSE[variant],
              "partition": {"num_clients": 3}, "train": {"rounds": 2}, "network": {"compute": "ignore"}}

    def run(name, **overrides):
        return _observed(fedgl.run(config, out_dir=tmp_path / name, **overrides))
    cpu = run("cpu")
    with fake_accelerator(monkeypatch):
        assert run("acc", device="cuda") == cpu


PRIVATE = {"secure_aggregation": True, "dp": {"noise_multiplier": 0.5, "max_norm": 1.0, "replayable_noise": True}}


@pytest.mark.parametrize("protocol", _default_or_slow(["fedavg", "glasu", "nfedgnn", "swift", "fedaas"],
                                                     ("fedavg", "glasu")))
def test_private_runs_on_the_accelerator_equal_the_cpu(tmp_path, monkeypatch, repeatable_keys, protocol):
    """Secure aggregation's masks and DP noise from a party's noise stream are drawn on the CPU, other
    draws where the party computes; the run equals its CPU run."""
    privacy = {k: v for k, v in PRIVATE.items() if k != "secure_aggregation" or protocol != "nfedgnn"}
    # nFedGNN's default λ search is refused under DP (each candidate would spend the budget again)
    fixed = {"protocol__lam": 1.0} if protocol == "nfedgnn" else {}
    cpu = _run(tmp_path, "cpu", protocol, privacy=privacy, **fixed)
    repeatable_keys()
    with fake_accelerator(monkeypatch):
        accelerated = _run(tmp_path, "acc", protocol, privacy=privacy, device="cuda", **fixed)
    assert accelerated == cpu


@pytest.mark.slow
def test_parties_hold_and_roll_back_on_the_accelerator(tmp_path, monkeypatch):
    """FedAAS's tau_0 grid tries every interval from one held state and rolls back each time."""
    grid = {"protocol": {"name": "fedaas", "tau0": "grid", "batches": 2}, "partition": {"client_nodes": "train"}}
    one_round = SMALL | {"train__rounds": 1}
    cpu = fedgl.run(grid, out_dir=tmp_path / "cpu", **one_round)
    with fake_accelerator(monkeypatch):
        accelerated = fedgl.run(grid, out_dir=tmp_path / "acc", device="cuda", **one_round)
    assert accelerated.summary["tau0"] == cpu.summary["tau0"]
    assert accelerated.ledger() == cpu.ledger()


def test_a_resumed_accelerator_run_equals_an_uninterrupted_one(tmp_path, monkeypatch):
    with fake_accelerator(monkeypatch):
        whole = _run(tmp_path, "whole", "swift", device="cuda")
        fedgl.run({"protocol": {"name": "swift", "K": 1}}, out_dir=tmp_path / "cut", device="cuda",
                  **(SMALL | {"train__rounds": 2}), checkpoint_every=1)
        result = fedgl.run(tmp_path / "cut" / "config.yaml", out_dir=tmp_path / "cut", resume=True, train__rounds=3)
    assert _observed(result)[0] == whole[0]


def test_a_checkpoint_resumes_only_on_its_own_device(tmp_path, monkeypatch):
    fedgl.run({"protocol": {"name": "swift", "K": 1}}, out_dir=tmp_path, **(SMALL | {"train__rounds": 2}),
              checkpoint_every=1)
    with fake_accelerator(monkeypatch), pytest.raises(fedgl.errors.ConfigError, match="made with device: cpu"):
        fedgl.run(tmp_path / "config.yaml", out_dir=tmp_path, resume=True, device="cuda", train__rounds=3)


def test_device_cuda_without_cuda_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(fedgl.errors.ConfigError, match="device: cuda: torch sees no CUDA device"):
        fedgl.run(None, device="cuda", **SMALL)
    with pytest.raises(fedgl.errors.ConfigError, match=r"invalid config: device: String should match pattern"):
        fedgl.run(None, device="gpu", **SMALL)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_a_ray_cluster_without_gpus_refuses_in_one_line(ray_session, tmp_path):
    """Hosts ask Ray for a share of a GPU; with none in the cluster they could never start."""
    with pytest.raises(fedgl.errors.ConfigError, match="device: cuda: the Ray cluster offers no GPU"):
        fedgl.run(None, out_dir=tmp_path, device="cuda", backend__name="ray", **SMALL)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_every_protocol_trains_on_cuda(tmp_path, protocol):
    """On a real GPU: every protocol runs and learns as on the CPU. GPU random streams differ from the
    CPU's, so only messages whose size no draw decides are compared byte for byte."""
    cpu, _ = _run(tmp_path, "cpu", protocol)
    cuda, _ = _run(tmp_path, "cuda", protocol, device="cuda")
    assert all(math.isfinite(row["train_loss"]) for row in cuda)
    assert cuda[-1]["train_loss"] < cuda[0]["train_loss"]
    if protocol in ("centralized", "fedavg", "nfedgnn", "cnfgnn"):
        assert [row["bytes_total"] for row in cuda] == [row["bytes_total"] for row in cpu]
    if cpu[-1]["test_accuracy"] > 0.6:  # those that clear chance (1/3) well within three rounds
        assert cuda[-1]["test_accuracy"] > 0.5
