"""A party's checkpoint as tensors and plain data, so that loading one can never run code.

``plain`` converts a party's attributes (modules and optimisers by their ``state_dict``, generators by
their state, numpy arrays as tensors, containers and objects recursively) into what
``torch.load(weights_only=True)`` reads; ``restore`` loads them back into the freshly set-up party
(same config, same data). An object's attributes its class names in ``secret_state`` are never
converted, nor loaded: a secret (a private key) never reaches a file, and the live object keeps its own.
"""

from __future__ import annotations

import importlib
import types
import weakref
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel

from .stored_paths import current_path

TAG = "__fedgl_state__"  # marks the dicts ``plain`` makes of values other than tensors and plain data
PRIMITIVES = (int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.Size)
# Code, and configuration (the resumed run's own config applies, e.g. its number of rounds)
NOT_STATE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType, type, weakref.ref,
             BaseModel)
_SKIP = object()


class StateMismatch(ValueError):
    """A saved state does not fit the object it is loaded into."""


def plain(value: Any, *, configs: bool = False, skip: tuple[type, ...] = ()) -> Any:
    """``value`` as tensors and plain data: objects with a ``state_dict`` (modules, optimisers) by it,
    generators by their state, numpy arrays as tensors, containers and other objects' attributes
    recursively. Code (functions, classes), references back up the object graph, secrets
    (``secret_names``) and instances of ``skip`` are left out; so is configuration (pydantic models)
    unless ``configs`` keeps it (a party's shard file holds the settings the party is made with)."""
    return _Plain(configs, skip).convert(value, frozenset())


class _Plain:
    def __init__(self, configs: bool, skip: tuple[type, ...]):
        self.configs, self.skip = configs, skip

    def convert(self, value: Any, active: frozenset[int]) -> Any:
        if isinstance(value, PRIMITIVES):
            return value
        if isinstance(value, torch.Tensor):  # without its autograd graph and Python attributes (caches)
            return value.detach() if value.grad_fn is not None or vars(value) else value
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray):
            return {TAG: "numpy", "data": torch.from_numpy(value.copy())}
        if isinstance(value, torch.Generator):
            return {TAG: "generator", "state": value.get_state()}
        if self.configs and isinstance(value, BaseModel):
            return {TAG: "config", "class": _class_path(type(value)), "data": value.model_dump()}
        if isinstance(value, NOT_STATE) or isinstance(value, self.skip) or id(value) in active:
            return _SKIP
        inner = active | {id(value)}
        if callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None)):
            return {TAG: "state_dict", "state": self.convert(value.state_dict(), inner)}
        if isinstance(value, dict):
            bad = [key for key in value if not _plain_key(key)]
            if bad:
                raise TypeError(f"cannot checkpoint a dict keyed by {type(bad[0]).__qualname__}")
            return _kept({key: self.convert(v, inner) for key, v in value.items()})
        if type(value) in (list, tuple, set):
            return type(value)(None if v is _SKIP else v for v in (self.convert(v, inner) for v in value))
        slots = [name for cls in type(value).__mro__ for name in getattr(cls, "__slots__", ()) if hasattr(value, name)]
        if not slots and not hasattr(value, "__dict__"):
            raise TypeError(f"cannot checkpoint a {type(value).__qualname__}")
        attrs = {name: getattr(value, name) for name in slots} | getattr(value, "__dict__", {})
        secret = secret_names(type(value))
        attrs = {name: v for name, v in attrs.items() if name not in secret}
        return {TAG: "object", "class": _class_path(type(value)),
                "attrs": _kept({name: self.convert(v, inner) for name, v in attrs.items()})}


def secret_names(cls: type) -> frozenset[str]:
    """The attributes ``cls`` and its bases declare secret (``secret_state``): never checkpointed."""
    return frozenset().union(*(vars(base).get("secret_state", ()) for base in cls.__mro__))


def _plain_key(key: Any) -> bool:
    return isinstance(key, PRIMITIVES) or (type(key) is tuple and all(map(_plain_key, key)))


