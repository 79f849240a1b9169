"""Writing files so that a crash at any moment leaves the old file or the new one, never a torn one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Callable


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
