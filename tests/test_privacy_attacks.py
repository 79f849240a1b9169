"""Attacks on privacy claims that had no test able to fail: each test plays the attacker a claim of
docs/privacy.md names, and breaks the protection on purpose to show the same attack then succeeds.

- Swift-FedGNN's request masks: keys from the OS, so a replay of the federation from its config does
  not give the masks (and does when the keys come from the config seed).
- DP noise "from an OS-keyed stream the server cannot replay", in every protocol with ``privacy.dp``:
  two runs of one config release different noise (and identical payloads with seed-derived noise).
- The request-key table relayed "in random order, without names".
"""

from __future__ import annotations

import hashlib
import itertools
import math

import pytest
import torch
from support.configs import tiny
from support.wire import messages, tap

from fedgl.config import build_config
from fedgl.privacy import secure_aggregation as sa
from fedgl.runner import Run

pytest.importorskip("cryptography")


def tapped(cfg: dict, folder) -> list:
    """Run ``cfg``; every message that crossed, as ``support.wire`` records it."""
    job = Run(build_config(cfg), folder)
    wire = tap(job)
    job.execute(progress=False)
    return wire


# ---- Swift-FedGNN: one-way request masks ------------------------------------------------------------
SWIFT_SECURE = tiny("fedgnn-g", privacy={"secure_aggregation": True}, train={"rounds": 1})
HIGH = 2**56  # a fixed-point value stays below this; a uniform int64 does with probability 2^-8


def masked_sums(folder, monkeypatch, restart=None) -> tuple[torch.Tensor, torch.Tensor, set[bytes]]:
    """One run of ``SWIFT_SECURE``: every masked row the server received in a ``propagate`` reply
    (in the order they crossed), for each the fixed-point row its owner masked (read inside the
    owner, as an attacker simulating its own federation reads its own clients), and every public key
    the server relayed (``request_peers``). ``restart()`` restarts whatever the clients' keys are
    drawn from, as a new federation would."""
    if restart is not None:
        restart()
    plain: dict[bytes, torch.Tensor] = {}
    mask = sa.RequestMasking.mask

    def spied(self, encoded, to, label):
        out = mask(self, encoded, to, label)
        plain.update({row.numpy().tobytes(): e.clone() for row, e in zip(out, encoded.cpu())})
        return out

    with monkeypatch.context() as m:
        m.setattr(sa.RequestMasking, "mask", spied)
        wire = tapped(SWIFT_SECURE, folder)
    sent = [t for msg in messages(wire, receiver="server", method="propagate") for t in msg.under("sums").values()]
    sent = torch.cat([t for t in sent if t.numel()])
    assert sent.dtype == torch.int64 and sent.size(0) > 20
    relayed = {row.numpy().tobytes() for msg in messages(wire, sender="server", method="request_peers")
               for table in msg.under("peers").values() for row in table}
    assert relayed
    return sent, torch.stack([plain[row.numpy().tobytes()] for row in sent]), relayed  # every row sent was masked


def replay_attack(tmp_path, monkeypatch, restart=None) -> tuple[torch.Tensor, ...]:
    """The server's replay: it runs the federation again from what it holds (config, seed, the same
    public inputs), reads the masks its replayed owners add, and subtracts them from the real sums.
    Returns the real masked sums, the replay's, the real plain (fixed-point) sums, the estimate, and
    whether the replay relayed the real run's public keys (the check an attacker makes of its replay)."""
    real, truth, keys = masked_sums(tmp_path / "real", monkeypatch, restart)
    replayed, replay_plain, replay_keys = masked_sums(tmp_path / "replay", monkeypatch, restart)
    assert torch.equal(truth, replay_plain)  # one config, one set of plain sums: only the masks can differ
    return real, replayed, truth, real - (replayed - replay_plain), keys == replay_keys


def test_request_masks_are_not_a_function_of_the_config(tmp_path, monkeypatch):
    """Swift's request masks (docs/privacy.md, Swift-FedGNN: fresh X25519 keys per request): two
    federations from one config send different masked sums, and masks rebuilt from the config, the seed
    and the relayed public keys unmask nothing; keys derived from the config seed fail both checks."""
    real, replayed, truth, estimate, same_keys = replay_attack(tmp_path / "os", monkeypatch)
    assert not same_keys  # the replay's public keys are not the ones relayed
    assert float((real != replayed).double().mean()) > 0.99
    assert float((estimate != truth).double().mean()) > 0.99
    assert bool((truth.abs() < HIGH).all())  # the plain sums read as fixed point...
    assert float((estimate.abs() < HIGH).double().mean()) < 0.05  # ...the estimate does not: uniform

    draws = [itertools.count()]
    seed = SWIFT_SECURE.get("seed", 0)

    def from_the_seed(cls, *args):  # a careless client: request keys numbered from the config seed
        private = hashlib.sha256(f"fedgl request key {seed} {next(draws[0])}".encode()).digest()
        return cls(sa.KeyPair("x25519", private))

    monkeypatch.setattr(sa.RequestMasking, "create", classmethod(from_the_seed))
    restart = lambda: draws.__setitem__(0, itertools.count())
    real, replayed, truth, estimate, same_keys = replay_attack(tmp_path / "seed", monkeypatch, restart)
    assert same_keys and torch.equal(real, replayed)
    assert torch.equal(estimate, truth)  # the replay unmasks every sum exactly


