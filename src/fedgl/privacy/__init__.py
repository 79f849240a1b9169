"""Privacy mechanisms for what crosses the party boundary.

``config`` holds the ``privacy`` section of a run, ``secure_aggregation`` the pairwise-masked sums
(Bonawitz et al.), ``dp`` the Gaussian mechanism on client updates and its accountant. Protocols
import the mechanism modules they use; importing this package loads only the config.
"""

from .config import DPConfig, PrivacyConfig

__all__ = ["DPConfig", "PrivacyConfig"]
