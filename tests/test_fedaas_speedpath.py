"""FedAAS's faster step changes no result: ``optim.optimizer_step`` (the fused Adam kernel called
directly) against the optimiser's own ``step()``, alone and over FedAAS rounds, bit for bit."""

from __future__ import annotations

import pytest
import torch

from fedgl.config import TrainConfig, build_config
from fedgl.optim import make_optimizer, optimizer_step
from fedgl.protocols.fedaas import client as fedaas_client
from fedgl.runner import Run
from support.configs import fedaas as config


def _params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(40, 8)), torch.nn.Parameter(torch.randn(8)),
            torch.nn.Parameter(torch.randn(3))]


@pytest.mark.parametrize("optimizer, weight_decay", [("adam", 0.0), ("adam", 5e-4), ("sgd", 5e-4)])
def test_optimizer_step_is_the_optimisers_own_step(optimizer, weight_decay):
    train = TrainConfig(optimizer=optimizer, lr=0.01, weight_decay=weight_decay)
    ours, theirs = _params(), _params()
    opt_ours, opt_theirs = make_optimizer(ours, train), make_optimizer(theirs, train)
    own_step, calls = opt_ours.step, []
    opt_ours.step = lambda: calls.append(1) or own_step()
    for k in range(5):
        grads = [torch.randn_like(p) for p in ours]
        for params, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            opt.zero_grad()
            for i, (p, g) in enumerate(zip(params, grads)):
                p.grad = None if (k == 2 and i == 2) else g.clone()  # a parameter without a gradient is skipped
        optimizer_step(opt_ours)
        opt_theirs.step()
        for a, b in zip(ours, theirs):
            assert torch.equal(a, b)
    assert len(calls) == (1 if optimizer == "adam" else 5)  # Adam's own step only makes its moments
    for a, b in zip(ours, theirs):
        for key, value in opt_theirs.state[b].items():
            assert torch.equal(opt_ours.state[a][key], value), key


def _final_model(tmp_path, protocol: dict) -> dict[str, torch.Tensor]:
    job = Run(build_config(config(protocol, rounds=2)), tmp_path)
    for index in (1, 2):
        job.transport.set_round(index)
        job.protocol.train_round(index)
    state = job.protocol.model.state_dict()
    job.transport.close()
    return state


@pytest.mark.parametrize("protocol", [{"sampling": "attention", "between_sync": "history"},
                                      {"sampling": "uniform", "query_gradient": "exact", "root": False}])
def test_fedaas_rounds_equal_those_with_the_optimisers_own_step(tmp_path, monkeypatch, protocol):
    fast = _final_model(tmp_path / "fast", protocol)
    monkeypatch.setattr(fedaas_client, "optimizer_step", lambda opt: opt.step())
    plain = _final_model(tmp_path / "plain", protocol)
    assert fast.keys() == plain.keys()
    for key, value in plain.items():
        assert torch.equal(fast[key], value), key
