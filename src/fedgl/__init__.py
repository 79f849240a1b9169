"""fedgl: federated graph learning with isolated parties and measured communication."""

__version__ = "0.1.0"

import warnings as _warnings

# fedgl relies on torch's CSR tensors on purpose (sparse features and adjacencies); the beta notice
# would otherwise greet every user on every run.
_warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
