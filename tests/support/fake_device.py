"""A second device on a CPU-only machine, to test that parties keep their tensors on their device.

Tensors "on the accelerator" are CPU tensors wrapped to report ``meta`` as their device, and every
torch operation is checked as an accelerator would check it: its operands share one device (CPU
0-dimensional scalars, CPU indices into an accelerator tensor and ``copy_`` excepted), a draw made
there needs a generator made there, and ``.numpy()`` refuses. The arithmetic itself runs on the CPU, in the same
order, so a run on this device must equal the same run on the CPU to the bit. Sparse tensors cannot be
wrapped; they stay CPU tensors marked as being on the device.

``with fake_accelerator(monkeypatch):`` installs it and makes ``device: cuda`` mean it.

What it does not check: that a CPU 0-dimensional scalar is used only where CUDA takes one (elementwise
ops; CUDA refuses e.g. ``torch.stack`` of a CUDA and a CPU scalar), and the accelerator's own random
state (draws "there" come from the CPU's, which is why runs equal their CPU runs to the bit).
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils._python_dispatch import TorchDispatchMode

DEVICE = torch.device("meta")
_MARK = "_on_fake_accelerator"
aten = torch.ops.aten
# ops an accelerator tensor may index with CPU indices
_CPU_INDICES = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
_MOVES = {aten._to_copy.default}
_CROSS_DEVICE = {aten.copy_.default}  # copies between devices are allowed
_REAL_GENERATOR = torch.Generator


class Fake(torch.Tensor):
    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        out = torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            layout=elem.layout, device=DEVICE, requires_grad=elem.requires_grad)
        out.elem = elem
        return out

    def __repr__(self) -> str:
        return f"Fake({self.elem!r})"

    def tolist(self):
        return self.elem.tolist()

    def numpy(self, *args, **kwargs):
        raise TypeError("can't convert an accelerator tensor to numpy; use Tensor.cpu() first")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def on_device(t: object) -> bool:
    return isinstance(t, Fake) or (isinstance(t, torch.Tensor) and getattr(t, _MARK, False))


def _wrap(t):
    if not isinstance(t, torch.Tensor) or isinstance(t, Fake):
        return t
    if t.layout != torch.strided:
        setattr(t, _MARK, True)
        return t
    return Fake(t)


def _unwrap(t):
    return t.elem if isinstance(t, Fake) else t


def _plain(t):
    """A CPU copy without the device mark (a sparse tensor leaving the device)."""
    if isinstance(t, torch.Tensor) and getattr(t, _MARK, False):
        t = t.clone()
    return t


def _run(func, args, kwargs):
    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    device = kwargs.get("device")
    target = None if device is None else torch.device(device)
    if func in _MOVES and target is not None:
        out = func(*tree_map(_unwrap, args), **{**tree_map(_unwrap, kwargs), "device": torch.device("cpu")})
        return _wrap(out) if target == DEVICE else _plain(out)
    here = [t for t in tensors if on_device(t)]
    there = [t for t in tensors if not on_device(t) and t.dim() > 0]
    if func in _CPU_INDICES and on_device(args[0]):  # only the indices may stay on the CPU, not the values
        indices = {id(t) for t in args[1] if isinstance(t, torch.Tensor)}
        there = [t for t in there if id(t) not in indices]
    if here and there and func not in _CROSS_DEVICE:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{DEVICE} and cpu! ({func})")
    made_here = bool(here) or target == DEVICE
    generator = kwargs.get("generator")
    if generator is not None and made_here != _made_here(generator):
        raise RuntimeError(f"Expected a '{'meta' if made_here else 'cpu'}' device type for generator ({func})")
    if target == DEVICE:
        kwargs = {**kwargs, "device": torch.device("cpu")}
    out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
    return tree_map(_wrap, out) if made_here else out


class _Checked(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


class _Factories(TorchFunctionMode):
    """``torch.tensor(data, device=...)`` and ``torch.as_tensor`` never reach the dispatcher with their
    device: they are made on the CPU and moved."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if func in (torch.tensor, torch.as_tensor) and device is not None and torch.device(device) == DEVICE:
            return func(*args, **{**kwargs, "device": "cpu"}).to(DEVICE)
        return func(*args, **kwargs)


_ON_DEVICE: weakref.WeakSet = weakref.WeakSet()


def _made_here(generator) -> bool:
    """Whether a generator stands for one on the accelerator. The dispatcher hands over a new Python
    object for the same generator, so it is found by its state: two generators in the same state (one
    on each device, seeded alike) cannot be told apart, so a draw with either may be refused."""
    state = generator.get_state()
    return any(torch.equal(g.get_state(), state) for g in _ON_DEVICE)


class _Generator(_REAL_GENERATOR):
    """``torch.Generator(device=the accelerator)``: a CPU generator that stands for one there."""

    def __new__(cls, device="cpu"):
        return super().__new__(cls)  # a CPU generator underneath

    def __init__(self, device="cpu"):
        super().__init__()
        if torch.device(device) == DEVICE:
            _ON_DEVICE.add(self)

    @property
    def device(self) -> torch.device:
        return DEVICE if self in _ON_DEVICE else torch.device("cpu")

    def __reduce__(self):  # a held party state comes back with its generators where they were
        _, _, state = super().__reduce__()
        return _Generator, (self.device,), state


@contextmanager
def fake_accelerator(monkeypatch):
    """Run the block with ``device: cuda`` meaning the checked device."""
    import fedgl.device

    real_resolve = fedgl.device.resolve
    monkeypatch.setattr(fedgl.device, "resolve", lambda name: DEVICE if name.startswith("cuda") else real_resolve(name))
    monkeypatch.setattr(torch, "Generator", _Generator)
    import torch.optim.optimizer as optimizer  # the fused Adam kernel runs on accelerators too

    fused = optimizer._get_fused_kernels_supported_devices
    monkeypatch.setattr(optimizer, "_get_fused_kernels_supported_devices", lambda: [*fused(), DEVICE.type])
    with _Factories(), _Checked():
        yield DEVICE
