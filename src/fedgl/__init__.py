"""fedgl: federated graph learning with isolated parties and measured communication."""

__version__ = "0.1.0"

import warnings as _warnings

# fedgl relies on torch's CSR tensors on purpose (sparse features and adjacencies); the beta notice
# would otherwise greet every user on every run.
_warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")

# The protocol registry (names only; each protocol module loads on first use) validates configs.
from fedgl import protocols as _protocols  # noqa: E402,F401
from fedgl.api import load_config, run  # noqa: E402

__all__ = ["__version__", "load_config", "run"]
