"""fedgl payloads as Flower records, without pickle.

A payload (nested dicts (ordered ones too), lists and tuples of tensors, numpy arrays, numbers, strings, bytes and None)
becomes a ``RecordDict`` of two records: an ``ArrayRecord`` holding every tensor's raw bytes (its dtype
and shape in the ``Array``) and a ``ConfigRecord`` holding the structure as JSON, whose leaves name
those arrays. JSON keeps ``None``, bools, ints, floats (exactly, NaN and infinities included) and
strings apart, so the payload arrives with the same types and the same bits. A broadcast view travels
once and arrives as the same view; sparse COO and CSR tensors travel as their index and value arrays.
Decoding reads only this schema: anything else in a message is refused with one line.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError
from .payload import broadcast_base

ARRAYS, META, TREE = "fedgl.arrays", "fedgl.meta", "tree"
STYPE = "fedgl.raw"  # an Array holding a tensor's bytes in C order, read back with its dtype and shape
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128,
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool)}


def _flwr() -> Any:
    try:
        import flwr.app as app
    except ImportError:
        raise ConfigError("backend 'flower' needs the flwr package: pip install 'fedgl[flower]'") from None
    return app


class _Encoder:
    def __init__(self) -> None:
        self.arrays: dict[str, Any] = {}

    def array(self, tensor: torch.Tensor) -> str:
        """Key of the tensor's (dtype, shape, C-order bytes)."""
        tensor = tensor.detach().cpu().contiguous()
        key = str(len(self.arrays))
        data = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        self.arrays[key] = (str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), data)
        return key

    def tensor(self, t: torch.Tensor) -> dict[str, Any]:
        if t.layout == torch.sparse_coo:
            return {"T": "coo", "i": self.array(t._indices()), "v": self.array(t._values()),
                    "shape": list(t.shape), "c": t.is_coalesced()}
        if t.layout == torch.sparse_csr:
            return {"T": "csr", "r": self.array(t.crow_indices()), "c": self.array(t.col_indices()),
                    "v": self.array(t.values()), "shape": list(t.shape)}
        base = broadcast_base(t)
        if base is t:
            return {"T": "dense", "a": self.array(t)}
        return {"T": "bcast", "a": self.array(base), "shape": list(t.shape)}

    def tree(self, value: Any) -> Any:
        if value is None or type(value) in (bool, int, float, str):
            return value
        if isinstance(value, torch.Tensor):
            return self.tensor(value)
        if isinstance(value, np.ndarray):
            return {"T": "numpy", "a": self.array(torch.from_numpy(np.ascontiguousarray(value)))}
        if isinstance(value, np.generic):
            return {"T": "npscalar", "a": self.array(torch.from_numpy(np.asarray(value).reshape(1)))}
        if isinstance(value, bytes):
            return {"T": "bytes", "a": self.array(torch.frombuffer(bytearray(value), dtype=torch.uint8))
                    if value else None}
        if type(value) in (dict, OrderedDict):
            return {"T": "dict" if type(value) is dict else "odict",
                    "items": [[self.tree(k), self.tree(v)] for k, v in value.items()]}
        if type(value) in (list, tuple):
            return {"T": type(value).__name__, "items": [self.tree(v) for v in value]}
        raise TypeError(f"cannot send a {type(value).__name__} through Flower")


def encode(payload: Any, **meta: Any) -> Any:
    """``payload`` as a ``RecordDict``; ``meta`` (strings and numbers) rides in its config record."""
    app = _flwr()
    encoder = _Encoder()
    tree = json.dumps(encoder.tree(payload))
    arrays = {key: app.Array(dtype=dtype, shape=shape, stype=STYPE, data=data)
              for key, (dtype, shape, data) in encoder.arrays.items()}
    return app.RecordDict({ARRAYS: app.ArrayRecord(arrays), META: app.ConfigRecord({TREE: tree, **meta})})


class _Decoder:
    def __init__(self, arrays: Any) -> None:
        self.arrays = arrays

    def array(self, key: Any) -> torch.Tensor:
        dtype, shape, data = self.arrays[key] if isinstance(key, str) and key in self.arrays else (None, (), b"")
        if dtype not in _DTYPES:
            raise ValueError(f"array {key!r} is missing or not a fedgl tensor")
        if not data:
            return torch.empty(shape, dtype=_DTYPES[dtype])
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(_DTYPES[dtype]).reshape(shape)

    def tree(self, node: Any) -> Any:
        if node is None or type(node) in (bool, int, float, str):
            return node
        if type(node) is not dict or "T" not in node:
            raise ValueError("a node of the payload tree is not fedgl's")
        kind = node["T"]
        if kind == "dense":
            return self.array(node["a"])
        if kind == "bcast":
            return self.array(node["a"]).expand(node["shape"])
        if kind == "coo":
            t = torch.sparse_coo_tensor(self.array(node["i"]), self.array(node["v"]), node["shape"],
                                        check_invariants=True)  # bytes from the wire are checked before use
            return t._coalesced_(True) if node["c"] else t
        if kind == "csr":
            return torch.sparse_csr_tensor(self.array(node["r"]), self.array(node["c"]), self.array(node["v"]),
                                           node["shape"], check_invariants=True)
        if kind == "numpy":
            return self.array(node["a"]).numpy()
        if kind == "npscalar":
            return self.array(node["a"]).numpy()[0]
        if kind == "bytes":
            return b"" if node["a"] is None else self.array(node["a"]).numpy().tobytes()
        if kind in ("dict", "odict"):
            items = [(self.tree(k), self.tree(v)) for k, v in node["items"]]
            return dict(items) if kind == "dict" else OrderedDict(items)
        if kind in ("list", "tuple"):
            items = [self.tree(v) for v in node["items"]]
            return items if kind == "list" else tuple(items)
        raise ValueError(f"unknown payload node {kind!r}")


def decode(content: Any) -> tuple[Any, dict[str, Any]]:
    """The payload and the meta entries of a ``RecordDict`` made by ``encode``; anything else is refused."""
    app = _flwr()
    try:
        arrays, meta = content[ARRAYS], content[META]
        if not isinstance(arrays, app.ArrayRecord) or not isinstance(meta, app.ConfigRecord):
            raise ValueError("its records are not an ArrayRecord and a ConfigRecord")
        if set(content.keys()) != {ARRAYS, META}:
            raise ValueError("it holds records other than fedgl's")
        rest = {k: v for k, v in meta.items() if k != TREE}
        raw = {key: (a.dtype if a.stype == STYPE else None, tuple(a.shape), a.data) for key, a in arrays.items()}
        return _Decoder(raw).tree(json.loads(meta[TREE])), rest
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise ConfigError(f"a Flower message is not a fedgl payload ({str(err).splitlines()[0]})") from None
