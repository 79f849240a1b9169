"""User-facing errors.

Anything a user can cause (a bad config, a missing dataset, an impossible partition) raises a
``FedglError``; the CLI prints its one-line message and exits with code 2 instead of a traceback.
"""


class FedglError(Exception):
    """An error caused by the user's input, reported as one line."""


class ConfigError(FedglError):
    """A configuration value is missing, unknown or out of range."""


class DataError(FedglError):
    """A dataset is unknown or its files cannot be found or read."""


class PartitionError(FedglError):
    """A partition cannot be built with the requested settings."""
