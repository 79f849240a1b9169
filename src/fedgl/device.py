"""Where a party computes: ``device: cpu | cuda | cuda:N`` in the config.

A party's data, model and working tensors live on its device; everything it sends crosses as CPU
tensors (the wire), and what it receives is moved onto its device when it arrives (``Party.dispatch``),
so the ledger and both backends see the same payloads whatever the device. While a party works, its
device is torch's default device, so tensors it makes without naming a device land beside its data
(not in autograd's backward, where code names the device of its inputs), and its accelerator's random
state is its own, like its CPU random state. A party on the CPU takes none of these steps.
"""

from __future__ import annotations

import copy
import dataclasses
from contextlib import nullcontext
from typing import Any, ContextManager

import torch

from .errors import ConfigError

CPU = torch.device("cpu")


def resolve(name: str) -> torch.device:
    """The device ``name`` names, refused with one line when this machine cannot compute there."""
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device: {name}: torch sees no CUDA device here (torch {torch.__version__}"
                              f"{', built without CUDA' if torch.version.cuda is None else ''}); use device: cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"device: {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def is_cpu(device: torch.device | None) -> bool:
    return device is None or device.type == "cpu"


def move(obj: Any, device: torch.device) -> Any:
    """``obj`` with every tensor in it on ``device``: tensors, containers, dataclasses (shards) and
    PyG ``Data``; anything else (settings, numbers, generators) as it is."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: move(v, device) for k, v in obj.items()}
    if isinstance(obj, list):
        return [move(v, device) for v in obj]
    if isinstance(obj, tuple):
        return type(obj)(*(move(v, device) for v in obj)) if hasattr(obj, "_fields") else tuple(
            move(v, device) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: move(getattr(obj, f.name), device)
                                           for f in dataclasses.fields(obj) if f.init})
    if hasattr(obj, "to") and type(obj).__module__.startswith("torch_geometric.data"):
        return copy.copy(obj).to(device)  # ``Data.to`` replaces the tensors of the object it is called on
    return obj


def to_wire(obj: Any) -> Any:
    """``obj`` as it crosses a party boundary or goes into a checkpoint: every tensor on the CPU (the
    object itself when all already are)."""
    return obj if not _has_device_tensor(obj) else move(obj, CPU)


def _has_device_tensor(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return obj.device.type != "cpu"
    if isinstance(obj, dict):
        return any(_has_device_tensor(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_has_device_tensor(v) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return any(_has_device_tensor(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return False


def working_on(device: torch.device | None) -> ContextManager:
    """Make ``device`` torch's default for tensors made without one (nothing to do on the CPU)."""
    return nullcontext() if is_cpu(device) else device


def generator(device: torch.device | None = None) -> torch.Generator:
    """A random generator for draws made on ``device`` (default: the device a party is working on)."""
    device = device if device is not None else torch.get_default_device()
    return torch.Generator() if is_cpu(device) else torch.Generator(device=device)


def rng_state(device: torch.device | None) -> torch.Tensor | None:
    """The process's random state on ``device``'s accelerator (None on the CPU, whose state is apart)."""
    return torch.cuda.get_rng_state(device) if device is not None and device.type == "cuda" else None


def set_rng_state(device: torch.device | None, state: torch.Tensor | None) -> None:
    if state is not None:
        torch.cuda.set_rng_state(state, device)
