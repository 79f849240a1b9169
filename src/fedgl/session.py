"""What a user's request to run goes through first, the same for ``fedgl run`` and ``fedgl.run``.

``prepare`` guards the results folder (a finished run is replaced only when asked, a resume needs a
checkpoint, a run refused while it sets up leaves no empty folder of its own) and builds the ``Run``;
``unread_settings`` names the changed settings the run never reads (notes on the command line,
warnings in Python).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .config import RunConfig
from .config.candidates import search_space
from .config.identity import flat_config
from .data.splits import SPLIT_SIZES, parse_split
from .errors import ConfigError, DataError
from .protocols import protocol_class
from .results import FINISHED
from .runner import CHECKPOINT, Run, default_out_dir
from .search import Search, open_run

# Settings a scenario's partitioning never reads, and why, told to a user who set one.
UNREAD = {
    "central": (("partition.",), "{protocol} trains one party on the whole graph"),
    "node-level": (("partition.",), "in {protocol} every node is its own user"),
    "vertical": (("partition.alpha", "partition.edge_drop", "partition.cross_edge_drop", "partition.client_nodes",
                  "partition.drop_unit"),
                 "it shapes horizontal partitions, and {protocol} splits features"),
    "horizontal": (("partition.edge_keep", "partition.label_holder"),
                   "it shapes vertical partitions, and {protocol} splits nodes"),
}




def unread_settings(cfg: RunConfig) -> list[str]:
    """One note per setting given a value other than its default that this run never reads. Running
    another protocol from the same YAML is normal, so these are notes, not errors."""
    scenario = protocol_class(cfg.protocol_name).scenario
    prefixes, why = UNREAD.get(scenario, ((), ""))
    reasons = dict.fromkeys(prefixes, why.format(protocol=cfg.protocol_name))
    if scenario == "horizontal" and not cfg.partition.method.startswith("dirichlet"):
        reasons["partition.alpha"] = f"only the dirichlet methods read it, not {cfg.partition.method}"
    reasons |= _unread_backend(cfg) | _unread_split(cfg) | _unread_options(cfg)
    defaults = flat_config(RunConfig(protocol={"name": cfg.protocol_name}))
    return [f"{key} ({value}) is not read: {reason}" for key, value in flat_config(cfg).items()
            if value != defaults.get(key) for prefix, reason in reasons.items()
            if key == prefix or (prefix.endswith(".") and key.startswith(prefix))]


def _unread_backend(cfg: RunConfig) -> dict[str, str]:
    """Backend keys (exact) this run never reads, each with why."""
    b, reasons = cfg.backend, {}
    if b.name == "local":
        reasons |= dict.fromkeys(("backend.address", "backend.actors", "backend.connect_timeout_s", "backend.ray_auth"),
                                 "it is Ray's, and the backend is local")
        # (not where the run refuses the policy: one line, the error, says what is wrong)
        if (b.on_client_failure == "skip" and protocol_class(cfg.protocol_name).can_skip_parties
                or b.on_client_failure == "retry" and cfg.checkpoint_every):
            reasons["backend.on_client_failure"] = "a local party is never lost (only Ray and Flower lose parties)"
            reasons["backend.max_retries"] = "a local party is never lost, so never retried"
    if b.on_client_failure != "retry":
        reasons["backend.max_retries"] = f"only on_client_failure: retry reads it, not {b.on_client_failure}"
    return reasons


def _unread_split(cfg: RunConfig) -> dict[str, str]:
    """The split sizes in ``dataset.options`` that the split never reads (only ``random`` does)."""
    try:
        kind = parse_split(cfg.dataset.split).kind
    except DataError:  # the run refuses the split itself, in one line
        return {}
    if kind == "random":
        return {}
    return {f"dataset.options.{key}": f"only split random reads it, not {cfg.dataset.split}" for key in SPLIT_SIZES}


def _unread_options(cfg: RunConfig) -> dict[str, str]:
    """Protocol options another option of the protocol makes unread (``protocol.<key>``), each with why."""
    unread = getattr(cfg.options(), "unread", None)  # the options models that have such options define it
    return {f"protocol.{key}": why for key, why in (unread() if unread else {}).items()}


# How a user names the results folder and its options: on the command line, or in ``fedgl.run``.
CLI_NAMES = {"out": "--out", "overwrite": "--overwrite", "resume": "--resume"}
API_NAMES = {"out": "out_dir", "overwrite": "overwrite=True", "resume": "resume=True"}


def check_out_dir(out: Path, *, resume: bool, overwrite: bool, names: dict[str, str] = CLI_NAMES) -> None:
    """Refuse a results folder that would silently lose a finished run, or that cannot be one."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{names['out']} {out} is a file, not a folder")
    if resume and not out.exists():  # not made: there is nothing to continue
        raise ConfigError(f"cannot resume: {out} holds no checkpoint (it does not exist)")
    if (out / FINISHED).exists() and not (resume or overwrite):
        raise ConfigError(f"{names['out']} {out} holds a finished run; pass {names['overwrite']} to replace it or "
                          f"choose another folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".fedgl-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"{names['out']} {out} cannot be written: {err.strerror or err}") from None


def remove_if_empty(folder: Path) -> None:
    """Remove ``folder`` if it holds no file (only, perhaps, empty folders such as ``messages/``)."""
    if folder.is_dir() and not any(p.is_file() for p in folder.rglob("*")):
        shutil.rmtree(folder)


def prepare(cfg: RunConfig, out_dir: str | Path | None, *, resume: bool = False, overwrite: bool = False,
            names: dict[str, str] = CLI_NAMES) -> Run | Search:
    """The run a user asked for (the ``fedgl run`` command and ``fedgl.run``): a folder holding a
    finished run is replaced only when asked, and a resume needs a folder with a checkpoint."""
    made = not out_dir or not Path(out_dir).exists()
    if out_dir:
        check_out_dir(Path(out_dir), resume=resume, overwrite=overwrite, names=names)
    elif resume:
        raise ConfigError(f"{names['resume']} needs {names['out']}: the folder of the run to continue")
    # before the data loads and the parties start (a search's candidates keep their own checkpoints)
    if resume and not search_space(cfg) and not (Path(out_dir) / CHECKPOINT).exists():
        raise ConfigError(f"cannot resume: {out_dir} holds no checkpoint (set checkpoint_every to write them)")
    folder = Path(out_dir) if out_dir else default_out_dir(cfg, hint=f"pass {names['out']} or move it")
    try:
        job = open_run(cfg, folder)
    except BaseException:
        if made:  # a run refused while it sets up leaves no folder of its own behind, only files it wrote
            remove_if_empty(folder)
        raise
    if isinstance(job, Search):
        job.reuse = not overwrite  # a replaced search trains its candidates again
    if resume:
        try:
            job.resume()
        except BaseException:
            job.close()
            raise
    return job
