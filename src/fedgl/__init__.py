"""fedgl: federated graph learning with isolated parties and measured communication."""

__version__ = "0.1.0"

import warnings as _warnings

# fedgl relies on torch's CSR tensors on purpose (sparse features and adjacencies); the beta notice
# would otherwise greet every user on every run.
_warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")

# torch_geometric is imported without torch._dynamo, and of its datasets only the module a run reads
# (lean_imports.py).
from fedgl import lean_imports as _lean_imports  # noqa: E402

_lean_imports.install()

# The protocols by name (each protocol module loads on first use).
from fedgl import protocols  # noqa: E402
from fedgl.api import UnreadSetting, load_config, run  # noqa: E402

# Loaded on first access: they import torch_geometric, which takes seconds.
_LAZY = {"datasets": "fedgl.data", "partition": "fedgl.partition"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return importlib.import_module(_LAZY[name])
    raise AttributeError(f"module 'fedgl' has no attribute {name!r}")


__all__ = ["UnreadSetting", "__version__", "datasets", "load_config", "partition", "protocols", "run"]
