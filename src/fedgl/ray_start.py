"""Starting a local Ray instance, locked down: listening on loopback only, with Ray's token
authentication on unless the config opts out (``fedgl.comm.ray_cluster`` says why, and checks it).

Starting one takes seconds (Ray's own processes start and register), so ``fedgl run --backend ray``
begins it in the background (``start_in_background``) before it loads its config, while it imports torch
and loads and partitions its data. This module imports no torch for that reason, and of fedgl only
``errors`` (Ray only inside its functions: the background thread imports it).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import signal
import sys
import threading
from typing import Any

from .errors import ConfigError

# Ray workers hash strings with a fixed seed, so anything ordered by hashing is the same from run to run.
WORKER_ENV = {"PYTHONHASHSEED": "0"}
# Ray's switch (its name is Ray's) for an instance confined to this machine: every address it binds and
# advertises is loopback. Read by Ray when it is imported, so the processes it starts see it too.
LOOPBACK_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
AUTH_MODE = "RAY_AUTH_MODE"
OPT_OUT = "backend.ray_auth: none runs without it, open to anyone who reaches its ports"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def start_local(ray: Any, auth: str) -> None:
    """A new Ray instance on loopback only (never a cluster found running on this machine), with
    Ray's token authentication unless the config opts out. Its processes inherit ``WORKER_ENV`` and
    the loopback switch from this one while it starts (a ``runtime_env`` would do the same through
    Ray's runtime-env agent, about 0.8 s more per actor)."""
    mode = os.environ.get(AUTH_MODE)
    if auth == "token" and mode is not None and mode.lower() != "token":
        raise ConfigError(f"{AUTH_MODE}={mode} turns Ray's token authentication off; unset it or set it to "
                          f"token ({OPT_OUT})")
    from ray._private import ray_constants
    from ray._raylet import Config

    if auth == "token" and mode is None:  # kept for the process, as Ray keeps it when it turns it on itself
        os.environ[AUTH_MODE] = "token"
        Config.initialize("")  # Ray reads the mode once per process: read again, as Ray does then
    saved = {key: os.environ.get(key) for key in [*WORKER_ENV, LOOPBACK_SWITCH]}
    os.environ.update(WORKER_ENV | {LOOPBACK_SWITCH: "0"})
    saved_switch, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False  # read at import
    try:
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, dashboard_host="127.0.0.1",
                 log_to_driver=False, object_store_memory=256 * 1024**2)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_switch
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    node = ray.util.get_node_ip_address()
    if node not in LOOPBACK:
        ray.shutdown()
        raise ConfigError(f"Ray placed its local instance on {node}, not on loopback; refusing to run there")


_BACKGROUND: list[tuple[threading.Event, str, list[BaseException]]] = []  # the start under way, if any


def start_in_background(auth: str = "token", ray: Any = None) -> None:
    """Begin starting the local instance ``start_local`` starts, and return at once: the caller goes on
    (a run imports, loads and partitions its data) while Ray's processes start, and
    ``fedgl.comm.ray_cluster.init_ray`` waits for them (``join_background``). Nothing happens when Ray
    is missing (the backend then says so), already joined, or already starting."""
    if ray is None:  # imported in the thread: importing Ray takes a while too
        if importlib.util.find_spec("ray") is None:
            return
        ray = sys.modules.get("ray")
    if (ray is not None and ray.is_initialized()) or _BACKGROUND:
        return
    failed: list[BaseException] = []
    done = threading.Event()

    def start() -> None:
        try:
            start_local(ray or importlib.import_module("ray"), auth)
        except BaseException as err:  # raised by init_ray, in the caller's thread
            failed.append(err)
            return
        finally:
            done.set()
        # Linux stops a process's children when the thread that started them ends (Ray ties its
        # processes to the driver with PR_SET_PDEATHSIG): this thread waits until the process exits
        threading.Event().wait()

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))  # as ray.init sets from this thread
    logging.getLogger("ray._private.worker").addFilter(_NotMainThread())
    thread = threading.Thread(target=start, name="fedgl-ray-start", daemon=True)
    _BACKGROUND.append((done, auth, failed))
    thread.start()


class _NotMainThread(logging.Filter):
    """Drops Ray's warning that a start outside the main thread sets no SIGTERM handler (set here)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


def join_background(ray: Any, auth: str | None) -> bool:
    """Wait for the start ``start_in_background`` began, if any: whether it gave this process the
    instance wanted (a local one for ``auth``; None: a cluster is named, so it is stopped again)."""
    if not _BACKGROUND:
        return False
    done, started_for, failed = _BACKGROUND.pop()
    done.wait()
    if started_for != auth:  # started on a guess the config overruled: its outcome is not this run's
        if not failed:
            ray.shutdown()
        return False
    if failed:
        raise failed[0]
    return True
