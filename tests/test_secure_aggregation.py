"""Secure aggregation against an honest-but-curious server: unpredictable masks, refusals, dropouts
(Bonawitz et al.'s double masking with a threshold) and what the flow costs in the ledger."""

from __future__ import annotations

import inspect
import secrets

import pytest
import torch
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedgl.comm import LocalTransport
from fedgl.config import build_config
from fedgl.errors import ConfigError, RunFailed
from fedgl.privacy import bonawitz, identity, masks, secure_aggregation as sa, shamir
from fedgl.privacy.bonawitz import SecAggClient
from fedgl.protocols import aggregation
from fedgl.protocols.aggregation import secure_sum, trust_identities
from fedgl.runner import Run
from support.secure_sum import Toy, one_line

N, D = 10, 64


def federation(n: int = N, extra: dict[int, dict] | None = None):
    values = torch.randn(n, D, dtype=torch.float64)
    encoded = sa.encode(values, torch.ones(n, dtype=torch.long), n)
    transport = LocalTransport()
    names = transport.spawn(Toy, [dict(name=f"c{i}", seed=i, index=i, value=encoded[i], **(extra or {}).get(i, {}))
                                  for i in range(n)])
    trust_identities(transport, names)
    return transport, names, values, encoded


# ---- masks a server cannot predict ----------------------------------------------------------------
def test_every_mask_differs_across_rounds_and_secrets_that_differ_only_in_high_bits():
    secret = secrets.token_bytes(32)
    high = bytes([secret[0] ^ 0x80]) + secret[1:]  # the same secret but its top bit
    base = masks.stream(secret, 4096, b"p", 1)
    for other in (masks.stream(secret, 4096, b"p", 2), masks.stream(high, 4096, b"p", 1),
                  bonawitz.pair_mask(secret, 4096, 1), bonawitz.self_mask(secret, 4096, 1)):
        assert bool((base != other).all())


def test_the_generator_is_the_named_stream_cipher():
    secret = secrets.token_bytes(32)
    info = b"purpose\x00" + (7).to_bytes(8, "big") + (3).to_bytes(8, "big")
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)
    raw = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor().update(bytes(8 * 100))
    assert torch.equal(masks.stream(secret, 100, b"purpose", 7, 3), torch.frombuffer(bytearray(raw), dtype=torch.int64))


def test_no_seeded_generator_in_secure_aggregation():
    for module in (masks, sa, bonawitz, shamir, identity, aggregation):
        source = inspect.getsource(module)
        for banned in ("torch.Generator", "manual_seed", "torch.rand", "np.random", "numpy.random", "import random"):
            assert banned not in source, (module.__name__, banned)


def replayed_masks(public_draws=None) -> list[torch.Tensor]:
    """Client 0's masked input in two federations built from everything the server holds: the same
    indices, round, config seed and torch state, every client holding the same value (zeros).
    ``public_draws()`` restarts whatever the clients' draws come from, in each federation."""
    out = []
    for _ in range(2):
        torch.manual_seed(0)
        if public_draws is not None:
            public_draws()
        transport, names, _, _ = federation(4)
        for name in names:
            transport._parties[name].secure_value = torch.zeros(D, dtype=torch.int64)
        seen = []
        transport._observe = lambda src, dst, method, payload: (
            seen.append(payload) if method == "secagg_input" and dst == "server" else None)
        secure_sum(transport, names, list(range(4)), label=5, threshold=3)
        out.append(seen[0])
    return out


def test_masks_recomputed_from_what_the_server_holds_do_not_cancel(monkeypatch):
    """The server replays the round from its public inputs and subtracts what it gets from client 0's
    masked input: the masking survives. The same attack removes the masks when the clients' keys and
    seeds are functions of public values (so this test can fail)."""
    first, replay = replayed_masks()
    assert bool(((first - replay) != 0).float().mean() > 0.99)
    draws = [0]

    def public_key_pair(cls):  # keys numbered from the config seed, as a careless client's
        draws[0] += 1
        return cls("x25519", bytes([draws[0]]) * 32)

    monkeypatch.setattr(masks.KeyPair, "generate", classmethod(public_key_pair))
    monkeypatch.setattr(bonawitz.secrets, "token_bytes", lambda n: bytes([draws[0]]) * n)
    first, replay = replayed_masks(lambda: draws.__setitem__(0, 0))
    assert torch.equal(first, replay)  # masks from public values: the replay is exactly the mask


# ---- refusals ---------------------------------------------------------------------------------------
def started(n: int = 4, label: int = 1):
    clients = [SecAggClient.create(i) for i in range(n)]
    table = torch.stack([torch.frombuffer(bytearray(c.identity.public()), dtype=torch.uint8) for c in clients])
    for c in clients:
        c.trust(table)
    keys = torch.stack([c.advertise(label) for c in clients])
    return clients, keys


@pytest.mark.parametrize("ids, problem", [([0, 1, 1, 2], "repeats client 1"), ([0, 1, 2, 9], "names client 9"),
                                          ([1, 2, 3], "leaves out client 0"), ([0, 1], "fewer than 3")])