def _kept(items: dict) -> dict:
    return {key: v for key, v in items.items() if v is not _SKIP}


def _class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def restore(current: Any, saved: Any) -> Any:
    """The value ``saved`` (made by ``plain``) describes, loaded into ``current`` where that exists:
    objects with a ``load_state_dict`` load their state, generators their state, other objects their
    attributes. Parameters are copied in place (optimisers refer to them); other tensors and containers
    are replaced, a tensor on the device of the live tensor it replaces (on the CPU, where the file is
    read, when there is none). An object missing from ``current`` is
    rebuilt only if its class is fedgl's own; a module or optimiser missing from it stays missing (a
    party that makes one during training, such as a fresh optimiser every round, makes it again before
    use)."""
    if isinstance(saved, dict) and TAG in saved:
        return _restore_tagged(current, saved)
    if isinstance(saved, torch.Tensor):
        if (isinstance(current, torch.Tensor) and current.requires_grad and current.is_leaf
                and saved.layout == torch.strided and current.shape == saved.shape and current.dtype == saved.dtype):
            with torch.no_grad():
                current.copy_(saved)
            return current
        # a checkpoint is read onto the CPU; a tensor the party keeps on its device goes back there
        return saved.to(current.device) if isinstance(current, torch.Tensor) else saved
    if isinstance(saved, dict):
        template = current if isinstance(current, dict) else {}
        out = template.copy()  # a defaultdict keeps its default factory
        out.clear()
        out.update({key: restore(template.get(key), v) for key, v in saved.items()})
        return out
    if isinstance(saved, (list, tuple)):
        same = isinstance(current, (list, tuple)) and len(current) == len(saved)
        return type(saved)(restore(current[i] if same else None, v) for i, v in enumerate(saved))
    return saved


def _restore_tagged(current: Any, saved: dict) -> Any:
    kind = saved[TAG]
    if kind == "numpy":
        return saved["data"].numpy()
    if kind == "generator":
        generator = current if isinstance(current, torch.Generator) else torch.Generator()
        return generator.set_state(saved["state"])
    if kind == "state_dict":
        if current is None:  # made during training (e.g. a fresh optimiser per round), made again before use
            return None
        if not callable(getattr(current, "load_state_dict", None)):
            raise StateMismatch(f"a saved state dict has no {type(current).__qualname__} to load into")
        current.load_state_dict(restore(None, saved["state"]))
        return current
    if kind == "config":
        return own_class(saved["class"]).model_validate(saved["data"])
    if kind == "object":
        same = current is not None and _class_path(type(current)) == current_path(saved["class"])
        target = current if same else None
        if target is None:
            cls = own_class(saved["class"])
            target = cls.__new__(cls)
        kept = secret_names(type(target))  # a file from before a secret was declared does not replace it
        for name, value in saved["attrs"].items():
            if name not in kept and not _configuration(target, name):
                object.__setattr__(target, name, restore(getattr(target, name, None), value))
        return target
    raise StateMismatch(f"unknown saved value {kind!r}")


def _configuration(target: Any, name: str) -> bool:
    """Whether ``name`` of the live ``target`` is configuration, which a file never sets: a settings
    object (the run's config applies; a tampered checkpoint must not lower DP's noise) or a read-only
    property (a value derived from one, as a file from before it was derived may still hold)."""
    live = getattr(target, name, None)
    return isinstance(live, BaseModel) or isinstance(getattr(type(target), name, None), property)


def own_class(path: str) -> type:
    """One of fedgl's own classes by its ``module:qualname`` path; nothing else is ever looked up."""
    module, _, qualname = current_path(path).partition(":")
    cls: Any = None
    if module.split(".")[0] == "fedgl":
        try:
            cls = importlib.import_module(module)
        except ImportError:
            cls = None
    for part in qualname.split(".") if cls is not None else ():
        cls = getattr(cls, part, None)
    if not isinstance(cls, type):
        raise StateMismatch(f"a saved {path} object has nothing to load into")
    return cls


def first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