# ---- DP noise the server cannot replay, in every protocol with privacy.dp ----------------------------
# The message each protocol releases noised values in, during training, and the paths inside it that
# are noised (GLASU's scoring logits are left out: only its training releases are checked here).
RELEASES = {
    "fedavg": [("train", "state")],
    "swift": [("propagate", "sums"), ("finish", "gradient")],
    "fedgnn-g": [("propagate", "sums"), ("finish", "gradient")],
    "fedgnn-pns": [("propagate", "sums"), ("finish", "gradient")],
    "glasu": [("forward",)],
    "fedaas": [("upload",), ("request", "query")],
    "nfedgnn": [("embed",)],
    "cnfgnn": [("embed",), ("upload",)],
}


def released(cfg: dict, folder) -> dict[tuple, tuple[str, torch.Tensor]]:
    """Per release of ``RELEASES``: the sender and the noised values of its first training message
    (the first one any client sends of that method)."""
    name = cfg["protocol"]["name"]
    wire = tapped(cfg, folder)
    out = {}
    for method, *prefix in RELEASES[name]:
        first = next(m for m in messages(wire, receiver="server", method=method)
                     if any(t.is_floating_point() and t.numel() for t in m.under(*prefix).values()))
        floats = [t.flatten().double() for t in first.under(*prefix).values() if t.is_floating_point()]
        out[(method, *prefix)] = (first.sender, torch.cat(floats))
    return out


@pytest.mark.parametrize("protocol", list(RELEASES))
def test_two_runs_of_one_dp_config_release_different_noise_in_every_protocol(tmp_path, protocol):
    """DP noise from an OS-keyed stream (docs/privacy.md, Differential privacy): the same message of two
    runs of one config differs in every noised value; with seed-derived noise it is the same payload."""
    extra = {"partition": {"label_holder": None}} if protocol == "glasu" else {}  # GLASU's DP refuses one
    dp = {"noise_multiplier": 1.0, "max_norm": 1.0}
    runs = {}
    for replayable, run in itertools.product((False, True), "ab"):
        cfg = tiny(protocol, privacy={"dp": dp | {"replayable_noise": replayable}}, train={"rounds": 1}, **extra)
        runs[replayable, run] = released(cfg, tmp_path / f"{replayable}-{run}")
    for release in RELEASES[protocol]:
        (sender_a, a), (sender_b, b) = runs[False, "a"][release], runs[False, "b"][release]
        assert sender_a == sender_b and a.shape == b.shape and a.numel() > 0, release
        assert float((a != b).double().mean()) > 0.99, release  # fresh noise on every value
        (_, c), (_, d) = runs[True, "a"][release], runs[True, "b"][release]
        assert torch.equal(c, d), release  # noise from the seed: the config alone fixes the payload


# ---- the request-key table: random order, no names ---------------------------------------------------
def test_the_request_key_table_is_relayed_in_random_order_without_names(tmp_path):
    """Swift's request keys (docs/privacy.md, Swift-FedGNN): the server relays each request's public
    keys as a table in random order, without names; over many tables not all are in the parties' order
    (all would be without the shuffle), and each holds exactly its request's keys."""
    cfg = tiny("fedgnn-g", privacy={"secure_aggregation": True}, train={"rounds": 4}, partition={"num_clients": 4})
    wire = tapped(cfg, tmp_path)
    clients = sorted({m.sender for m in messages(wire, method="request_keys", receiver="server")})
    orders = []
    for round_index in sorted({m.round for m in messages(wire, method="request_peers")}):
        owner = {t.numpy().tobytes(): m.sender for m in messages(wire, method="request_keys", receiver="server")
                 if m.round == round_index for t in m.tensors.values()}
        tables = {}
        for m in messages(wire, method="request_peers", sender="server"):
            if m.round != round_index:
                continue
            assert not m.values, m.values  # tensors only: no name, no string travels with the table
            for table in m.under("peers").values():
                tables[table.numpy().tobytes()] = [owner[row.numpy().tobytes()] for row in table]
        for members in tables.values():
            assert len(set(members)) == len(members)  # every party of the request once
            orders.append([clients.index(c) for c in members])
    # all in the parties' order by chance: probability the product of 1/m! over tables of m rows
    assert sum(math.log2(math.factorial(len(o))) for o in orders) > 30, orders
    assert any(o != sorted(o) for o in orders), orders
