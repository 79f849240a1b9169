"""What a curious server or driver could still try after the protocol-level protections: split the
clients with a small threshold, rewind them with ``hold``/``roll_back`` to ask a round again, or read
the DP stream's key from a checkpoint. Each test fails if its protection is removed."""

from __future__ import annotations

import torch
import pytest

from fedgl.comm import LocalTransport, Party, rpc
from fedgl.comm.party_state import plain
from fedgl.config import build_config
from fedgl.errors import ConfigError, RunFailed
from fedgl.privacy import secure_aggregation as sa
from fedgl.privacy.bonawitz import SecAggClient
from fedgl.privacy.config import DPConfig
from fedgl.privacy.dp import PrivateRelease
from fedgl.privacy.noise import NoiseStream
from fedgl.protocols.aggregation import SecureSumParty, check_secure_round, secure_sum, trust_identities


class Client(SecureSumParty, Party):
    """A client with a fixed-point vector to sum and a DP release of its own."""

    def __init__(self, name: str, seed: int, index: int, value: torch.Tensor):
        super().__init__(name, seed)
        self.secagg = SecAggClient.create(index)
        self.secure_value = value
        self.private = PrivateRelease(DPConfig(noise_multiplier=1.0, max_norm=1.0), seed)

    @rpc(returns="embedding")
    def noisy(self) -> torch.Tensor:
        return self.private.noised(torch.zeros(1, 256))


def federation(n: int):
    encoded = sa.encode(torch.randn(n, 8, dtype=torch.float64), torch.ones(n, dtype=torch.long), n)
    transport = LocalTransport()
    names = transport.spawn(Client, [dict(name=f"c{i}", seed=i, index=i, value=encoded[i]) for i in range(n)])
    trust_identities(transport, names)
    return transport, names


def test_a_client_refuses_a_threshold_at_most_half_of_the_round():
    """With t <= n/2 two disjoint halves could each sign and reveal for a different survivor list."""
    transport, names = federation(4)
    with pytest.raises(RunFailed, match="refuses: a threshold of 2 for 4 clients"):
        secure_sum(transport, names, list(range(4)), label=1, threshold=2)
    secure_sum(transport, names, list(range(4)), label=2, threshold=3)  # a majority passes
    privacy = build_config({"dataset": {"name": "synthetic"}, "protocol": {"name": "fedavg"},
                            "privacy": {"secure_aggregation": {"threshold": 5}}}).privacy
    with pytest.raises(ConfigError, match="threshold above half of them"):
        check_secure_round(privacy, 10, "fedavg")
    check_secure_round(privacy, 9, "fedavg")


def test_rolling_the_clients_back_does_not_let_the_server_ask_a_round_again():
    """The τ₀ grid's ``hold``/``roll_back`` (any driver can call them) keeps the secrets as they are:
    the used round label stays used, so the server cannot collect a second set of reveals."""
    transport, names = federation(4)
    transport.hold()
    secure_sum(transport, names, list(range(4)), label=5, threshold=3)
    transport.roll_back()
    with pytest.raises(RunFailed, match="refuses to mask twice under index 5"):
        secure_sum(transport, names, list(range(4)), label=5, threshold=3)


def test_rolled_back_noise_is_not_drawn_again():
    transport, names = federation(3)
    transport.hold()
    first = transport.call_many(names, "noisy")
    transport.roll_back()
    second = transport.call_many(names, "noisy")
    for a, b in zip(first, second):  # the same draw twice would make the difference of two releases exact
        assert not torch.allclose(a, b)


def test_the_dp_stream_key_never_reaches_a_checkpoint():
    stream = NoiseStream.fresh()
    stream.normal((10,))
    saved = plain(stream)["attrs"]
    assert "key" not in saved and "block" not in saved
    replayable = plain(NoiseStream.from_seed(3))["attrs"]
    assert "generator" in replayable  # a test-only replayable stream resumes exactly
