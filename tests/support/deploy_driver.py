"""Deployed runs' driver, started by tests/test_deployment.py in its own process (the test process
already hosts another Ray instance). It runs each config against a Ray cluster with the dataset
loader disabled (when it runs over a shard folder), records a fingerprint of everything the driver sends to an actor, asks each party
host which node it runs on, and writes those to a JSON file.

usage: python deploy_driver.py SPEC_JSON
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch


def fingerprints(value, seen=None) -> set[str]:
    """SHA-256 of every tensor reachable in ``value``, whole and, for 2-D tensors, row by row."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return set()
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.layout != torch.strided:
            t = t.to_dense()
        t = t.contiguous()
        out = {hashlib.sha256(t.numpy().tobytes()).hexdigest()}
        if t.dim() == 2:
            out |= {hashlib.sha256(row.tobytes()).hexdigest() for row in t.numpy()}
        return out
    if isinstance(value, torch.nn.Module):
        return fingerprints(dict(value.state_dict()), seen)
    if isinstance(value, dict):
        return set().union(*(fingerprints(v, seen) for v in value.values())) if value else set()
    if isinstance(value, (list, tuple, set)):
        return set().union(*(fingerprints(v, seen) for v in value)) if value else set()
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return fingerprints(vars(value), seen)
    return set()


def drive(out_json: str, run_dir: str, overrides: list[str]) -> None:
    import fedgl.runner
    from fedgl.comm import ray_transport
    from fedgl.config import load_config

    def no_data(*args, **kwargs):
        raise AssertionError("the deployed driver loaded the dataset")

    loader = fedgl.runner.load_data
    fedgl.runner.load_data = no_data if any(o.startswith("backend.shards=") for o in overrides) else loader
    sent: set[str] = set()
    methods: list[str] = []
    send = ray_transport.RayTransport._send

    def watched(self, actor, method, *args):
        methods.append(method)
        sent.update(fingerprints(ray_transport.unpack(args)))  # tensors travel packed as numpy arrays
        return send(self, actor, method, *args)

    ray_transport.RayTransport._send = watched
    try:
        job = fedgl.runner.Run(load_config(None, overrides), run_dir)
        transport = job.transport
        ray = transport._ray
        hosts = {name: ray.get(transport._hosts[h].node_id.remote()) for name, h in transport._placement.items()}
        nodes = {n["NodeID"]: sorted(k for k in n["Resources"] if k.startswith("node_"))
                 for n in ray.nodes() if n["Alive"]}
        job.execute(progress=False)
    finally:
        ray_transport.RayTransport._send = send
        fedgl.runner.load_data = loader
    with open(out_json, "w") as fh:
        json.dump({"sent": sorted(sent), "methods": sorted(set(methods)),
                   "placement": {name: nodes.get(node, []) for name, node in hosts.items()}}, fh)


def main(spec: str) -> None:
    """Every run listed in the JSON file ``spec`` ([{"report", "run_dir", "overrides"}]), one after
    the other in this process."""
    for job in json.loads(open(spec).read()):
        drive(job["report"], job["run_dir"], job["overrides"])


if __name__ == "__main__":
    main(sys.argv[1])
