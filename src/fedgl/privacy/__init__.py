"""Privacy mechanisms for what crosses the party boundary.

``config`` holds the ``privacy`` section of a run; ``masks`` the cipher-expanded masks,
``secure_aggregation`` the fixed-point encoding and one-way masks, ``bonawitz``, ``shamir`` and
``identity`` the dropout-tolerant secure sum with a threshold; ``noise`` and ``dp`` the OS-keyed
Gaussian mechanism and its accountant; ``record``, ``attacks``, ``label_attack`` and
``noise_replay`` what `fedgl audit` reads and tries. Protocols import the mechanism modules they
use; importing this package loads only the config.
"""

from .config import DPConfig, PrivacyConfig

__all__ = ["DPConfig", "PrivacyConfig"]
