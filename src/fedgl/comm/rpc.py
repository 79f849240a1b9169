"""Declaring which party methods may be called across the boundary, and what their messages are.

A client method becomes callable by the protocol only through ``@rpc``, which names the kind of each
argument and of the result (model, gradient, embedding, index, label, ...). The transport reads these
declarations to file every measured byte under its kind; undeclared arguments count as ``control``.
``Rows(kind)`` marks a tensor whose rows belong to the individual members of a vectorised user group,
so each user's share is accounted to that user. ``handover=True`` declares that the party keeps no
live use of its result (``payload.outbox`` storage): the in-process transport then passes it on
without a copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Union

from . import payload

KINDS = ("model", "gradient", "embedding", "index", "label", "prediction", "control", "eval")


@dataclass(frozen=True)
class Rows:
    """A tensor payload whose leading dimension indexes members of a user group."""

    kind: str


Kind = Union[str, Rows]


@dataclass(frozen=True)
class RpcSpec:
    args: dict[str, Kind]
    returns: Kind | dict[str, Kind]
    handover: bool = False


def rpc(returns: Kind | dict[str, Kind] = "control", handover: bool = False, **args: Kind) -> Callable:
    """Mark a party method as remotely callable and declare its message kinds (``handover``: above)."""
    for kind in [*args.values(), *(returns.values() if isinstance(returns, dict) else [returns])]:
        name = kind.kind if isinstance(kind, Rows) else kind
        if name not in KINDS:
            raise ValueError(f"unknown message kind {name!r}; allowed: {', '.join(KINDS)}")

    def mark(fn: Callable) -> Callable:
        fn.rpc_spec = RpcSpec(dict(args), returns, handover)
        return fn

    return mark


def spec_of(cls: type, method: str) -> RpcSpec:
    fn = getattr(cls, method, None)
    spec = getattr(fn, "rpc_spec", None)
    if spec is None:
        raise AttributeError(f"{cls.__name__}.{method} is not a remotely callable (@rpc) method")
    return spec


@dataclass
class Measured:
    """Bytes of one message by kind, plus per-row sizes for user-group payloads."""

    by_kind: dict[str, int]
    rows: list[tuple[str, int, int]]  # (kind, number of rows, bytes per row)

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())


def _add(m: Measured, kind: Kind, value: Any) -> None:
    name = kind.kind if isinstance(kind, Rows) else kind
    size = payload.nbytes(value)
    if size == 0:
        return
    m.by_kind[name] = m.by_kind.get(name, 0) + size
    if isinstance(kind, Rows):
        n = len(value)
        m.rows.append((name, n, size // max(n, 1)))


def measure_args(spec: RpcSpec, kwargs: dict[str, Any]) -> Measured:
    m = Measured({}, [])
    for key, value in kwargs.items():
        _add(m, spec.args.get(key, "control"), value)
    return m


def measure_result(spec: RpcSpec, result: Any) -> Measured:
    m = Measured({}, [])
    if isinstance(spec.returns, dict):
        if not isinstance(result, dict):
            raise TypeError("a method declaring per-key return kinds must return a dict")
        for key, value in result.items():
            _add(m, spec.returns.get(key, "control"), value)
    else:
        _add(m, spec.returns, result)
    return m
