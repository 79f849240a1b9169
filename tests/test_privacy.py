"""Secure aggregation and differential privacy (fedgl.privacy) and their use in FedAvg (GLASU's secure
mean: tests/test_glasu_secagg.py)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from scipy import stats

from fedgl.comm import LocalTransport
from fedgl.config import build_config
from fedgl.errors import ConfigError, RunFailed
from fedgl.privacy import DPConfig, bonawitz
from fedgl.privacy import dp as dp_module
from fedgl.privacy import secure_aggregation as sa
from fedgl.protocols.aggregation import secure_sum, trust_identities
from fedgl.protocols.fedavg.group import flat_state
from fedgl.runner import Run
from support.keys import fixed_pair
from support.masks import top_bits
from support.secure_sum import Toy


@pytest.fixture
def dpa():
    """Google's dp-accounting (the ``privacy`` extra): DP runs and the reference epsilon need it."""
    return pytest.importorskip("dp_accounting")


def masked_inputs(encoded: torch.Tensor, labels: tuple[int, ...] = (1,)) -> tuple[list[list], list[torch.Tensor]]:
    """Secure sums of the rows of ``encoded`` (one client each), one per label: every masked input as
    the server receives it (in client order, per sum) and each decoded sum."""
    transport = LocalTransport()
    names = transport.spawn(Toy, [dict(name=f"c{i}", seed=i, index=i, value=row) for i, row in enumerate(encoded)])
    trust_identities(transport, names)
    seen: list[dict] = []
    transport.observers.append(lambda r, src, dst, method, payload, evaluating: seen[-1].__setitem__(src, payload)
                               if method == "secagg_input" and dst == "server" else None)
    totals = []
    for label in labels:
        seen.append({})
        for name, row in zip(names, encoded):
            transport._parties[name].secure_value = row
        totals.append(secure_sum(transport, names, list(range(len(names))), label, len(names) // 2 + 1)[0])
    return [[inputs[name] for name in names] for inputs in seen], totals


def config(privacy: dict | None = None, rounds: int = 3, **protocol):
    return build_config({"dataset": {"name": "synthetic"}, "partition": {"num_clients": 4},
                         "train": {"rounds": rounds}, "network": {"compute": "ignore"},
                         "protocol": {"name": "fedavg", **protocol}, "privacy": privacy or {}})


def run(cfg, tmp_path, name: str):
    job = Run(cfg, tmp_path / name)
    return job, job.execute(progress=False)


# ---- secure aggregation ------------------------------------------------------------------------------
def test_key_agreement_gives_both_sides_the_same_secret():
    a, b, c = (fixed_pair("x25519", i) for i in range(3))
    ab, ba = sa.pair_secret(a.shared(b.public())), sa.pair_secret(b.shared(a.public()))
    assert ab == ba and len({ab, sa.pair_secret(a.shared(c.public())), sa.pair_secret(b.shared(c.public()))}) == 3


def test_masks_cancel_in_the_servers_sum():
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(5, 1000, generator=gen, dtype=torch.float64) * 10
    weights = torch.tensor([3, 140, 0, 57, 9])
    encoded = sa.encode(values, weights, participants=5)
    (masked,), (decoded,) = masked_inputs(encoded)
    masked = torch.stack(masked)
    assert bool((masked != encoded).float().mean() > 0.99)  # no payload is the encoded update
    plain = (weights.double().unsqueeze(1) * values).sum(0)
    assert torch.allclose(decoded, plain, rtol=0, atol=5 * weights.max().item() * 2.0**-sa.FRACTION_BITS)
    # the pairwise masks cancel in the ring sum, the self-masks stay until the server's unmasking
    assert not torch.allclose(sa.decode(sa.ring_sum(masked)), plain, atol=1.0)


def test_masks_are_fresh_every_round():
    zero = torch.zeros(4, 500, dtype=torch.int64)
    (first, *_), (second, *_) = masked_inputs(zero, labels=(1, 2))[0]
    assert bool((first != second).all())


def test_encoding_refuses_values_that_could_overflow_the_sum():
    bound = sa.limit(10)
    sa.encode(torch.full((1, 3), bound / 2 / 4), torch.tensor([4]), 10)
    with pytest.raises(RunFailed, match="fixed-point range"):
        sa.encode(torch.full((1, 3), bound / 4), torch.tensor([4]), 10)


def test_a_masked_payload_is_uniform_whatever_the_data(repeatable_keys, monkeypatch):
    """Keys and self-mask seeds from a fixed sequence, so the verdict is the same on every run."""
    monkeypatch.setattr(bonawitz.secrets, "token_bytes", lambda n: bytes([7]) * n)
    n = 40_000
    structured = sa.encode(torch.linspace(-3, 3, n).unsqueeze(0), torch.tensor([50]), 4)[0]
    sent_structured = masked_inputs(torch.stack([structured] * 4))[0][0][1]
    repeatable_keys()
    sent_zeros = masked_inputs(torch.zeros(4, n, dtype=torch.int64), labels=(2,))[0][0][1]
    for sent in (sent_structured, sent_zeros):
        assert stats.chisquare(np.bincount(top_bits(sent, 6), minlength=64)).pvalue > 1e-6
    # the test can fail: the encoded data itself is far from uniform
    assert stats.chisquare(np.bincount(top_bits(structured, 6), minlength=64)).pvalue < 1e-12
    as_unit = [sent.double() / 2.0**63 for sent in (sent_structured, sent_zeros)]
    assert stats.ks_2samp(*as_unit).pvalue > 1e-6
    assert stats.kstest(as_unit[0].numpy(), "uniform", args=(-1, 2)).pvalue > 1e-6


def test_what_the_server_receives_from_a_fedavg_client_is_uniform_and_data_independent(tmp_path, repeatable_keys):
    """Two federations on different data, with the same keys: client 0's payload is uniform in both
    and the two payloads have the same distribution, though the models they carry differ."""
    sent = []
    for seed in (0, 1):
        repeatable_keys()
        cfg = build_config({"seed": seed, "dataset": {"name": "synthetic"}, "partition": {"num_clients": 4},
                            "model": {"hidden": 128}, "protocol": {"name": "fedavg", "group_size": 1},
                            "privacy": {"secure_aggregation": True}})
        job = Run(cfg, tmp_path / str(seed))
        state = job.protocol.model.state_dict()
        seen = []
        job.transport._observe = lambda src, dst, method, payload: (
            seen.append(payload) if (src, method) == ("client0", "secagg_input") else None)
        job.protocol.start()
        job.protocol.train_round(1)
        sent.append(seen[0])
    assert sent[0].dtype == torch.int64 and sent[0].numel() == flat_state(state).numel() + 2
    for payload in sent:
        assert stats.chisquare(np.bincount(top_bits(payload), minlength=16)).pvalue > 1e-6
    assert stats.ks_2samp(*(p.double().numpy() for p in sent)).pvalue > 1e-6
    assert not torch.equal(sent[0], sent[1])  # same keys and round, so the same masks: the data differ


@pytest.mark.parametrize("protocol", [{}, {"group_size": 1, "client_fraction": 0.75}])
def test_secure_fedavg_ends_where_plain_fedavg_ends(tmp_path, protocol):
    _, plain = run(config(**protocol), tmp_path, "plain")
    _, secure = run(config({"secure_aggregation": True}, **protocol), tmp_path, "secure")
    last, last_secure = plain.metrics[-1], secure.metrics[-1]
    for key in ("train_loss", "val_accuracy", "val_loss", "test_accuracy", "test_loss", "test_macro_f1"):
        assert last_secure[key] == pytest.approx(last[key], abs=1e-5), key
    assert secure.summary["bytes_total"] > plain.summary["bytes_total"]


def test_ledger_counts_identities_and_eight_bytes_per_masked_coordinate(tmp_path):
    # identities relayed through the server (pinned ones send nothing: tests/test_identity_roster.py)
    job, _ = run(config({"secure_aggregation": {"identities": "relayed"}}, rounds=2, group_size=1), tmp_path, "secure")
    params = sum(p.numel() for p in job.protocol.model.state_dict().values())
    rows = job.transport.ledger.rows()
    n = 4
    published = [r for r in rows if r["method"] == "secagg_identity"]
    relayed = [r for r in rows if r["method"] == "secagg_trust"]
    assert {r["src"] for r in published} == {f"client{i}" for i in range(n)} and {r["round"] for r in published} == {0}
    assert sum(r["bytes"] for r in published) == n * 32
    assert sum(r["bytes"] for r in relayed) == n * n * 32
    for r in (1, 2):
        up = [row for row in rows if row["round"] == r and row["direction"] == "up"]
        # nothing per client in the clear (no counts, no losses): the masked rows and the protocol's keys
        assert {row["kind"] for row in up} == {"model", "control"}
        assert sum(row["bytes"] for row in up if row["kind"] == "model") == n * 8 * (params + 2)
        secagg = [row for row in rows if row["round"] == r and row["method"].startswith("secagg_")]
        assert sum(row["bytes"] for row in secagg) == n * (8 * (params + 2) + 618 * n - 80)


def test_secure_aggregation_goes_on_without_a_lost_client(tmp_path):
    """client2 is lost before round 1: nothing goes to or from it, every round's secure sum is over the
    other three, and the metrics are those of the plain run that loses the same client."""
    results = {}
    for name, privacy in (("plain", None), ("secure", {"secure_aggregation": True})):
        job = Run(config(privacy, group_size=1), tmp_path / name)
        job.protocol.drop_parties(["client2"])
        results[name] = job.execute(progress=False)
    rows = job.transport.ledger.rows()
    assert not [r for r in rows if "client2" in (r["src"], r["dst"])]
    for r in (1, 2, 3):
        inputs = {row["src"] for row in rows if row["round"] == r and row["method"] == "secagg_input"
                  and row["dst"] == "server"}
        assert inputs == {"client0", "client1", "client3"}, r
    plain, secure = results["plain"].metrics, results["secure"].metrics
    assert len(plain) == len(secure) == 3
    for a, b in zip(plain, secure, strict=True):
        for key in ("train_loss", "val_accuracy", "val_loss", "test_accuracy", "test_loss"):
            assert b[key] == pytest.approx(a[key], abs=1e-5), (key, a["round"])


def test_secure_aggregation_needs_three_clients_per_round(tmp_path):
    with pytest.raises(ConfigError, match="at least 3 clients per sum .* got threshold 2 for 2 clients"):
        Run(config({"secure_aggregation": True}, client_fraction=0.5), tmp_path / "run")
    with pytest.raises(ConfigError, match="group_size 2: privacy.secure_aggregation needs one party per client"):
        Run(config({"secure_aggregation": True}, group_size=2), tmp_path / "run")


def test_protocols_without_privacy_options_refuse_them():
    with pytest.raises(ConfigError, match="protocol cnfgnn does not implement it"):
        build_config({"protocol": {"name": "cnfgnn"}, "privacy": {"secure_aggregation": True}})
    with pytest.raises(ConfigError, match="protocol llcg does not implement it"):
        build_config({"protocol": {"name": "llcg"}, "privacy": {"dp": {"noise_multiplier": 1, "max_norm": 1}}})


# ---- differential privacy ----------------------------------------------------------------------------
def test_clipping_bounds_every_update():
    gen = torch.Generator().manual_seed(1)
    updates = torch.randn(6, 300, generator=gen) * torch.tensor([0.01, 0.1, 1, 3, 10, 0]).unsqueeze(1)
    clipped = dp_module.clip(updates, 1.0).numpy()
    raw = updates.numpy()
    norms = np.sqrt((raw.astype(np.float64) ** 2).sum(1))
    assert (np.sqrt((clipped.astype(np.float64) ** 2).sum(1)) <= 1.0 + 1e-6).all()
    inside = norms <= 1.0
    np.testing.assert_allclose(clipped[inside], raw[inside], rtol=1e-6)
    np.testing.assert_allclose(clipped[~inside], raw[~inside] / norms[~inside, None], rtol=1e-5)


def test_fedavg_clients_send_clipped_noised_updates(tmp_path, dpa):
    """A client's released model differs from the global model it received by at most max_norm
    plus the noise, which here is tiny; without clipping its update is much larger."""
    dp = {"noise_multiplier": 1e-6, "max_norm": 0.05}
    for group_size in (1, 4):
        job = Run(config({"dp": dp}, group_size=group_size), tmp_path / f"g{group_size}")
        state = job.protocol.model.state_dict()
        start = flat_state(state)
        if group_size == 1:
            replies = job.transport.call_many(job.protocol.clients, "train", state=state)
            sent = torch.stack([flat_state(r["state"]) for r in replies])
        else:
            sent = job.transport.call(job.protocol.clients[0], "train", state=start.expand(4, -1))["state"]
        norms = np.linalg.norm((sent - start).double().numpy(), axis=1)
        assert (norms <= 0.05 * (1 + 1e-3)).all() and (norms >= 0.05 * (1 - 1e-3)).all()
    plain = Run(config(group_size=1), tmp_path / "plain")
    state = plain.protocol.model.state_dict()
    start = flat_state(state)
    replies = plain.transport.call_many(plain.protocol.clients, "train", state=state)
    assert min(float((flat_state(r["state"]) - start).norm()) for r in replies) > 0.5


def reference_epsilon(dpa, noise_multiplier: float, rounds: int, delta: float) -> float:
    """``rounds`` full releases of sensitivity 2 max_norm (a client's data substituted)."""
    from dp_accounting import rdp

    accountant = rdp.RdpAccountant()
    accountant.compose(dpa.GaussianDpEvent(noise_multiplier / 2), rounds)
    return accountant.get_epsilon(delta)


def test_reported_epsilon_is_the_accountants(tmp_path, dpa):
    dp = {"noise_multiplier": 1.3, "max_norm": 1.0}
    _, result = run(config({"dp": dp}, rounds=4), tmp_path, "dp")
    reported = [row["epsilon"] for row in result.metrics]
    expected = [reference_epsilon(dpa, 1.3, r, 1e-5) for r in range(1, 5)]
    assert reported == pytest.approx(expected, rel=1e-9)
    assert reported == sorted(reported) and reported[0] < reported[-1]
    assert result.summary["epsilon"] == pytest.approx(expected[-1]) and result.summary["delta"] == 1e-5
    _, plain = run(config(rounds=1), tmp_path, "plain")
    assert "epsilon" not in plain.summary and "epsilon" not in plain.metrics[-1]


def test_epsilon_falls_with_the_noise_multiplier(dpa):
    eps = [dp_module.gaussian_epsilon(sigma, 20, 1e-5) for sigma in (0.7, 1.0, 2.0, 4.0)]
    assert eps == sorted(eps, reverse=True) and eps[-1] < eps[0] / 5


def test_dp_needs_the_accounting_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "dp_accounting", None)
    with pytest.raises(ConfigError, match=r"fedgl\[privacy\]"):
        dp_module.DPAccountant(DPConfig(noise_multiplier=1, max_norm=1), torch.arange(2), dp_module.CLIENT_UPDATES)


def test_a_private_run_resumes_with_its_keys_and_budget(tmp_path, dpa):
    dp = {"noise_multiplier": 1.0, "max_norm": 1.0, "replayable_noise": True}  # equal runs need equal noise
    base = {"dataset": {"name": "synthetic"}, "partition": {"num_clients": 4}, "network": {"compute": "ignore"},
            "privacy": {"dp": dp, "secure_aggregation": True}, "checkpoint_every": 1}
    straight = Run(build_config({**base, "train": {"rounds": 3}}), tmp_path / "a").execute(progress=False)
    Run(build_config({**base, "train": {"rounds": 2}}), tmp_path / "b").execute(progress=False)
    job = Run(build_config({**base, "train": {"rounds": 3}}), tmp_path / "b")
    assert job.resume()
    resumed = job.execute(progress=False)
    assert resumed.summary["epsilon"] == pytest.approx(straight.summary["epsilon"])
    assert resumed.metrics[-1]["test_accuracy"] == straight.metrics[-1]["test_accuracy"]
    assert resumed.summary["bytes_total"] == straight.summary["bytes_total"]
