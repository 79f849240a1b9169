"""The driver stays outside the parties: over a real local Ray, a party host answers the protocol's
``@rpc`` calls and verbs that move no party state, and nothing else; and a party's secrets never
reach the run folder."""

from __future__ import annotations

import sys

import pytest
import torch

from fedgl.comm import Party, make_transport, rpc
from fedgl.comm.party_state import plain
from fedgl.config import build_config
from fedgl.runner import Run
from fedgl.search import run
from support.stored import files_holding


class Keeper(Party):
    """A party with data, a model and a secret it never checkpoints."""

    secret_state = frozenset({"key"})

    def __init__(self, name: str, seed: int):
        super().__init__(name, seed)
        self.features = torch.randn(4, 3)
        self.key = b"\x13" * 16 + bytes(range(16))  # stands for a private key

    @rpc(returns="embedding")
    def embed(self) -> torch.Tensor:
        return self.features.sum(0)

    def private(self) -> torch.Tensor:
        return self.features


HOST_NAMES = ["snapshot", "restore", "get_state", "set_state", "parties", "_group", "dispatch", "__ray_call__",
              "__ray_ready__", "__ray_terminate__"]
PARTY_NAMES = ["private", "features", "key", "__dict__", "get_state", "set_state", "save", "load", "dispatch",
               "create", "__class__", "__reduce__", "__getattribute__", "_on_device"]


@pytest.fixture
def hosted(ray_session):
    ray_session.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # test classes are not installed
    transport = make_transport("ray", actors=1)
    transport.spawn(Keeper, [{"name": "k0", "seed": 0}])
    try:
        yield transport, transport._hosts[0]
    finally:
        transport.close()


@pytest.mark.slow  # starts Ray or trains on real data for seconds: with the slow tests
@pytest.mark.ray
def test_a_ray_host_refuses_every_call_that_would_move_party_state_to_the_driver(hosted, ray_session, tmp_path):
    from fedgl.comm.ray_transport import pack, unpack

    transport, host = hosted
    [(direct, _)] = unpack(ray_session.get(host.run.remote(pack([("k0", "embed", {})]))))
    assert torch.equal(transport.call("k0", "embed"), direct)  # the protocol's calls go through
    for name in HOST_NAMES:  # the host's own methods: none hands over a party or runs the driver's code
        with pytest.raises(AttributeError):
            getattr(host, name).remote()
    for name in PARTY_NAMES:  # through the host's call path: only @rpc methods are dispatched
        with pytest.raises(ray_session.exceptions.RayTaskError, match="not a remotely callable"):
            ray_session.get(host.run.remote(pack([("k0", name, {})])))
        with pytest.raises(AttributeError, match="not a remotely callable"):
            transport.call("k0", name)
    assert not hasattr(transport, "snapshot") and not hasattr(transport, "restore")
    transport.hold()  # control verbs keep the state where it lives and return nothing
    transport.roll_back()
    transport.save_parties(tmp_path)
    assert [f.name for f in tmp_path.iterdir()] == ["k0.pt"]


@pytest.mark.slow  # starts Ray or trains on real data for seconds: with the slow tests
@pytest.mark.ray
def test_an_actor_ray_wraps_itself_would_run_the_drivers_function(ray_session):
    """What the host refuses is real: an actor class Ray wraps as usual runs any function the driver
    sends on its own object (``__ray_call__``), and so hands over its state."""

    class Open:
        def __init__(self):
            self.secret = 42

    actor = ray_session.remote(Open).options(num_cpus=0).remote()
    try:
        assert ray_session.get(actor.__ray_call__.remote(lambda self: self.secret)) == 42
    finally:
        ray_session.kill(actor)


def test_secret_attributes_never_reach_a_checkpoint_and_stay_live_on_load(tmp_path):
    party = Keeper.create(name="k0", seed=0)
    assert "key" not in plain(party)["attrs"] and "features" in plain(party)["attrs"]
    party.save(tmp_path / "k0.pt")
    assert party.key not in (tmp_path / "k0.pt").read_bytes()
    resumed = Keeper.create(name="k0", seed=1)
    resumed.key = b"fresh"
    resumed.load(tmp_path / "k0.pt")
    assert torch.equal(resumed.features, party.features) and resumed.key == b"fresh"
    Keeper.secret_state = frozenset()  # the check fails without the declaration
    try:
        party.save(tmp_path / "open.pt")
        assert party.key in (tmp_path / "open.pt").read_bytes()
    finally:
        Keeper.secret_state = frozenset({"key"})


SECURE = {"dataset": {"options": {"num_nodes": 150}}, "partition": {"num_clients": 3},
          "protocol": {"name": "fedavg", "group_size": 1}, "train": {"rounds": 2}, "network": {"compute": "ignore"},
          "privacy": {"secure_aggregation": True, "record_messages": True}}


def key_secrets(job: Run) -> list[bytes]:
    """Every party's private signing key, read from the live parties in this process (the round keys
    and what was agreed with them are dropped once a round's sum is revealed)."""
    return [party.secagg.identity.private for party in job.transport._parties.values()]


def test_a_checkpointed_secure_aggregation_run_writes_no_key_and_resumes_to_the_same_run(tmp_path):
    """Private keys stay in the parties: no file of the run folder (checkpoints, recorded masked
    messages) holds them. A resume agrees new keys, and secure aggregation being exact, the resumed
    run equals the uninterrupted one."""
    straight = run(build_config(SECURE), tmp_path / "straight").metrics
    first = Run(build_config({**SECURE, "train": {"rounds": 1}, "checkpoint_every": 1}), tmp_path / "b")
    first.execute(progress=False)
    second = Run(build_config({**SECURE, "checkpoint_every": 1}), tmp_path / "b")
    assert second.resume()
    resumed = second.execute(progress=False).metrics
    assert [{k: v for k, v in r.items() if k != "wall_time_s"} for r in resumed] == \
        [{k: v for k, v in r.items() if k != "wall_time_s"} for r in straight]
    secrets = key_secrets(first) + key_secrets(second)
    assert len(set(secrets)) == 2 * 3  # a resume agrees new keys
    assert any((tmp_path / "b").glob("parties-*/client0.pt")) and any((tmp_path / "b" / "messages").iterdir())
    assert files_holding(tmp_path / "b", secrets) == []
