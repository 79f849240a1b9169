"""The Ray backend: parties live in Ray actors, on this machine or on a cluster.

Each actor (a ``PartyHost``) hosts a group of parties, so ten clients on a two-core machine need not
mean ten processes. A call to many parties becomes one remote call per host, and hosts run in
parallel. Measuring happens in the driver, in the shared ``Transport`` code, so ledgers match the
local backend byte for byte. Dense tensors in calls and replies cross as numpy arrays (``pack``), which
Ray's object store moves without pickling their bytes.

The driver stays outside the parties: a host offers it ``@rpc`` calls and control verbs that move no
party state (``PartyHost``), and neither a host nor the scoring harness carries the methods Ray adds
to actor classes (``__ray_call__`` would run any function the driver sends on the host's own object).
A deployed host (its parties read their own shard files) never runs a party class the driver sends
(``add``); a host that has run one never makes a deployed party (``_settle``).
Ray is started or joined locked down (``ray_cluster``). Hosts start side by side: a transport starts its
first host as soon as it exists and sends every party it makes without waiting, then waits once.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..errors import ConfigError, FedglError, PartyFailure, out_of_memory
from .network import NetworkModel
from .party import Party
from .party_group import PartyGroup
from .party_state import StateMismatch, own_class
from .payload import broadcast_base
from .ray_cluster import init_ray
from .shard_file import EVALUATOR_PARTY, load_evaluator
from .transport import Transport

# Hosts of finished runs on a local Ray, emptied and kept for this process's next run with the same Ray,
# threads and device (``RayTransport.close``): a new host is a Python process importing torch, most of
# what a short run on Ray costs over one in-process.
_IDLE: dict[tuple[Any, ...], list[Any]] = {}


class _Array:
    """A dense CPU tensor on its way through Ray, as the numpy array Ray moves without pickling its
    bytes: FedAvg's 3.7 MB of Cora model rows make a round trip to an actor in 7 ms this way, against
    25 ms through torch's own pickling. A broadcast tensor (stride 0, such as one global model
    expanded to a row per client) travels once and is expanded on arrival into ``shape``."""

    __slots__ = ("array", "shape")

    def __init__(self, array: np.ndarray, shape: tuple[int, ...] | None):
        self.array, self.shape = array, shape


def pack(value: Any) -> Any:
    """``value`` with every dense CPU tensor in its dicts, lists and tuples as an ``_Array``."""
    if type(value) is torch.Tensor:
        if value.layout == torch.strided and value.device.type == "cpu" and not value.requires_grad:
            base = broadcast_base(value)
            try:  # out-of-band pickling needs contiguous bytes
                return _Array(base.contiguous().numpy(), None if base is value else tuple(value.shape))
            except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16), a conjugate view
                pass
        return value
    if type(value) is dict:
        return {key: pack(v) for key, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(pack(v) for v in value)
    return value


def unpack(value: Any) -> Any:
    """The inverse of ``pack``, each tensor its own copy (arrays read from Ray's object store are
    read-only views of shared memory); a broadcast tensor arrives as the same view of its copied row,
    as the in-process transport delivers it (``payload.copy``)."""
    if type(value) is _Array:
        tensor = torch.from_numpy(value.array.copy())
        return tensor if value.shape is None else tensor.expand(value.shape)
    if type(value) is dict:
        return {key: unpack(v) for key, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(unpack(v) for v in value)
    return value


class Sealed(type):
    """The type of the actor classes the driver reaches only through their own methods. Ray gives a
    class it makes an actor of ``__ray_call__`` (which runs any function the caller sends on the
    actor's own object), unless the class names its original actor class, which Ray then uses as it
    is: these name themselves (from their type, so that nothing in the class refers back to it)."""

    @property
    def __ray_actor_class__(cls) -> type:
        return cls


class PartyHost(metaclass=Sealed):
    """A Ray actor holding several parties (a ``PartyGroup``), with its own torch thread count. Its
    methods are all the driver can call: set-up (``add`` in a simulation, ``add_from_file`` where a
    deployed party reads its own shard; a host does one or the other for its whole life), ``@rpc``
    calls, and verbs that keep party states inside the host (``hold``/``roll_back``, each party's own
    checkpoint file ``save``/``load``), and ``clear`` at a run's end."""

    def __init__(self, threads: int, device: str = "cpu"):
        torch.set_num_threads(threads)
        self._device = device
        self._group = PartyGroup(device)
        self._deployed: bool | None = None  # fixed by the first party made (``_settle``); ``clear`` keeps it

    def clear(self) -> None:
        """Drop every party, its data and state: the run is over and the host waits for the next one."""
        self._group = PartyGroup(self._device)
        gc.collect()

    def add(self, name: str, cls: str | type[Party], kwargs: dict[str, Any]) -> None:
        """A simulation's party, made from what the driver sends (a fedgl class by its path, or a test's
        own class): refused by a deployed host, where that code would run beside parties kept from it."""
        _settle(self, deployed=False)
        self._group.add(name, _party_class(cls), kwargs)

    def add_from_file(self, name: str, cls_path: str, path: str, sha256: str) -> None:
        """A deployed party, made from its own shard file read here, its class resolved by its fedgl
        path (``own_class``); refused by a host that has run a class the driver sent."""
        _settle(self, deployed=True)
        self._group.add_from_file(name, cls_path, path, sha256)

    def run(self, calls: list) -> list:
        """``PartyGroup.run`` (``@rpc`` methods only) over Ray: calls and replies ``pack``ed."""
        return pack(self._group.run(unpack(calls)))

    def hold(self) -> None:
        self._group.hold()

    def roll_back(self) -> None:
        self._group.roll_back()

    def save(self, folder: str) -> None:
        self._group.save(folder)

    def load(self, folder: str) -> None:
        self._group.load(folder)

    def node_id(self) -> str:
        """The Ray node this host runs on (where its parties' data is)."""
        import ray

        return ray.get_runtime_context().get_node_id()


DEPLOYED_ADD = ("this party host is deployed: its parties are made only from their own shard files "
                "(add_from_file), never from a class the driver sends (add)")
SIMULATION_FILE = ("this party host has run a class the driver sent (add); a deployed party is made only "
                   "in a host that never has")


def _settle(host: PartyHost, deployed: bool) -> None:
    """Fix at its first party whether ``host`` is deployed, for the life of its process (a module
    function, so the driver cannot call it): code the driver sent may leave anything behind, and
    would share a deployed host with parties whose state is kept from the driver."""
    if host._deployed is None:
        host._deployed = deployed
    if host._deployed != deployed:
        raise ConfigError(DEPLOYED_ADD if host._deployed else SIMULATION_FILE)


def _party_class(cls: str | type) -> type[Party]:
    """The class ``add`` was sent: a fedgl class by its path, resolved here, or a class object (a
    simulation's test classes are not installed where the host runs)."""
    if isinstance(cls, str):
        try:
            cls = own_class(cls)
        except StateMismatch:
            raise ConfigError(f"party class {cls} is not one of fedgl's own") from None
    if not (isinstance(cls, type) and issubclass(cls, Party)):
        raise ConfigError(f"{cls!r} is not a party class")
    return cls


def wire_class(cls: type[Party]) -> str | type[Party]:
    """What ``add`` sends for ``cls``: its path if it is fedgl's own (the host resolves it itself, no
    class object crosses), otherwise the class (a test's, pickled by value)."""
    path = f"{cls.__module__}:{cls.__qualname__}"
    try:
        return path if own_class(path) is cls else cls
    except StateMismatch:
        return cls


class Referee(metaclass=Sealed):
    """A Ray actor holding the scoring harness, made from ``evaluator.pt`` where it runs (deployment)."""

    def __init__(self, path: str, sha256: str, threads: int):
        torch.set_num_threads(threads)
        self._evaluator = load_evaluator(path, sha256)

    def full_graph_logits(self, model: Any, model_name: str) -> torch.Tensor:
        return self._evaluator.full_graph_logits(model, model_name)

    def edge_logits(self, model: Any) -> torch.Tensor:
        return self._evaluator.edge_logits(model)

    def score(self, logits: torch.Tensor) -> dict[str, float]:
        return self._evaluator.score(logits)


class RemoteEvaluator:
    """The driver's handle on a ``Referee``: logits stay in Ray's object store on their way to scoring."""

    def __init__(self, transport: "RayTransport", actor: Any):
        self._transport, self._actor = transport, actor

    def full_graph_logits(self, model: Any, model_name: str) -> Any:
        return self._transport._send(self._actor, "full_graph_logits", model, model_name)

    def edge_logits(self, model: Any) -> Any:
        return self._transport._send(self._actor, "edge_logits", model)

    def score(self, logits: Any) -> dict[str, float]:
        return self._transport._ray.get(self._transport._send(self._actor, "score", logits))


class RayTransport(Transport):
    backend = "ray"

    def __init__(self, network: NetworkModel | None = None, device: str = "cpu", *, address: str | None = None,
                 actors: int | None = None, connect_timeout_s: float = 30.0, nodes: dict[str, str] | None = None,
                 auth: str = "token"):
        super().__init__(network, device)
        # Ray shows an actor only the GPUs it asked for, numbered from 0 there: a host asks for a share
        # of one and its parties use the one Ray gives it
        self._device = "cuda" if device.startswith("cuda") else device
        try:
            import ray
        except ImportError as exc:
            raise ConfigError("backend 'ray' needs the ray package: pip install 'fedgl[ray]'") from exc
        self._ray = ray
        self._owns_ray = init_ray(ray, address, connect_timeout_s, auth)  # token authentication, loopback
        self._keeps_hosts = address is None  # a cluster's hosts are stopped after each run
        if self._device == "cuda" and not ray.cluster_resources().get("GPU"):  # no host could ever start
            if self._owns_ray:
                ray.shutdown()
            raise ConfigError(f"device: {device}: the Ray cluster offers no GPU; use device: cpu")
        self._max_actors = actors or os.cpu_count() or 1
        self._nodes = nodes or {}  # party name -> the custom resource of the node it is pinned to
        self._hosts: list[Any] = []
        self._host_nodes: list[str | None] = []
        self._placement: dict[str, int] = {}
        self._specs: dict[str, tuple[str, tuple]] = {}  # how each party was made, to make it again
        self._dead: set[int] = set()  # hosts whose actor died (until revived)
        self._pending: list[tuple[int, Any]] = []  # parties sent to their hosts, not yet confirmed made
        self._deployed: bool | None = None  # whether this run's parties are made from shard files (``_mode``)
        self._first_idle = False  # the first host came from a finished run's hosts (``_IDLE``)
        # Called with (actor method, arguments) for everything the driver sends to an actor: what a
        # deployment test watches to prove no party's data leaves its node.
        self.outbound: list[Callable[[str, tuple], None]] = []
        if not self._nodes:  # its imports overlap the driver's set-up (every run places a party)
            self._first_idle = bool(self._keeps_hosts and _IDLE.get(self._host_key(None)))
            self._hosts.append(self._new_host(None))
            self._host_nodes.append(None)

    def _send(self, actor: Any, method: str, *args: Any) -> Any:
        for observer in self.outbound:
            observer(method, args)
        return getattr(actor, method).remote(*args)

    def _pinned(self, cls: Any, node: str | None) -> Any:
        options = {"num_cpus": 0} | ({"resources": {node: 0.001}} if node else {})
        if self._device == "cuda" and cls is PartyHost:  # the hosts of a node share its GPUs
            options["num_gpus"] = 1 / self._max_actors
        return self._ray.remote(cls).options(**options)  # num_cpus=0: threads are set per actor

    def _place(self, name: str) -> int:
        """The host of party ``name``: hosts are per node, up to ``actors`` of them on each."""
        node = self._nodes.get(name)
        mine = [h for h, n in enumerate(self._host_nodes) if n == node]
        placed = sum(1 for h in self._placement.values() if self._host_nodes[h] == node)
        slot = placed % self._max_actors
        if slot == len(mine):
            self._hosts.append(self._new_host(node))
            self._host_nodes.append(node)
            mine.append(len(self._hosts) - 1)
        self._placement[name] = mine[slot]
        return mine[slot]

    def spawn(self, cls: type[Party], configs: Sequence[dict[str, Any]]) -> list[str]:
        names = super().spawn(cls, configs)
        pending, self._pending = self._pending, []
        for h, future in pending:  # all sent: the hosts start and make their parties side by side
            self._gather({h: future})
        return names

    def _create(self, name: str, cls: type[Party], kwargs: dict[str, Any]) -> None:
        self._mode(deployed=False)
        self._specs[name] = ("add", (name, wire_class(cls), kwargs))
        h = self._place(name)
        self._pending.append((h, self._send(self._hosts[h], "add", *self._specs[name][1])))

    def _create_from_file(self, name: str, cls_path: str, path: str, sha256: str) -> None:
        self._mode(deployed=True)
        self._specs[name] = ("add_from_file", (name, cls_path, path, sha256))
        self._gather({0: self._send(self._hosts[self._place(name)], "add_from_file", name, cls_path, path, sha256)})

    def _mode(self, deployed: bool) -> None:
        """Fix at the first party whether this run is deployed. A deployed run never uses a host a
        simulation ran in (the host would refuse its parties, ``_settle``): a first host taken from a
        simulation's idle hosts goes back to them, and a new or deployed one takes its place."""
        if self._deployed is not None:
            return
        self._deployed = deployed
        if deployed and self._first_idle:
            _IDLE.setdefault(self._host_key(None, False), []).append(self._hosts[0])
            self._hosts[0] = self._new_host(None)

    def _new_host(self, node: str | None) -> Any:
        idle = _IDLE.get(self._host_key(node)) if self._keeps_hosts else None
        if idle:
            return idle.pop()
        return self._pinned(PartyHost, node).remote(torch.get_num_threads(), self._device)

    def _host_key(self, node: str | None, deployed: bool | None = None) -> tuple[Any, ...]:
        """Which idle hosts a host may be taken from or kept with: a deployed run's apart from a
        simulation's (a run not yet placing parties counts as a simulation)."""
        deployed = bool(self._deployed) if deployed is None else deployed
        return self._ray.get_runtime_context().gcs_address, node, torch.get_num_threads(), self._device, deployed

    def evaluator_from_file(self, path: str, sha256: str) -> RemoteEvaluator:
        node = self._nodes.get(EVALUATOR_PARTY)
        return RemoteEvaluator(self, self._pinned(Referee, node).remote(path, sha256, torch.get_num_threads()))

    def _gather(self, futures: dict[int, Any]) -> dict[int, Any]:
        """Each host's result; a host whose actor died raises ``PartyFailure`` naming its parties, and a
        one-line error raised inside a host (e.g. a refused checkpoint) or its running out of memory is
        raised here as it was."""
        results, lost = {}, []
        for h, future in futures.items():
            try:
                results[h] = self._ray.get(future)
            except self._ray.exceptions.RayActorError:
                lost.append(h)
            except self._ray.exceptions.RayTaskError as err:
                if isinstance(err.cause, FedglError) or out_of_memory(err.cause):
                    raise err.cause from None
                raise
        if lost:
            self._dead.update(lost)
            raise PartyFailure([name for name, h in self._placement.items() if h in lost])
        return results

    def _execute(self, calls: list[tuple[str, str, dict[str, Any]]]) -> list[tuple[Any, tuple[float, float]]]:
        by_host: dict[int, list[int]] = {}
        for i, (name, _, _) in enumerate(calls):
            by_host.setdefault(self._placement[name], []).append(i)
        results = self._gather({h: self._send(self._hosts[h], "run", pack([calls[i] for i in idx]))
                                for h, idx in by_host.items()})
        results = {h: unpack(host_results) for h, host_results in results.items()}
        out: list[tuple[Any, tuple[float, float]]] = [None] * len(calls)  # type: ignore[list-item]
        for h, host_results in results.items():
            for i, result in zip(by_host[h], host_results):
                out[i] = result
        return out

    def _live(self) -> dict[int, Any]:
        return {h: host for h, host in enumerate(self._hosts) if h not in self._dead}

    def hold(self) -> None:
        self._gather({h: self._send(host, "hold") for h, host in self._live().items()})

    def roll_back(self) -> None:
        self._gather({h: self._send(host, "roll_back") for h, host in self._live().items()})

    def save_parties(self, folder: Path) -> None:
        self._gather({h: self._send(host, "save", str(folder)) for h, host in self._live().items()})

    def load_parties(self, folder: Path) -> None:
        self._gather({h: self._send(host, "load", str(folder)) for h, host in self._live().items()})

    def revive(self, parties: Sequence[str]) -> None:
        for h in sorted({self._placement[name] for name in parties}):
            self._hosts[h] = self._new_host(self._host_nodes[h])
            self._dead.discard(h)
            mine = [name for name, host in self._placement.items() if host == h]
            self._ray.get([self._send(self._hosts[h], method, *args)
                           for method, args in (self._specs[name] for name in mine)])

    def close(self) -> None:
        """End this run. On a local Ray its hosts are emptied and kept for the process's next run (a bench's
        runs start no new host); on a cluster, or where emptying fails, they are stopped. A Ray instance
        this process started stays up for its next runs (Ray stops it when the process exits); one it only
        joined is left as it was."""
        live = [h for h in range(len(self._hosts)) if h not in self._dead] if self._keeps_hosts else []
        cleared = {h: self._send(self._hosts[h], "clear") for h in live}  # all sent, then waited for
        for h, host in enumerate(self._hosts):
            try:
                if h in cleared:
                    self._ray.get(cleared[h])
                    _IDLE.setdefault(self._host_key(self._host_nodes[h]), []).append(host)
                    continue
            except (self._ray.exceptions.RayActorError, self._ray.exceptions.RayTaskError):
                pass
            self._ray.kill(host)
        self._hosts.clear()