def test_a_bad_participant_list_is_refused_in_one_line(ids, problem):
    clients, keys = started()
    with pytest.raises(RunFailed) as err:
        clients[0].share_keys(1, torch.tensor(ids), keys[torch.tensor(ids).clamp(max=3)], 3)
    assert problem in one_line(err)


def test_a_repeated_round_index_is_refused():
    clients, _ = started()
    clients[0].advertise(2)
    with pytest.raises(RunFailed) as err:
        clients[0].advertise(1)
    assert "index 1" in one_line(err)
    transport, names, _, _ = federation(4)
    secure_sum(transport, names, list(range(4)), label=7, threshold=3)
    with pytest.raises(RunFailed, match="refuses to mask twice under index 7"):
        secure_sum(transport, names, list(range(4)), label=7, threshold=3)


def test_a_substituted_round_key_fails_its_signature():
    clients, keys = started()
    forged = keys.clone()
    forged[2, :32] = torch.frombuffer(bytearray(masks.KeyPair.generate().public()), dtype=torch.uint8)
    with pytest.raises(RunFailed) as err:
        clients[0].share_keys(1, torch.arange(4), forged, 3)
    assert "client 2's round keys do not carry its signature" in one_line(err)
    assert clients[1].share_keys(1, torch.arange(4), keys, 3).shape == (3, bonawitz.SEALED)  # the real table passes


# ---- dropouts ---------------------------------------------------------------------------------------
def test_three_of_ten_dropped_after_the_shares_leave_the_exact_sum_of_the_seven():
    transport, names, values, encoded = federation()
    gone = {"c1", "c4", "c8"}
    total, kept = secure_sum(transport, names, list(range(N)), label=1, threshold=6,
                             absent=lambda step: gone if step == "input" else ())
    assert kept == [0, 2, 3, 5, 6, 7, 9]
    assert torch.equal(sa.ring_sum(encoded[kept]), torch.round(total * sa.SCALE).to(torch.int64))
    assert torch.allclose(total, values[kept].sum(0), atol=1e-8)


def test_a_party_that_fails_mid_step_is_dropped_and_the_others_answer_again():
    transport, names, values, _ = federation(6, {2: {"fail_at": "share"}})
    total, kept = secure_sum(transport, names, list(range(6)), label=1, threshold=4)
    assert kept == [0, 1, 3, 4, 5] and torch.allclose(total, values[kept].sum(0), atol=1e-8)


def test_five_of_ten_dropped_stop_the_round_with_nothing_revealed():
    transport, names, _, _ = federation()
    gone = {f"c{i}" for i in range(5)}
    with pytest.raises(RunFailed) as err:
        secure_sum(transport, names, list(range(N)), label=1, threshold=6,
                   absent=lambda step: gone if step == "input" else ())
    assert "5 of 10 clients left at the input step, fewer than the threshold 6" in one_line(err)
    assert not any(m in transport.ledger.by_method() for m in ("secagg_consent", "secagg_reveal"))


def curious_round(clients: list[SecAggClient], encoded: torch.Tensor, late: list[int], threshold: int = 6):
    """The server's whole view of a round where the clients ``late`` sent their masked inputs and were
    then declared dropped: every message, as the server routes them."""
    n, label = len(clients), 3
    ids = torch.arange(n)
    keys = torch.stack([c.advertise(label) for c in clients])
    sealed = {i: c.share_keys(label, ids, keys, threshold) for i, c in enumerate(clients)}
    masked = {}
    for j, c in enumerate(clients):
        rows = torch.stack([sealed[i][[k for k in range(n) if k != i].index(j)] for i in range(n) if i != j])
        masked[j] = c.masked_input(label, encoded[j], ids, rows)
    survivors = torch.tensor([j for j in range(n) if j not in late])
    signatures = {j: clients[j].consent(label, survivors) for j in survivors.tolist()}
    return label, keys, masked, survivors, signatures


def test_the_server_cannot_unmask_a_client_it_declared_dropped_after_its_input():
    values = torch.randn(N, D, dtype=torch.float64)
    encoded = sa.encode(values, torch.ones(N, dtype=torch.long), N)
    clients, _ = started(N, label=0)
    label, keys, masked, survivors, signatures = curious_round(clients, encoded, late=[0, 1, 2])
    sigs = torch.stack([signatures[j] for j in survivors.tolist()])
    late = torch.tensor([0, 1, 2])
    revealers = survivors.tolist()[:6]
    b0 = shamir.reconstruct([k + 1 for k in revealers], [[clients[k]._share_of(0, 0)] for k in revealers])[0]
    # the self-mask share of client 0 as well as its mask-key share: every survivor refuses
    for j in survivors.tolist():
        with pytest.raises(RunFailed) as err:
            clients[j].reveal(label, survivors, sigs, torch.cat([late[:1], survivors]), late)
        assert "both shares of client 0" in one_line(err)
    # the honest reveal: client 0's mask key (row 7: survivors first, then the dropped)
    shares = [clients[j].reveal(label, survivors, sigs, survivors, late) for j in revealers]
    c0 = shamir.reconstruct([k + 1 for k in revealers],
                            [[shamir.from_bytes(bonawitz.as_bytes(s[7]))] for s in shares])[0]
    key = masks.KeyPair("x25519", c0)
    attempt = masked[0].clone()
    for j in range(1, N):  # client 0 added +mask(s_0j) for every j > 0
        attempt -= bonawitz.pair_mask(sa.pair_secret(key.shared(bonawitz.as_bytes(keys[j][:32]))), D, label)
    assert not torch.allclose(sa.decode(attempt), values[0], atol=1.0)  # the self-mask still hides it
    # with b_0 too (the reveal the survivors refused) the server would have client 0's input exactly
    assert torch.equal(attempt - bonawitz.self_mask(b0, D, label), encoded[0])


