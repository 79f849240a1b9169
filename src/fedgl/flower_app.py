"""fedgl's Flower apps: the ServerApp running the fedgl server and the ClientApp of every party.

The app bundle ``flwr run`` submits (``comm.flower_setup.bundle``) names ``fedgl.flower_app:server_app`` and
``fedgl.flower_app:client_app``. The ServerApp reads its run config (``flwr run --run-config``):
``config`` (the fedgl YAML, whose ``backend.shards`` is the shard folder on the server's machine),
``out`` (the results folder), ``resume``, ``overwrite``, ``reply-timeout`` (seconds a party may take
to answer before it counts as lost; 0 waits for Flower to report its node unavailable) and
``connect-timeout`` (seconds to wait for a party's SuperNode to join, at the start and after a loss).
The run is the one ``fedgl run`` makes, with ``backend.name: flower``.
"""

from __future__ import annotations

from typing import Any

from flwr.serverapp import ServerApp

from .flower_relay import client_app as _relay_app

server_app = ServerApp()
client_app = _relay_app()  # imports neither torch nor a party: Flower starts it for every message


@server_app.main()
def main(grid: Any, context: Any) -> None:
    from .api import run
    from .comm.flower_transport import serving

    config = context.run_config
    timeout = float(config.get("reply-timeout", 0)) or None
    with serving(grid, timeout, float(config.get("connect-timeout", 300.0))):
        run(str(config["config"]), out_dir=str(config["out"]), resume=bool(config.get("resume", False)),
            overwrite=bool(config.get("overwrite", False)), backend__name="flower")


def simulate(config: Any, out_dir: str, **overrides: Any) -> Any:
    """The same ServerApp and ClientApp in Flower's Simulation Engine, one SuperNode per party of
    ``backend.shards``, on this machine, each with its party host as on a real SuperNode (so every
    protocol keeps its party state between messages); returns the run's ``RunResult``."""
    import json
    import tempfile
    from pathlib import Path

    from flwr.simulation import run_simulation

    from .api import load_config, run
    from .comm.flower_setup import party_hosts
    from .comm.flower_transport import serving

    cfg = load_config(config, backend__name="flower", **overrides)
    shards = Path(cfg.backend.shards or "").resolve()
    parties = json.loads((shards / "manifest.json").read_text())["parties"]
    results: list[Any] = []
    app = ServerApp()

    @app.main()
    def _main(grid: Any, context: Any) -> None:
        with serving(grid, connect_timeout_s=600.0):  # the engine starts Ray first
            results.append(run(cfg, out_dir=out_dir, overwrite=True))

    with tempfile.TemporaryDirectory(prefix="fedgl-sim-") as state, party_hosts(shards, parties, Path(state)) as hosts:
        # address "local": the engine starts its own Ray, never joining another cluster on this machine
        run_simulation(app, _relay_app(hosts), num_supernodes=len(parties),
                       backend_config={"client_resources": {"num_cpus": 1},
                                       "init_args": {"address": "local", "num_cpus": 2}})
    if not results:
        raise RuntimeError("the simulated run did not finish (see Flower's log above)")
    return results[0]
