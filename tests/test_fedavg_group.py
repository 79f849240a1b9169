"""Batched client groups: the same trajectories, optimiser states and ledger as one party per client."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fedgl.protocols.fedavg.group import NARROW_OUTPUT, ClientGroupTrainer, batched_linear, flat_state
from fedgl.config import ModelConfig, TrainConfig, build_config
from fedgl.errors import ConfigError
from fedgl.models import build_model
from fedgl.protocols.fedavg.client import FedAvgGroup
from fedgl.runner import Run, load_data
from fedgl.protocols.local_training import LocalTrainer

ROUNDS = 3
# Losses and parameters agree to float rounding (measured: within 2e-7); Adam can turn rounding in a
# near-zero gradient into a step of up to lr * 1e-2, hence the margin of atol 1e-4.
LOSS_RTOL = 1e-5
PARAM_TOL = 1e-4


def cfg_for(data_root, model: str, group_size: int | None, fraction: float = 1.0, **protocol):
    return build_config({
        "dataset": {"name": "cora", "data_root": str(data_root)},
        "partition": {"num_clients": 10, "method": "metis"},
        "model": {"name": model, "dropout": 0.5},
        "protocol": {"name": "fedavg", "local_epochs": 3, "client_fraction": fraction, "group_size": group_size,
                     **protocol},
        "train": {"rounds": ROUNDS},
        "network": {"compute": "ignore"},
    })


@functools.lru_cache(maxsize=None)
def _trained(data_root, model: str, group_size: int | None, fraction: float) -> tuple:
    cfg = cfg_for(data_root, model, group_size, fraction)  # trained by hand: the run's folder is never made
    job = Run(cfg, Path(tempfile.gettempdir()) / "fedgl-unused", data=load_data(cfg_for(data_root, model, None)))
    losses = []
    for r in range(1, ROUNDS + 1):
        job.transport.set_round(r)
        losses.append(job.protocol.train_round(r)["train_loss"])
    return job, losses


def small_trainer(model: str, layers: int, dropout: float, train: TrainConfig, features: str,
                  seed: int) -> LocalTrainer:
    """A random client graph with dense features (half of them zero, kept dense) or sparse ones
    (5% non-zero, stored as CSR)."""
    g = torch.Generator().manual_seed(seed)
    n, f = 15 + 4 * seed, 12
    x = torch.randn(n, f, generator=g) * (torch.rand(n, f, generator=g) < (0.05 if features == "sparse" else 0.5))
    edge_index = torch.randint(0, n, (2, 3 * n), generator=g)
    y, train_mask = torch.randint(0, 3, (n,), generator=g), torch.rand(n, generator=g) < 0.5
    net = build_model(model, f, 8, 3, layers, dropout, seed=seed)
    return LocalTrainer(net, model, x, edge_index, y, train_mask, train)


@pytest.mark.parametrize("model, layers, dropout, optimizer, features", [
    ("gcn", 2, 0.5, "adam", ["sparse", "sparse", "sparse"]),
    ("sage", 3, 0.5, "sgd", ["dense", "dense", "dense"]),
    ("gcn", 1, 0.0, "adam", ["dense", "sparse", "dense"]),
    ("sage", 2, 0.3, "adam", ["sparse", "dense", "sparse"]),
])
def test_batched_steps_equal_unbatched_trainers(model, layers, dropout, optimizer, features):
    """Each member's losses, weights and random stream match its own LocalTrainer's, whatever the
    feature layout (sparse, dense, mixed), depth, dropout or optimiser, with subsets stepping."""
    train = TrainConfig(optimizer=optimizer, lr=0.05)
    build = functools.partial(small_trainer, model, layers, dropout, train)
    references = [build(kind, seed) for seed, kind in enumerate(features)]
    rng = [torch.Generator().manual_seed(100 + m).get_state() for m in range(len(features))]
    group = ClientGroupTrainer([build(kind, seed) for seed, kind in enumerate(features)], rng, train)
    assert [r.x.layout == torch.sparse_csr for r in references] == [kind == "sparse" for kind in features]
    for members in (None, [0, 2], None, [1], None):  # whole-group steps at equal and unequal step counts
        chosen = range(len(features)) if members is None else members
        losses = group.train_epochs(2, None if members is None else torch.tensor(members))
        expected = []
        for m in chosen:
            with torch.random.fork_rng(devices=[]):
                torch.set_rng_state(rng[m])
                expected.append(references[m].train_epochs(2))
                rng[m] = torch.get_rng_state()
        assert losses.tolist() == pytest.approx(expected, rel=1e-5)
        for m in range(len(features)):
            torch.testing.assert_close(group.get_rows(torch.tensor([m]))[0], flat_state(references[m].get_state()),
                                       atol=1e-5, rtol=1e-5)
            assert torch.equal(group.members[m].generator.get_state(), rng[m])


def test_members_without_training_nodes_return_the_model_unchanged():
    train, g = TrainConfig(), torch.Generator().manual_seed(0)
    shards = [SimpleNamespace(x=torch.randn(n, 12, generator=g), edge_index=torch.randint(0, n, (2, 40), generator=g),
                              y=torch.randint(0, 3, (n,), generator=g), train_mask=torch.full((n,), m != 1))
              for m, n in enumerate((20, 25, 30))]  # dense features; member 1 has no training nodes
    members = [dict(name=f"client{m}", seed=m + 1, shard=shard, model=ModelConfig(name="gcn", hidden=8), train=train,
                    num_features=12, num_classes=3, local_epochs=2, batch_size=None) for m, shard in enumerate(shards)]
    group = FedAvgGroup.create(name="group0", seed=1, members=members, train=train, local_epochs=2)
    rows = group.trainer.get_rows(None)
    reply, _ = group.dispatch("train", {"state": rows[[1, 2]], "users": torch.tensor([1, 2])})
    assert reply["num_train"].tolist() == [0, shards[2].y.numel()] and reply["loss"][0] == 0 < reply["loss"][1]
    assert torch.equal(reply["state"][0], rows[1]) and not torch.equal(reply["state"][1], rows[2])
    assert [float(t[1]) for t in group.trainer.optimizer.steps.values()] == [0.0] * 4
    assert [float(t[2]) for t in group.trainer.optimizer.steps.values()] == [2.0] * 4
    assert torch.equal(group.trainer.get_rows(torch.tensor([0]))[0], rows[0])  # not called: untouched


def member_states(job) -> list[dict]:
    """Each client's model, Adam moments (``flat_state`` rows) and step counts, from its own party
    or from its group."""
    out = []
    for state in job.transport.snapshot().values():
        trainer = state["trainer"]
        if isinstance(trainer, ClientGroupTrainer):
            opt = trainer.optimizer
            out += [{"model": trainer.get_rows(torch.tensor([m]))[0],
                     **{f: torch.cat([t[m] for t in getattr(opt, f).values()]) for f in ("exp_avg", "exp_avg_sq")},
                     "steps": {float(t[m]) for t in opt.steps.values()}} for m in range(trainer.num_members)]
            continue
        params = dict(trainer.model.named_parameters())
        opt = {key: trainer.optimizer.state.get(p, {"exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p),
                                                    "step": torch.tensor(0.0)}) for key, p in params.items()}
        out.append({"model": flat_state(trainer.get_state()),
                    **{f: flat_state({key: o[f] for key, o in opt.items()}) for f in ("exp_avg", "exp_avg_sq")},
                    "steps": {float(o["step"]) for o in opt.values()}})
    return out


@pytest.mark.parametrize("model", ["gcn", "sage"])
@pytest.mark.parametrize("fraction, group_size", [(1.0, None), (0.5, 10), (0.5, 4)])
def test_group_follows_the_per_client_trajectory(data_root, model, fraction, group_size):
    single, single_losses = _trained(data_root, model, 1, fraction)
    grouped, grouped_losses = _trained(data_root, model, group_size, fraction)
    assert single.protocol.size == 1 and grouped.protocol.size == (group_size or 10)
    assert grouped_losses == pytest.approx(single_losses, rel=LOSS_RTOL)
    a, b = (flat_state(job.protocol.model.state_dict()) for job in (single, grouped))
    torch.testing.assert_close(b, a, atol=PARAM_TOL, rtol=PARAM_TOL)
    # Every client's own model and optimiser state, sampled or not: unsampled members are untouched.
    steps = []
    for mine, theirs in zip(member_states(grouped), member_states(single), strict=True):
        assert mine["steps"] == theirs["steps"] and len(mine["steps"]) == 1
        steps.append(mine["steps"].pop())
        for key in ("model", "exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(mine[key], theirs[key], atol=PARAM_TOL, rtol=PARAM_TOL)
    if fraction < 1:
        assert len(set(steps)) > 1, "sampling should leave members at different step counts"

    # The ledger: the same bytes by kind, and each member's share equal to its own party's ...
    kinds = grouped.transport.ledger.by_kind()
    ids = kinds.pop("index", 0)
    assert kinds == single.transport.ledger.by_kind()
    parties = single.transport.ledger.by_party()
    for direction in ("up", "down"):
        assert member_bytes(grouped, direction) == [parties.get(f"client{m}", {direction: 0})[direction]
                                                    for m in range(10)]
    # ... plus the ids of the sampled members of groups not sampled whole (8 bytes each).
    size = grouped.protocol.size
    expected = 0
    for r in range(1, ROUNDS + 1):
        chosen = sampled_clients(single, r)
        for g in range(0, 10, size):
            count = sum(g <= m < g + size for m in chosen)
            expected += 8 * count if count < min(size, 10 - g) else 0
    assert ids == expected
    assert (ids > 0) == (fraction < 1)


def sampled_clients(job, round_index: int) -> list[int]:
    """Clients a per-client run sent the model to in a round, read from its ledger."""
    rows = job.transport.ledger.rows()
    return sorted(int(row["dst"].removeprefix("client")) for row in rows
                  if row["round"] == round_index and row["kind"] == "model" and row["direction"] == "down")


def member_bytes(job, direction: str) -> list[int]:
    """Bytes the ledger attributes to each client through its group's member vector."""
    protocol, ledger = job.protocol, job.transport.ledger
    out: list[int] = []
    for g, name in enumerate(protocol.clients):
        size = min(protocol.size, protocol.num_clients - g * protocol.size)
        got = ledger.member_bytes(name, direction)
        got = torch.zeros(0, dtype=torch.long) if got is None else got
        out += torch.cat([got, got.new_zeros(size - got.numel())]).tolist()
    return out


