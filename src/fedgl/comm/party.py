"""The base of every party that lives behind the transport.

A party owns its private state (its shard, model, optimiser) and exposes only ``@rpc`` methods.
Each party carries its own random-number state, swapped in around every call, so its dropout and
sampling draws depend only on its seed and its own history, never on which process hosts it or in
which order parties are called: this is what makes the local and Ray backends agree exactly.

A party's checkpoint holds tensors and plain data only and is read with ``weights_only=True``, so
loading a checkpoint file can never run code (``party_state``). Attributes a party class names in
``secret_state`` (e.g. a key-agreement private key) are never written to it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

import torch

from ..device import CPU, is_cpu, move, rng_state, set_rng_state, to_wire, working_on
from ..errors import ConfigError
from ..files import load_tensors, write_atomically
from .party_state import StateMismatch, first_line, plain, restore
from .rpc import spec_of


class Party:
    device = CPU  # where the party computes (``fedgl.device``); set by ``create``
    # Attributes never checkpointed (``party_state``), such as key-agreement secrets: a resumed party
    # keeps the ones it was made with, and the protocol agrees keys again. Subclasses and mixins add
    # their own names; the union over the class's bases applies.
    secret_state: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, name: str, seed: int = 0):
        self.name = name
        self.seed = seed

    @classmethod
    def dealt(cls, configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The constructor arguments of these parties with what the driver adds as it places their
        shards (secure aggregation's identities, ``protocols.aggregation``): nothing by default."""
        return configs

    @classmethod
    def create(cls, device: torch.device = CPU, **kwargs: Any) -> "Party":
        """Construct under the party's own seed, so model initialisation does not depend on the host,
        with its data on its ``device``."""
        outer, outer_device = torch.get_rng_state(), rng_state(device)
        torch.manual_seed(kwargs.get("seed", 0))  # seeds the accelerators too
        try:
            with working_on(device):
                party = cls(**(kwargs if is_cpu(device) else move(kwargs, device)))
            party.device = device
            party._rng_state, party._device_rng_state = torch.get_rng_state(), rng_state(device)
        finally:
            torch.set_rng_state(outer)
            set_rng_state(device, outer_device)
        return party

    def get_state(self) -> dict[str, Any]:
        """Everything the party holds, as live objects, for an in-memory snapshot (not a message)."""
        return dict(self.__dict__)

    def save(self, path: str | Path) -> None:
        """Write the party's own checkpoint where it lives, owner-only (it holds the party's data and its
        unreleased model); its state never travels. Tensors are saved from the CPU, so the file reads on
        any machine (a run still resumes on its own device only)."""
        write_atomically(Path(path), lambda fh: torch.save(to_wire(plain(self)), fh), private=True)

    def load(self, path: str | Path) -> None:
        """Load the party's own checkpoint into this party, set up as it was when saved. The file is
        read as tensors and plain data only: one that holds anything else is refused."""
        state = load_tensors(path, "cannot resume: the party checkpoint")
        try:
            if restore(self, state) is not self:
                raise StateMismatch(f"it is not a checkpoint of a {type(self).__qualname__}")
        except (AttributeError, RuntimeError, KeyError, TypeError, ValueError) as err:  # StateMismatch: ValueError
            raise ConfigError(f"cannot resume: the party checkpoint {path} does not fit party {self.name} "
                              f"({first_line(err)})") from None

    def dispatch(self, method: str, kwargs: dict[str, Any]) -> tuple[Any, tuple[float, float]]:
        """Run an ``@rpc`` method under this party's RNG state; return its result and its (elapsed,
        CPU) seconds."""
        spec_of(type(self), method)
        outer = torch.get_rng_state()
        torch.set_rng_state(self._rng_state)
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            if is_cpu(self.device):
                result = getattr(self, method)(**kwargs)
            else:
                result = self._on_device(method, kwargs)
        finally:
            seconds = (time.perf_counter() - start, time.process_time() - start_cpu)
            self._rng_state = torch.get_rng_state()
            torch.set_rng_state(outer)
        return result, seconds

    def _on_device(self, method: str, kwargs: dict[str, Any]) -> Any:
        """The call with the party's accelerator random state swapped in: what arrives moves onto the
        party's device, what leaves crosses as CPU tensors."""
        device = self.device
        outer = rng_state(device)
        set_rng_state(device, self._device_rng_state)
        try:
            with working_on(device):
                return to_wire(getattr(self, method)(**move(kwargs, device)))
        finally:
            self._device_rng_state = rng_state(device)
            set_rng_state(device, outer)
