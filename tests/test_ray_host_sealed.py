"""A deployed party host makes its parties only from their own shard files. A party class the driver
sends (``add``) would run inside the host, where an ``@rpc`` method can walk the process's objects and
hand over every co-hosted party's state: a deployed host refuses it, and a host that has run one never
makes a deployed party. Checked on a host in this process, over a stand-in Ray (which hosts a deployed
run gets), and over a real local Ray, where the same thief does read a simulation's co-hosted party."""

from __future__ import annotations

import gc
import json
import sys

import pytest
import torch

from fedgl.comm import Party, make_transport, ray_transport, rpc
from fedgl.comm.party_state import own_class
from fedgl.comm.ray_transport import (
    DEPLOYED_ADD,
    SIMULATION_FILE,
    PartyHost,
    pack,
    unpack,
)
from fedgl.config import build_config
from fedgl.deployment import MANIFEST, write_shards
from fedgl.errors import ConfigError

SETTINGS = {"dataset": {"options": {"num_nodes": 150}}, "partition": {"num_clients": 3},
            "protocol": {"name": "fedavg", "group_size": 1}, "train": {"rounds": 1},
            "network": {"compute": "ignore"}}
FEDAVG = "fedgl.protocols.fedavg.client:FedAvgClient"


class Keeper(Party):
    """A simulation's party with data and a secret."""

    def __init__(self, name: str, seed: int = 0):
        super().__init__(name, seed)
        self.features = torch.randn(4, 3)
        self.key = b"\x13" * 16 + bytes(range(16))  # stands for a private key

    @rpc(returns="embedding")
    def embed(self) -> torch.Tensor:
        return self.features.sum(0)


class Thief(Party):
    """A party class of the driver's own: its ``@rpc`` method hands over the data, keys and model of
    every other party in its process."""

    @rpc(returns="control")
    def steal(self) -> dict:
        return {p.name: {k: v for k, v in vars(p).items() if isinstance(v, (torch.Tensor, bytes))}
                for p in gc.get_objects() if issubclass(type(p), Party) and p is not self}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """A FedAvg shard folder (``fedgl partition``) and its parties' manifest entries."""
    folder = tmp_path_factory.mktemp("shards")
    write_shards(build_config(SETTINGS), folder)
    return folder, json.loads((folder / MANIFEST).read_text())["parties"]


def deployed_host(shards) -> PartyHost:
    folder, parties = shards
    host = PartyHost(1)
    for party in parties:
        host.add_from_file(party["name"], party["class"], str(folder / party["file"]), party["sha256"])
    return host


def test_a_deployed_host_refuses_every_class_the_driver_sends(shards):
    host = deployed_host(shards)
    for cls in (Thief, FEDAVG):  # a class object, or even fedgl's own class by its path
        with pytest.raises(ConfigError) as refused:
            host.add("thief", cls, {"name": "thief"})
        assert str(refused.value) == DEPLOYED_ADD and "\n" not in DEPLOYED_ADD
    host.clear()  # the next run's parties: still only from their files
    with pytest.raises(ConfigError, match="is deployed"):
        host.add("thief", Thief, {"name": "thief"})
    with pytest.raises(KeyError):
        host.run([("thief", "steal", {})])


def test_a_host_that_ran_a_drivers_class_never_makes_a_deployed_party(shards):
    """What the refusal stops is real: a class the driver sends reads a co-hosted party's secrets,
    so its host (even emptied) must never hold a deployed party."""
    folder, parties = shards
    host = PartyHost(1)
    host.add("k0", Keeper, {"name": "k0"})
    host.add("thief", Thief, {"name": "thief"})
    [(stolen, _)] = host.run([("thief", "steal", {})])
    assert stolen["k0"]["key"] == host._group.parties["k0"].key
    host.clear()
    party = parties[0]
    with pytest.raises(ConfigError) as refused:
        host.add_from_file(party["name"], party["class"], str(folder / party["file"]), party["sha256"])
    assert str(refused.value) == SIMULATION_FILE


