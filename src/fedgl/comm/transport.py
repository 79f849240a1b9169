"""The transport: the only way the protocol (server side) reaches a client.

The protocol calls named ``@rpc`` methods of one or many parties; the transport measures every
argument as sent and every result as received into the ledger, under the kinds the method declares,
and advances the simulated clock. Backends differ only in where parties live and how a call is
executed (``LocalTransport`` in-process, ``RayTransport`` in Ray actors); this module holds the
measuring, which is therefore identical for every backend.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from ..device import to_wire
from .ledger import EVAL, SERVER, Ledger
from .network import NetworkModel, SimClock
from .party import Party
from .party_group import PartyGroup
from .rpc import Measured, measure_args, measure_result, spec_of
from .shard_file import load_evaluator


class Transport:
    backend = "abstract"

    def __init__(self, network: NetworkModel | None = None, device: str = "cpu"):
        self.accelerated = device != "cpu"  # the parties (and a server that trains) compute off the CPU
        self.ledger = Ledger()
        self.clock = SimClock(network or NetworkModel())
        self._classes: dict[str, type[Party]] = {}
        self._evaluating = False
        self._mark = time.perf_counter(), time.process_time()
        self.compute_s: dict[str, float] = {}  # CPU seconds of each party's training calls
        # Called with (round, sender, receiver, method, payload, evaluating) for every message, after
        # it is measured: e.g. the recorder ``fedgl audit`` reads (``privacy.record_messages``).
        self.observers: list[Callable[[int, str, str, str, Any, bool], None]] = []

    # ---- backend hooks ----------------------------------------------------------------------------
    def _create(self, name: str, cls: type[Party], kwargs: dict[str, Any]) -> None:
        raise NotImplementedError

    def _execute(self, calls: list[tuple[str, str, dict[str, Any]]]) -> list[tuple[Any, tuple[float, float]]]:
        """Run ``(party, method, kwargs)`` calls, concurrently where the backend can; each result comes
        with the call's (elapsed, CPU) seconds."""
        raise NotImplementedError

    def hold(self) -> None:
        """Every party keeps a copy of its state where it lives (not traffic), e.g. to try a setting
        for a round and go back."""
        raise NotImplementedError

    def roll_back(self) -> None:
        """Every party returns to the state it kept at the last ``hold``."""
        raise NotImplementedError

    def save_parties(self, folder: Path) -> None:
        """Every party writes its own checkpoint to ``folder/<name>.pt`` where it lives."""
        raise NotImplementedError

    def load_parties(self, folder: Path) -> None:
        """Every party reloads its own checkpoint from ``folder``."""
        raise NotImplementedError

    def revive(self, parties: Sequence[str]) -> None:
        """Recreate lost parties as they were spawned (their state is then loaded from a checkpoint)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the backend's resources."""

    # ---- parties ----------------------------------------------------------------------------------
    def spawn(self, cls: type[Party], configs: Sequence[dict[str, Any]]) -> list[str]:
        """Create one party per config (each must hold a unique ``name``); placing private data is not a message."""
        names = []
        for kwargs in cls.dealt([dict(kwargs) for kwargs in configs]):
            name = kwargs["name"]
            if name in self._classes or name == SERVER:
                raise ValueError(f"party name {name!r} is taken")
            self._classes[name] = cls
            self._create(name, cls, dict(kwargs))
            names.append(name)
        self.idle()
        return names

    def spawn_from_file(self, name: str, cls: type[Party], cls_path: str, path: str, sha256: str) -> None:
        """Make party ``name`` (a ``cls``) from its own shard file, which the party reads (and checks
        against ``sha256``) where it lives; the file never passes through here (deployment)."""
        if name in self._classes or name == SERVER:
            raise ValueError(f"party name {name!r} is taken")
        self._classes[name] = cls
        self._create_from_file(name, cls_path, path, sha256)
        self.idle()

    def _create_from_file(self, name: str, cls_path: str, path: str, sha256: str) -> None:
        raise NotImplementedError

    def evaluator_from_file(self, path: str, sha256: str) -> Any:
        """The scoring harness, made where ``path`` (``evaluator.pt``, checked against ``sha256``) is."""
        return load_evaluator(path, sha256)

    @property
    def parties(self) -> list[str]:
        return list(self._classes)

    # ---- calls ------------------------------------------------------------------------------------
    def call(self, target: str, method: str, **kwargs: Any) -> Any:
        return self.call_many([target], method, **kwargs)[0]

    def call_many(
        self,
        targets: Sequence[str],
        method: str,
        per_target: Sequence[dict[str, Any]] | None = None,
        **shared: Any,
    ) -> list[Any]:
        """Call ``method`` on every target at once; ``per_target[i]`` adds target i's own arguments."""
        if per_target is not None and len(per_target) != len(targets):
            raise ValueError("per_target needs one dict per target")
        calls = [(target, {**shared, **(per_target[i] if per_target is not None else {})})
                 for i, target in enumerate(targets)]
        results: list[tuple[str, Any]] = []
        self._phase(method, [calls], results.extend)
        return [result for _, result in results]

    def call_batches(
        self,
        batches: Sequence[Sequence[str]],
        method: str,
        arguments: Callable[[str], dict[str, Any]],
        fold: Callable[[list[tuple[str, Any]]], None],
        **shared: Any,
    ) -> None:
        """One phase of ``call_many`` sent a batch of targets at a time, for a caller that cannot hold
        every reply at once: a batch's arguments are built (``arguments(target)``) just before it is
        sent, and its ``(target, result)`` pairs go to ``fold`` before the next batch is built; nothing
        here keeps them, so what ``fold`` does not keep is freed. Each target gets the one message
        ``call_many`` would send it, measured the same way, and the whole phase is one phase on the
        clock (the caller's work between batches is server compute)."""
        self._phase(method, ([(target, {**shared, **arguments(target)}) for target in batch]
                             for batch in batches), fold)

    def _phase(self, method: str, batches: Iterable[list[tuple[str, dict[str, Any]]]],
               fold: Callable[[list[tuple[str, Any]]], None]) -> None:
        """Send ``(target, kwargs)`` calls batch by batch, each batch's results to ``fold``; the
        parties' times make one clock phase when the last batch is done."""
        times: dict[str, float] = {}
        for calls in batches:
            fold(self._run_batch(method, calls, times))
        if not self._evaluating:
            self.clock.phase(times)

    def _run_batch(self, method: str, calls: list[tuple[str, dict[str, Any]]], times: dict[str, float]
                   ) -> list[tuple[str, Any]]:
        """One batch: server compute since the last batch or call is charged, every message measured
        both ways, each target's (download + compute + upload) seconds put in ``times``."""
        self._charge_server()
        if self.accelerated:  # what a server computing on an accelerator sends crosses as CPU tensors
            calls = [(target, to_wire(kwargs)) for target, kwargs in calls]
        network = self.clock.network
        downs: list[Measured] = []
        for target, kwargs in calls:
            down = measure_args(spec_of(self._classes[target], method), kwargs)
            self._record(SERVER, target, down, kwargs, method)
            self._observe(SERVER, target, method, kwargs)
            downs.append(down)
        outcomes = self._execute([(target, method, kwargs) for target, kwargs in calls])
        for (target, kwargs), down, (result, seconds) in zip(calls, downs, outcomes):
            up = measure_result(spec_of(self._classes[target], method), result)
            self._record(target, SERVER, up, kwargs, method)
            self._observe(target, SERVER, method, result)
            times[target] = (
                self._transfer_s(down) + network.compute_s(*seconds) + self._transfer_s(up)
            )
            if not self._evaluating:
                self.compute_s[target] = self.compute_s.get(target, 0.0) + seconds[1]
        self.idle()
        return [(target, result) for (target, _), (result, _) in zip(calls, outcomes)]

    def _transfer_s(self, m: Measured) -> float:
        # A user group's rows travel on each user's own link, in parallel: the slowest row counts.
        network = self.clock.network
        if m.rows:
            row_bytes = max(b for _, _, b in m.rows)
            rest = m.total - sum(n * b for _, n, b in m.rows)
            return network.transfer_s(row_bytes + rest)
        return network.transfer_s(m.total)

    def _record(self, src: str, dst: str, m: Measured, kwargs: dict[str, Any], method: str) -> None:
        ledger = self.ledger
        for kind, size in m.by_kind.items():
            ledger.record(src, dst, EVAL if self._evaluating else kind, size, method=method)
        if self._evaluating:
            return
        group, direction = (dst, "down") if src == SERVER else (src, "up")
        for _, n, bytes_each in m.rows:
            members = kwargs.get("users")
            members = torch.arange(n) if members is None else torch.as_tensor(members, dtype=torch.long)
            ledger.record_members(group, direction, members, bytes_each)

    def _observe(self, src: str, dst: str, method: str, payload: Any) -> None:
        for observer in self.observers:
            observer(self.ledger.round, src, dst, method, payload, self._evaluating)

    def _charge_server(self) -> None:
        """Server compute since the last call counts on the clock (not while evaluating)."""
        wall, cpu = time.perf_counter() - self._mark[0], time.process_time() - self._mark[1]
        if not self._evaluating:
            self.clock.phase({SERVER: self.clock.network.compute_s(wall, cpu)})

    # ---- scopes -----------------------------------------------------------------------------------
    @contextmanager
    def evaluation(self) -> Iterator[None]:
        """Traffic inside is recorded as ``eval`` and does not advance the clock."""
        self._evaluating = True
        try:
            yield
        finally:
            self._evaluating = False
            self.idle()

    @contextmanager
    def parallel(self) -> Iterator[None]:
        """Calls inside run side by side: the block lasts as long as the busiest party."""
        self.clock.open_lanes()
        try:
            yield
        finally:
            self._charge_server()
            self.clock.close_lanes()
            self.idle()

    def idle(self) -> None:
        """Forget server time since the last call (evaluation, logging, checkpointing)."""
        self._mark = time.perf_counter(), time.process_time()

    def set_round(self, r: int) -> None:
        self.ledger.round = r