@pytest.mark.parametrize("model, protocol", [
    ("gat", {}),  # no batched form: one party per client
    ("gcn", {"batch_size": 32}),  # mini-batches: one party per client
    ("gcn", {"client_fraction": 0.5}),  # default under sampling: one party per client, no member ids sent
])
def test_default_falls_back_to_one_party_per_client(data_root, model, protocol, tmp_path):
    cfg = cfg_for(data_root, model, None, **{"fraction": 1.0, **protocol})
    job = Run(cfg, tmp_path, data=load_data(cfg))
    assert job.protocol.size == 1 and job.transport.parties == [f"client{m}" for m in range(10)]
    job.transport.set_round(1)
    assert torch.isfinite(torch.tensor(job.protocol.train_round(1)["train_loss"]))
    assert set(job.transport.ledger.by_kind()) == {"model", "control"}


@pytest.mark.parametrize("model, protocol", [("gat", {}), ("sage", {"batch_size": 32})])
def test_group_size_needs_a_batched_backbone_and_full_batches(data_root, model, protocol, tmp_path):
    cfg = cfg_for(data_root, model, 5, **protocol)
    with pytest.raises(ConfigError, match="group_size 5 needs a gcn or sage backbone"):
        Run(cfg, tmp_path, data=load_data(cfg))


@pytest.mark.parametrize("width", [7, 64])  # the transposed narrow form, and the plain product
def test_batched_linear_is_the_per_member_product_with_its_gradients(width):
    assert (width <= NARROW_OUTPUT) == (width == 7)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 11, 16, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(3, 16, width, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.allclose(batched_linear(h, weight), torch.stack([h[m] @ weight[m] for m in range(3)]))
    assert torch.autograd.gradcheck(batched_linear, (h, weight))
    out = batched_linear(h.detach(), weight)  # an input without gradient (dense features) gets none
    out.sum().backward()
    assert weight.grad is not None and h.grad is None