# ---- cost and config --------------------------------------------------------------------------------
def test_the_ledger_of_a_secure_sum_equals_the_documented_formula():
    """n clients, D int64 values, nobody dropped: n * (8 D + 618 n - 80) bytes (docs/privacy.md)."""
    for n in (3, 7):
        transport, names, _, _ = federation(n)
        before = transport.ledger.total()
        secure_sum(transport, names, list(range(n)), label=1, threshold=n // 2 + 1)
        assert transport.ledger.total() - before == n * (8 * D + 618 * n - 80)
        assert transport.ledger.total(kind="model") == n * 8 * D  # the masked vectors, under their own kind


def test_the_threshold_setting():
    def privacy(value):
        return build_config({"dataset": {"name": "synthetic"}, "protocol": {"name": "fedavg"},
                             "privacy": {"secure_aggregation": value}}).privacy
    assert privacy(True).secure_threshold(10) == 6 and privacy({}).secure_threshold(7) == 4
    assert privacy({"threshold": 8}).secure_threshold(10) == 8
    with pytest.raises(ConfigError, match="threshold: Input should be greater than or equal to 2"):
        privacy({"threshold": 1})


# ---- FedAvg on the layer ------------------------------------------------------------------------------
def fedavg(dataset: str, privacy: dict, rounds: int) -> dict:
    options = {"options": {"num_nodes": 400}} if dataset == "synthetic" else {}
    return build_config({"dataset": {"name": dataset, **options}, "partition": {"num_clients": 10},
                         "protocol": {"name": "fedavg", "local_epochs": 1, "group_size": 1},
                         "model": {"hidden": 16}, "train": {"rounds": rounds}, "network": {"compute": "ignore"},
                         "privacy": privacy})


def dropping(job: Run, rounds: set[int], clients: list[int]) -> Run:
    """The server stops waiting for ``clients``' uploads in ``rounds`` (they trained; nothing arrives)."""
    gone = {f"client{c}" for c in clients}
    job.protocol.absent = lambda r, step: gone if r in rounds and step == "input" else set()
    return job


def dropouts_end_where_the_plain_run_ends(tmp_path, dataset: str, rounds: int, drops: set[int]) -> None:
    """Three of ten clients dropped mid-round in ``drops``: the secure run (threshold 6) has the
    metrics of the plain run dropping the same clients; five dropped stop the round in one line."""
    secure = {"secure_aggregation": {"threshold": 6}}
    runs = [dropping(Run(fedavg(dataset, privacy, rounds), tmp_path / name), drops, [1, 4, 8]).execute(progress=False)
            for name, privacy in (("plain", {}), ("secure", secure))]
    plain, masked = (r.metrics for r in runs)
    assert len(plain) == len(masked) == rounds
    for a, b in zip(plain, masked):
        for key in ("train_loss", "val_accuracy", "val_loss", "test_accuracy", "test_loss"):
            assert b[key] == pytest.approx(a[key], abs=1e-5), (key, a["round"])
    # the comparison can tell: without the drops the first dropped round's loss differs
    first = min(drops)
    undropped = Run(fedavg(dataset, {}, first), tmp_path / "undropped").execute(progress=False).metrics
    assert undropped[-1]["train_loss"] != pytest.approx(plain[first - 1]["train_loss"], abs=1e-5)
    five = dropping(Run(fedavg(dataset, secure, first), tmp_path / "five"), drops, list(range(5)))
    with pytest.raises(RunFailed) as err:
        five.execute(progress=False)
    assert "5 of 10 clients left at the input step, fewer than the threshold 6" in one_line(err)


def test_fedavg_with_dropouts_ends_where_the_plain_run_with_the_same_dropouts_ends(tmp_path):
    dropouts_end_where_the_plain_run_ends(tmp_path, "synthetic", 2, {2})


@pytest.mark.slow
@pytest.mark.usefixtures("data_root")
def test_fedavg_on_cora_with_dropouts_in_rounds_3_and_7(tmp_path):
    dropouts_end_where_the_plain_run_ends(tmp_path, "cora", 8, {3, 7})