class LocalTransport(Transport):
    """Parties as objects in this process; every payload is copied both ways, as a wire would, except a
    result its party hands over (storage it no longer uses)."""

    backend = "local"

    def __init__(self, network: NetworkModel | None = None, device: str = "cpu"):
        super().__init__(network, device)
        self._group = PartyGroup(device)
        self._parties = self._group.parties

    def _create(self, name: str, cls: type[Party], kwargs: dict[str, Any]) -> None:
        self._group.add(name, cls, kwargs)

    def _create_from_file(self, name: str, cls_path: str, path: str, sha256: str) -> None:
        self._group.add_from_file(name, cls_path, path, sha256)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Every party's live state, for tests that inspect parties in-process; never for a protocol
        (a party's state does not leave it: protocols use ``hold``/``roll_back``), and no other
        backend offers it."""
        return self._group.snapshot()

    def hold(self) -> None:
        self._group.hold()

    def roll_back(self) -> None:
        self._group.roll_back()

    def save_parties(self, folder: Path) -> None:
        self._group.save(folder)

    def load_parties(self, folder: Path) -> None:
        self._group.load(folder)

    def _execute(self, calls: list[tuple[str, str, dict[str, Any]]]) -> list[tuple[Any, tuple[float, float]]]:
        return [self._copied(name, method, kwargs) for name, method, kwargs in calls]

    def _copied(self, name: str, method: str, kwargs: dict[str, Any]) -> tuple[Any, tuple[float, float]]:
        """One call on copies both ways; the party's own result is gone once its copy is made. A result
        the party hands over (``@rpc(handover=True)``) is passed on as it is, detached."""
        from .payload import copy, detached

        [(result, seconds)] = self._group.run([(name, method, copy(kwargs))])
        handed = spec_of(self._classes[name], method).handover
        return (detached(result) if handed else copy(result)), seconds
