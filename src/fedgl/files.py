"""Writing files so that a crash at any moment leaves the old file or the new one, never a torn one;
reading fedgl's own files so that loading one never runs code."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any, BinaryIO, Callable

import torch

from .errors import ConfigError


def write_atomically(path: Path, save: Callable[[BinaryIO], None]) -> None:
    """``save(file)`` into a temporary file beside ``path``, flushed to disk, then renamed over it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        save(fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_tensors(path: str | Path, what: str, data: bytes | None = None) -> Any:
    """The tensors and plain data of the file ``path`` (or of ``data``, its bytes already read), read
    with ``weights_only=True`` onto the CPU, so that loading never runs code. A file holding anything
    else, a missing or damaged one, is refused with one line naming ``what`` and ``path``."""
    try:
        return torch.load(io.BytesIO(data) if data is not None else path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except Exception as err:
        if isinstance(err, pickle.UnpicklingError) and "GLOBAL" in str(err):  # a class or function by name
            raise ConfigError(f"{what} {path} holds objects other than tensors and plain data; "
                              f"refusing to load it") from None
        raise ConfigError(f"{what} {path} is not readable ({type(err).__name__})") from None  # torn, foreign
