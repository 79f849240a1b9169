"""Starting or joining Ray for a run, locked down.

Anyone who can reach a Ray instance's ports and speak its protocol can run code in it, and so read
every party it hosts. Hence a local instance listens on loopback only (its node address, and with it
the GCS, raylet, object manager, worker, agent and metrics listeners; the dashboard is off), and the
Ray a run starts, joins (``backend.address``) or finds already started must enforce Ray's token
authentication (``RAY_AUTH_MODE=token``, Ray 2.52 or later): a call to its GCS without the token
must be refused. A run refuses a Ray that answers it, unless the config opts out
(``backend.ray_auth: none``). The token is only as secret as its file: Ray writes it readable by
every local user, so a run narrows the file to its owner (``protect_token_file``).

A local instance is started by ``fedgl.ray_start`` (loopback only, token mode on), possibly in the
background while the run loads its data; a process keeps the instance it started for its later runs
(a bench's seeds) until it exits.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from .. import ray_start
from ..errors import ConfigError
from ..ray_start import OPT_OUT, WORKER_ENV

HOW_TO_AUTH = ("start every node with RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN or a token "
               "file; `ray get-auth-token --generate`), and run the driver with both too")


def check_reachable(address: str, timeout_s: float) -> None:
    """Fail in ``timeout_s`` with one line when nothing listens at a ``host:port`` Ray address (Ray
    itself would wait forever). ``auto`` and addresses without a port are left to Ray."""
    target = address.split("://", 1)[-1]
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ConfigError(f"cannot reach Ray at {address}: {err.strerror or err} "
                          f"(waited up to {timeout_s:g} s; backend.connect_timeout_s)") from None


def check_gcs(address: str, timeout_s: float) -> None:
    """Fail in ``timeout_s`` with one line when what listens at a ``host:port`` address is not a Ray GCS
    (a dashboard, a web server, a black hole): ``ray.init`` would retry it far longer than
    ``connect_timeout_s``. A GCS answers a cluster-id call, or refuses it for want of the token; anything
    else is not one. ``auto``, ``ray://`` and addresses without a port are left to Ray."""
    host, sep, port = address.rpartition(":")
    if "://" in address or not sep or not port.isdigit() or os.environ.get("RAY_USE_TLS", "0") not in ("", "0"):
        return  # (a TLS cluster answers no plain channel: Ray's own connection says what is wrong)
    refused = _cluster_id_refusal(f"{host or '127.0.0.1'}:{port}", timeout_s)
    if refused not in (None, "UNAUTHENTICATED"):
        raise ConfigError(f"cannot reach Ray at {address}: no Ray GCS answered within {timeout_s:g} s "
                          f"({refused}; is this the GCS port, usually 6379?)")


def _cluster_id_refusal(gcs_address: str, timeout_s: float) -> str | None:
    """One cluster-id call without a token to the GCS at ``gcs_address``: None if it answered, else the
    gRPC status it failed with (``UNAUTHENTICATED``: a Ray that wants its token)."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with grpc.insecure_channel(gcs_address) as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s)
        except grpc.RpcError as err:
            return err.code().name
    return None


def init_ray(ray: Any, address: str | None, timeout_s: float, auth: str = "token") -> bool:
    """Join ``address``, or start a local instance, unless this process already joined a Ray; then
    check that Ray enforces token authentication (``auth: token``). Returns whether this process
    started the connection here or in the background (``ray_start.start_in_background``)."""
    if address:  # named, it must answer, even when this process already joined a Ray
        check_reachable(address, timeout_s)
        check_gcs(address, timeout_s)
    try:
        owns = ray_start.join_background(ray, None if address else auth)
        if not owns and not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False, runtime_env={"env_vars": WORKER_ENV})
            else:
                ray_start.start_local(ray, auth)
            owns = True
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"cannot start or reach Ray at {address or 'a local instance'}: {exc}") from exc
    try:
        if auth == "token" and not enforces_token(ray.get_runtime_context().gcs_address, timeout_s):
            where = f"the Ray cluster at {address}" if address else "the Ray instance this process uses"
            raise ConfigError(f"{where} does not enforce token authentication: {HOW_TO_AUTH}; {OPT_OUT}")
    except BaseException:
        if owns:
            ray.shutdown()
        raise
    if auth == "token":
        protect_token_file()
    return owns


def protect_token_file(path: str | None = None) -> None:
    """Make the Ray token file (``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``) readable by its
    owner only: with the token any local user could connect to the instance and read its parties."""
    path = path or os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    try:
        if os.stat(path).st_mode & 0o077:
            os.chmod(path, 0o600)
    except FileNotFoundError:  # the token came from RAY_AUTH_TOKEN
        pass


def enforces_token(gcs_address: str, timeout_s: float) -> bool:
    """Whether the Ray whose GCS is at ``gcs_address`` refuses a call made without its token."""
    refused = _cluster_id_refusal(gcs_address, timeout_s)
    if refused not in (None, "UNAUTHENTICATED"):
        raise ConfigError(f"cannot check Ray's authentication at {gcs_address}: {refused} ({OPT_OUT})")
    return refused == "UNAUTHENTICATED"
