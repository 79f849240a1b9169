"""Writing files so that a crash at any moment leaves the old file or the new one, never a torn one;
reading fedgl's own files so that loading one never runs code."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any, BinaryIO, Callable

from .errors import ConfigError


def write_atomically(path: Path, save: Callable[[BinaryIO], None], private: bool = False) -> None:
    """``save(file)`` into a temporary file beside ``path``, flushed to disk, then renamed over it.
    ``private``: readable and writable by the owner only (0600) from the moment it exists, for what
    holds a party's data or state (shards, checkpoints): other users of the machine read none of it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    if path.is_dir():  # checked first: the rename would fail only after the temporary file is written
        raise ConfigError(f"{path} is a folder, not a file")
    try:
        tmp.unlink(missing_ok=True)  # a leftover of a crash keeps its mode: made afresh with ours
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o666)
    except OSError as err:  # no such folder, a file where the folder should be, no permission
        raise ConfigError(f"{path} cannot be written: {_missing_folder(path) or err.strerror or err}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            save(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # no stray temporary file beside it
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _missing_folder(path: Path) -> str:
    """Why ``path``'s folder cannot hold it, if that is why: it does not exist, or a file is in the way."""
    blocker = file_in_the_way(path.parent)
    if blocker is not None:
        return f"{blocker} is a file, not a folder"
    return "" if path.parent.is_dir() else f"folder {path.parent} does not exist"


def file_in_the_way(folder: Path) -> Path | None:
    """The file that keeps ``folder`` from being a folder: ``folder`` itself or the nearest of its parents
    that exists, when that one is not a folder; None when ``folder`` is or can be made one."""
    for path in (folder, *folder.parents):
        if path.is_dir():
            return None
        if path.exists() or path.is_symlink():
            return path
    return None


def check_folder(folder: str | Path, name: str = "", hint: str = "") -> Path:
    """Refuse, in one line, a folder to be that a file stands in the way of (checked before anything is
    planned or made, so ``--plan`` refuses it too). ``name``: the option that gave it, e.g. ``--out``."""
    folder = Path(folder)
    label, hint = f"{name} {folder}".strip(), f"; {hint}" if hint else ""
    blocker = file_in_the_way(folder)
    if blocker == folder:
        raise ConfigError(f"{label} is a file, not a folder{hint}")
    if blocker is not None:
        raise ConfigError(f"{label} cannot be a folder: {blocker} is a file{hint}")
    return folder


def make_folder(folder: str | Path, name: str = "", hint: str = "", mode: int = 0o777) -> Path:
    """``folder`` made with its parents, or one line saying why it cannot be (a file in the way, no
    permission, a full disk) instead of an ``OSError`` traceback."""
    folder = check_folder(folder, name, hint)
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=mode)
    except OSError as err:
        raise ConfigError(f"{f'{name} {folder}'.strip()} cannot be made: {err.strerror or err}") from None
    return folder


def load_tensors(path: str | Path, what: str, data: bytes | None = None) -> Any:
    """The tensors and plain data of the file ``path`` (or of ``data``, its bytes already read), read
    with ``weights_only=True`` onto the CPU, so that loading never runs code. A file holding anything
    else, a missing or damaged one, is refused with one line naming ``what`` and ``path``."""
    import torch  # here: the command line's folder checks import this module before torch is needed

    try:
        return torch.load(io.BytesIO(data) if data is not None else path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except Exception as err:
        if isinstance(err, pickle.UnpicklingError) and "GLOBAL" in str(err):  # a class or function by name
            raise ConfigError(f"{what} {path} holds objects other than tensors and plain data; "
                              f"refusing to load it") from None
        raise ConfigError(f"{what} {path} is not readable ({type(err).__name__})") from None  # torn, foreign
