"""The Ray backend: parties live in Ray actors, on this machine or on a cluster.

Each actor (a ``PartyHost``) hosts a group of parties, so ten clients on a two-core machine need not
mean ten processes. A call to many parties becomes one remote call per host, and hosts run in
parallel. Measuring happens in the driver, in the shared ``Transport`` code, so ledgers match the
local backend byte for byte.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Sequence

import torch

from ..errors import ConfigError, FedglError, PartyFailure
from .network import NetworkModel
from .party import Party, PartyGroup
from .transport import Transport


def check_reachable(address: str, timeout_s: float) -> None:
    """Fail in ``timeout_s`` with one line when nothing listens at a ``host:port`` Ray address (Ray
    itself would wait forever). ``auto`` and addresses without a port are left to Ray."""
    target = address.split("://", 1)[-1]
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ConfigError(f"cannot reach Ray at {address}: {err.strerror or err} "
                          f"(waited up to {timeout_s:g} s; backend.connect_timeout_s)") from None


class PartyHost(PartyGroup):
    """A Ray actor holding several parties, with its own torch thread count."""

    def __init__(self, threads: int):
        super().__init__()
        torch.set_num_threads(threads)


class RayTransport(Transport):
    backend = "ray"

    def __init__(self, network: NetworkModel | None = None, *, address: str | None = None, actors: int | None = None,
                 connect_timeout_s: float = 30.0):
        super().__init__(network)
        try:
            import ray
        except ImportError as exc:
            raise ConfigError("backend 'ray' needs the ray package: pip install 'fedgl[ray]'") from exc
        self._ray = ray
        if address:
            check_reachable(address, connect_timeout_s)
        if not ray.is_initialized():
            try:
                if address:
                    ray.init(address=address, log_to_driver=False)
                else:
                    ray.init(  # on loopback only; Ray's token authentication stays on unless the user opts out
                        _node_ip_address="127.0.0.1",
                        num_cpus=os.cpu_count(),
                        include_dashboard=False,
                        log_to_driver=False,
                        object_store_memory=256 * 1024**2,
                        runtime_env={"env_vars": {"PYTHONHASHSEED": "0"}},
                    )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ConfigError(f"cannot start or reach Ray at {address or 'a local instance'}: {exc}") from exc
            self._owns_ray = True
        else:
            self._owns_ray = False
        self._max_actors = actors or os.cpu_count() or 1
        self._host_cls = ray.remote(num_cpus=0)(PartyHost)
        self._hosts: list[Any] = []
        self._placement: dict[str, int] = {}
        self._specs: dict[str, tuple[type[Party], dict[str, Any]]] = {}  # how each party was spawned
        self._dead: set[int] = set()  # hosts whose actor died (until revived)

    def _create(self, name: str, cls: type[Party], kwargs: dict[str, Any]) -> None:
        index = len(self._placement) % self._max_actors
        if index == len(self._hosts):
            self._hosts.append(self._new_host())
        self._placement[name] = index
        self._specs[name] = (cls, kwargs)
        self._ray.get(self._hosts[index].add.remote(name, cls, kwargs))

    def _new_host(self) -> Any:
        return self._host_cls.remote(torch.get_num_threads())

    def _gather(self, futures: dict[int, Any]) -> dict[int, Any]:
        """Each host's result; a host whose actor died raises ``PartyFailure`` naming its parties, and a
        one-line error raised inside a host (e.g. a refused checkpoint) is raised here as it was."""
        results, lost = {}, []
        for h, future in futures.items():
            try:
                results[h] = self._ray.get(future)
            except self._ray.exceptions.RayActorError:
                lost.append(h)
            except self._ray.exceptions.RayTaskError as err:
                if isinstance(err.cause, FedglError):
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
        results = self._gather({h: self._hosts[h].run.remote([calls[i] for i in idx]) for h, idx in by_host.items()})
        out: list[tuple[Any, tuple[float, float]]] = [None] * len(calls)  # type: ignore[list-item]
        for h, host_results in results.items():
            for i, result in zip(by_host[h], host_results):
                out[i] = result
        return out

    def _live(self) -> dict[int, Any]:
        return {h: host for h, host in enumerate(self._hosts) if h not in self._dead}

    def save_parties(self, folder: Path) -> None:
        self._gather({h: host.save.remote(str(folder)) for h, host in self._live().items()})

    def load_parties(self, folder: Path) -> None:
        self._gather({h: host.load.remote(str(folder)) for h, host in self._live().items()})

    def revive(self, parties: Sequence[str]) -> None:
        for h in sorted({self._placement[name] for name in parties}):
            self._hosts[h] = self._new_host()
            self._dead.discard(h)
            mine = [name for name, host in self._placement.items() if host == h]
            self._ray.get([self._hosts[h].add.remote(name, *self._specs[name]) for name in mine])

    def snapshot(self) -> dict[str, dict[str, Any]]:
        states: dict[str, dict[str, Any]] = {}
        for part in self._ray.get([host.snapshot.remote() for host in self._hosts]):
            states.update(part)
        return states

    def restore(self, states: dict[str, dict[str, Any]]) -> None:
        futures = []
        for h, host in enumerate(self._hosts):
            mine = {n: s for n, s in states.items() if self._placement[n] == h}
            futures.append(host.restore.remote(mine))
        self._ray.get(futures)

    def close(self) -> None:
        for host in self._hosts:
            self._ray.kill(host)
        self._hosts.clear()
        if self._owns_ray:
            self._ray.shutdown()
