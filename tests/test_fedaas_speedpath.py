"""FedAAS's faster step changes no result: ``optim.optimizer_step`` (the fused Adam kernel called
directly) against the optimiser's own ``step()``, alone and over FedAAS rounds, bit for bit; and
``optim.restart_optimizer`` (last round's Adam, zeroed in place) against a new Adam."""

from __future__ import annotations

import pytest
import torch

from fedgl.config import TrainConfig, build_config
from fedgl.optim import make_optimizer, optimizer_step, restart_optimizer
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


def _steps(params, opt, grads) -> None:
    for k, step in enumerate(grads):
        opt.zero_grad()
        for i, (p, g) in enumerate(zip(params, step)):
            p.grad = None if (k == 0 and i == 2) else g.clone()  # a parameter whose moments start late
        optimizer_step(opt)


def test_a_restarted_adam_steps_as_a_new_one():
    train = TrainConfig(optimizer="adam", lr=0.01, weight_decay=5e-4)
    ours, theirs = _params(), _params()
    grads = [[torch.randn_like(p) for p in ours] for _ in range(4)]
    opt = make_optimizer(ours, train)
    _steps(ours, opt, grads[:3])
    with torch.no_grad():
        for a, b in zip(ours, theirs):
            b.copy_(a)  # the round starts from the same parameters
    restarted = restart_optimizer(opt, ours, train)
    assert restarted is opt
    new = make_optimizer(theirs, train)
    _steps(ours, restarted, grads)
    _steps(theirs, new, grads)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)
        for key, value in new.state[b].items():
            assert torch.equal(restarted.state[a][key], value), key


def test_an_optimiser_that_does_not_fit_is_made_anew():
    adam, sgd = TrainConfig(optimizer="adam", lr=0.01), TrainConfig(optimizer="sgd", lr=0.01)
    params = _params()
    opt = make_optimizer(params, adam)
    assert restart_optimizer(None, params, adam) is not None
    assert restart_optimizer(opt, _params(), adam) is not opt  # other parameters
    assert restart_optimizer(opt, params, TrainConfig(optimizer="adam", lr=0.02)) is not opt
    assert isinstance(restart_optimizer(opt, params, sgd), torch.optim.SGD)


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
