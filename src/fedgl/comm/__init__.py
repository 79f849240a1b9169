"""Parties, the measured transport, the ledger and the simulated clock."""

from .ledger import Ledger
from .network import NetworkModel, SimClock
from .party import Party
from .rpc import Rows, rpc
from .transport import LocalTransport, Transport

__all__ = ["Ledger", "LocalTransport", "NetworkModel", "Party", "Rows", "SimClock", "Transport", "make_transport", "rpc"]


def make_transport(backend: str = "local", network: NetworkModel | None = None, device: str = "cpu",
                   **options) -> Transport:
    """Build the transport for ``backend`` ('local', 'ray' or 'flower'), its parties computing on ``device``."""
    if backend == "local":
        return LocalTransport(network, device)
    if backend == "ray":
        from .ray_transport import RayTransport

        return RayTransport(network, device, **options)
    if backend == "flower":
        from .flower_transport import FlowerTransport

        return FlowerTransport(network, device, **options)
    from ..errors import ConfigError

    raise ConfigError(f"unknown backend {backend!r}; allowed: local, ray, flower")
