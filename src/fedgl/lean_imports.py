"""Importing torch_geometric without the modules it loads but a run never uses.

``import torch_geometric`` runs its whole package, and its ``isinstance.py`` imports ``torch._dynamo``
(about 1 s and 70 MiB) only to recognise ``torch.compile``d modules when asked. While torch_geometric
is being imported, ``install`` puts a stand-in for it in ``sys.modules``; the stand-in loads the real
module the first time anything reads from it (an attribute, a submodule), and is removed as soon as
the import finishes, so code that asks for it later gets the real one. Nothing changes for a program
that uses it; one that does not never pays for it.

``torch_geometric.datasets`` runs about 150 dataset modules, and through them pandas (about 0.3 s),
when a run reads one dataset. It is replaced by a package that stays: its submodules import on their
own (``torch_geometric.datasets.planetoid``, what fedgl's dataset registry names), and reading
anything else from it (``torch_geometric.datasets.Planetoid``) loads the whole package as usual.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

DEFERRED = ("torch._dynamo",)
LAZY_PACKAGES = ("torch_geometric.datasets",)


class _StandIn(types.ModuleType):
    """Loads the module it stands for on first use and hands over to it."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__spec__ = importlib.machinery.ModuleSpec(name, None)  # what ``importlib.util.find_spec`` reads

    def __getattr__(self, attribute: str):
        # Tools walking ``sys.modules`` (``inspect.getmodule``) probe dunders such as ``__file__``: they
        # find none rather than load the module. ``__path__`` is read to import a submodule: that loads.
        if attribute.startswith("__") and attribute != "__path__":
            raise AttributeError(attribute)
        return getattr(_real(self), attribute)


class _LazyPackage(_StandIn):
    """A package whose submodules import without running its ``__init__``; listing its names
    (``__all__``, as ``import *`` does, or ``dir``) loads it whole."""

    def __init__(self, spec: importlib.machinery.ModuleSpec) -> None:
        super().__init__(spec.name)
        self.__path__ = list(spec.submodule_search_locations)

    def __getattr__(self, attribute: str):
        if attribute == "__all__":
            return _real(self).__all__
        return super().__getattr__(attribute)

    def __dir__(self) -> list[str]:
        return dir(_real(self))


def _real(stand_in: _StandIn) -> types.ModuleType:
    name = stand_in.__name__
    if sys.modules.get(name) is stand_in:
        del sys.modules[name]
    return importlib.import_module(name)


class _Loader(importlib.abc.Loader):
    """torch_geometric's own loader, run with the stand-ins in place."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__spec__.loader = module.__loader__ = self.loader
        stand_ins = {name: _StandIn(name) for name in DEFERRED if name not in sys.modules}
        for name in LAZY_PACKAGES:
            spec = importlib.machinery.PathFinder.find_spec(name, module.__spec__.submodule_search_locations)
            if spec is not None and spec.submodule_search_locations and name not in sys.modules:
                sys.modules[name] = package = _LazyPackage(spec)
                setattr(module, name.rpartition(".")[2], package)
        sys.modules.update(stand_ins)
        try:
            self.loader.exec_module(module)
        finally:
            for name, stand_in in stand_ins.items():
                if sys.modules.get(name) is stand_in:
                    del sys.modules[name]


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch_geometric":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Route the first ``import torch_geometric`` through the stand-ins (idempotent)."""
    if "torch_geometric" not in sys.modules and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
