"""Watching what crosses the in-process transport: every call's arguments and result, and the audit of
raw feature rows on the wire."""

from __future__ import annotations

import torch

from fedgl.comm import LocalTransport
from fedgl.config import build_config
from fedgl.runner import Run


def spy_calls(monkeypatch) -> list[tuple[str, str, dict, object]]:
    """Record (party, method, arguments, result) of every call the local transport executes."""
    seen: list[tuple[str, str, dict, object]] = []
    original = LocalTransport._execute

    def spy(self, calls):
        out = original(self, calls)
        seen.extend((name, method, kwargs, result) for (name, method, kwargs), (result, _) in zip(calls, out))
        return out

    monkeypatch.setattr(LocalTransport, "_execute", spy)
    return seen


def tensors(obj):
    """Every tensor inside nested dicts, lists and tuples."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors(v)


def audited_rows(cfg: dict, tmp_path, monkeypatch) -> list[tuple[str, str, str]]:
    """Run ``cfg`` and return (sender, receiver, method) of every message carrying a raw feature row."""
    seen = spy_calls(monkeypatch)
    job = Run(build_config(cfg), tmp_path)
    raw = job.evaluator.data.x
    rows = {bytes(r.numpy().tobytes()) for r in raw[(raw != 0).any(1)]}
    job.execute(progress=False)
    hits = []
    for name, method, kwargs, result in seen:
        for src, dst, payload in (("server", name, kwargs), (name, "server", result)):
            for t in tensors(payload):
                if t.is_floating_point() and t.dim() == 2 and t.size(1) == raw.size(1):
                    if any(bytes(r.contiguous().numpy().tobytes()) in rows for r in t.float()):
                        hits.append((src, dst, method))
    return hits
