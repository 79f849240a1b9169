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


class PartyFailure(Exception):
    """Parties were lost during a run (their process or node died); the runner applies the
    ``backend.on_client_failure`` policy."""

    def __init__(self, parties: list[str]):
        super().__init__(f"lost part{'ies' if len(parties) > 1 else 'y'} {', '.join(parties)}")
        self.parties = parties


class RunFailed(Exception):
    """A run stopped by a failure during it (not by bad input): one line, exit code 1."""


def gpu_out_of_memory(err: BaseException | None) -> bool:
    """Whether ``err`` is (or, raised in a Ray host, wraps) ``torch.OutOfMemoryError``, found by name so
    this module imports no torch."""
    return any(c.__name__ == "OutOfMemoryError" and c.__module__.startswith("torch") for c in type(err).__mro__)


def out_of_memory(err: BaseException | None) -> bool:
    """Whether ``err`` is a failed allocation: Python's, torch's CPU allocator's (a RuntimeError) or a
    GPU's."""
    return (isinstance(err, MemoryError) or gpu_out_of_memory(err)
            or (isinstance(err, RuntimeError) and "can't allocate memory" in str(err)))
