"""What the Ray and Flower backends cost against the in-process run, on one task.

    FEDGL_DATA_ROOT=/path/to/datasets python benchmarks/flower_overhead.py

FedAvg with 3 clients (one party each) on a 150-node synthetic graph, 3 rounds: milliseconds per round
in process, on a local Ray instance, and on a Flower federation on loopback (a SuperLink with TLS and
SuperNode authentication and one SuperNode per client, ``tests/support/flower_federation.py``); and,
for every message of the run, fedgl's payload bytes (what the ledger records) beside the bytes of the
Flower objects carrying it (the message, its records and array chunks as Flower serialises them,
before HTTP and TLS framing). Writes ``benchmarks/results/flower-overhead/table.md`` and ``table.json``.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))

from fedgl.comm.flower_codec import encode  # noqa: E402
from fedgl.comm.payload import nbytes  # noqa: E402
from fedgl.config import build_config  # noqa: E402
from fedgl.deployment import write_shards  # noqa: E402
from fedgl.search import run  # noqa: E402

TASK = "flower-overhead"
SETTINGS = {"dataset": {"options": {"num_nodes": 150}}, "partition": {"num_clients": 3}, "train": {"rounds": 3},
            "network": {"compute": "ignore"}, "protocol": {"name": "fedavg", "group_size": 1}}


def flower_bytes(payload) -> int:
    """Bytes of the Flower objects one message is sent as: the message and every object under it."""
    from flwr.app import Metadata
    from flwr.app.message import make_message

    metadata = Metadata(run_id=1, message_id="", src_node_id=1, dst_node_id=2, reply_to_message_id="", group_id="",
                        created_at=time.time(), ttl=3600.0, message_type="query.train")

    def size(obj) -> int:
        return len(obj.deflate()) + sum(size(child) for child in (obj.children or {}).values())

    return size(make_message(metadata=metadata, content=encode(payload)))


def message_bytes(out: Path) -> tuple[int, int]:
    """An in-process run's messages: payload and Flower bytes (evaluation included)."""
    from fedgl.comm import transport

    sizes = [0, 0]
    original = transport.Transport._observe

    def measure(self, src, dst, method, payload):
        sizes[0] += nbytes(payload)
        sizes[1] += flower_bytes(payload)
        original(self, src, dst, method, payload)

    transport.Transport._observe = measure
    try:
        run(build_config(SETTINGS), out)
    finally:
        transport.Transport._observe = original
    return sizes[0], sizes[1]


def on_flower(root: Path) -> dict:
    from tests.support.flower_federation import Federation

    folder = root / "flower"
    manifest = write_shards(build_config(SETTINGS), folder / "shards")
    (folder / "config.yaml").write_text(yaml.safe_dump({**SETTINGS, "backend": {"shards": str(folder / "shards")}}))
    fed = Federation(root / "federation")
    try:
        for i, party in enumerate(manifest["parties"]):
            fed.start_node(f"org{i}", party["name"], folder / "shards" / party["file"])
        if fed.submit(folder / "config.yaml", folder / "run").returncode != 0:
            raise RuntimeError(f"the Flower run failed; see {root / 'federation'}")
    finally:
        fed.close()
    return json.loads((folder / "run" / "summary.json").read_text())


def cell(value: float | None) -> dict:
    measured = value is not None
    return {"mean": value, "std": 0.0 if measured else None, "paper": None, "runs": int(measured), "of": 1}


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="fedgl-flower-bench-"))
    load = os.getloadavg()[0]  # the machine's load as the runs start: the three rows share it
    payload, framed = message_bytes(root / "bytes")  # also warms up what a first run loads
    local = run(build_config(SETTINGS), root / "local").summary
    ray = run(build_config({**SETTINGS, "backend": {"name": "ray"}}), root / "ray").summary
    flower = on_flower(root)
    base = local["wall_ms_per_round"]
    rows = []
    for variant, summary in (("in-process", local), ("Ray (local instance)", ray),
                             ("Flower (loopback, TLS, node auth)", flower)):
        ms = summary["wall_ms_per_round"]
        rows.append({"variant": variant, "ms_per_round": cell(ms), "x_in_process": cell(ms / base),
                     "payload_bytes": cell(float(summary["bytes_total"] + summary["eval_bytes"])),
                     "flower_object_bytes": cell(float(framed)) if variant.startswith("Flower") else cell(None)})
    assert all(row["payload_bytes"]["mean"] == payload for row in rows), "the ledgers differ"
    out = ROOT / "benchmarks" / "results" / TASK
    out.mkdir(parents=True, exist_ok=True)
    description = ("FedAvg, 3 clients (one party each), 150-node synthetic graph, 3 rounds: wall time per round "
                   "and bytes per run (payload: fedgl's ledger, evaluation included; Flower objects: what "
                   f"carries it, before HTTP/TLS). Measured on {platform.node() or 'one machine'} "
                   f"({os.cpu_count()} cores, load average {load:.1f} as the runs started, "
                   f"{os.getloadavg()[0]:.1f} as they ended), {time.strftime('%Y-%m-%d')}, one after another "
                   "in one invocation: compare the rows as ratios.")
    (out / "table.json").write_text(json.dumps({"task": TASK, "description": description, "source": None,
                                                "seeds": [0], "quick": False, "rows": rows}, indent=1))
    lines = [f"# {TASK}", "", description, "", "| variant | ms_per_round | x_in_process | payload_bytes | "
             "flower_object_bytes |", "|---|---|---|---|---|"]
    for row in rows:
        framed_cell = row["flower_object_bytes"]["mean"]
        lines.append(f"| {row['variant']} | {row['ms_per_round']['mean']:.1f} | {row['x_in_process']['mean']:.1f} | "
                     f"{row['payload_bytes']['mean']:.0f} | {'-' if framed_cell is None else f'{framed_cell:.0f}'} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