def test_a_simulation_sends_fedgl_classes_by_path_resolved_in_the_host():
    assert ray_transport.wire_class(own_class(FEDAVG)) == FEDAVG
    assert ray_transport.wire_class(Thief) is Thief  # a test's class is not installed where a host runs
    host = PartyHost(1)
    for path in ("os:system", "fedgl.comm.party_state:StateMismatch"):
        with pytest.raises(ConfigError, match="not one of fedgl's own|not a party class"):
            host.add("x", path, {"name": "x"})


def test_a_deployed_run_never_gets_a_host_a_simulation_ran_in(shards, monkeypatch):
    """A local Ray keeps a finished run's hosts for the next run: a deployed run takes none that ran a
    simulation (its first host, started before the run says what it is, goes back), and a later
    simulation gets that one again, never the deployed run's."""
    from test_ray_startup import stand_in_ray

    folder, parties = shards
    monkeypatch.setitem(sys.modules, "ray", stand_in_ray([]))
    monkeypatch.setattr(ray_transport, "init_ray", lambda *args: False)
    monkeypatch.setattr(ray_transport, "_IDLE", {})
    simulation = ray_transport.RayTransport(actors=1)
    simulation.spawn(Thief, [{"name": "thief", "seed": 0}])
    [tainted] = simulation._hosts
    simulation.close()
    deployed = ray_transport.RayTransport(actors=1)
    assert deployed._hosts == [tainted]
    for party in parties:
        deployed.spawn_from_file(party["name"], own_class(party["class"]), party["class"],
                                 str(folder / party["file"]), party["sha256"])
    [host] = deployed._hosts
    assert host is not tainted
    with pytest.raises(ConfigError, match="is deployed"):
        deployed.spawn(Thief, [{"name": "thief", "seed": 0}])
    deployed.close()
    assert ray_transport.RayTransport(actors=1)._hosts == [tainted]


@pytest.mark.slow  # starts Ray and two hosts: seconds
@pytest.mark.ray
def test_over_ray_a_deployed_host_refuses_the_thief_a_simulation_host_runs(shards, ray_session):
    ray_session.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # test classes are not installed
    simulation = make_transport("ray", actors=1)
    try:  # no isolation is claimed here: the thief reads its co-hosted party
        simulation.spawn(Keeper, [{"name": "k0", "seed": 0}])
        simulation.spawn(Thief, [{"name": "thief", "seed": 0}])
        [(stolen, _)] = unpack(ray_session.get(simulation._hosts[0].run.remote(pack([("thief", "steal", {})]))))
        assert stolen["k0"]["key"] == Keeper("k0").key
    finally:
        simulation.close()  # its host is kept for a simulation: the deployed run below must not get it
    folder, parties = shards
    deployed = make_transport("ray", actors=1)
    try:
        for party in parties:
            deployed.spawn_from_file(party["name"], own_class(party["class"]), party["class"],
                                     str(folder / party["file"]), party["sha256"])
        [host] = deployed._hosts
        with pytest.raises(ray_session.exceptions.RayTaskError) as refused:  # the driver calling the host itself
            ray_session.get(host.add.remote("thief", Thief, {"name": "thief", "seed": 0}))
        assert isinstance(refused.value.cause, ConfigError) and str(refused.value.cause) == DEPLOYED_ADD
        with pytest.raises(ConfigError) as refused:  # through the transport: one line
            deployed.spawn(Thief, [{"name": "thief2", "seed": 0}])
        assert str(refused.value) == DEPLOYED_ADD
        for name in ("thief", "thief2"):  # nothing of the thief's was made
            with pytest.raises(ray_session.exceptions.RayTaskError, match="KeyError"):
                ray_session.get(host.run.remote(pack([(name, "steal", {})])))
    finally:
        deployed.close()
