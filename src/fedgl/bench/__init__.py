"""Named benchmark tasks: sweeps over configs and seeds, aggregated beside the papers' numbers.

Each task module registers its tasks in ``TASKS`` on import; the table below says which module holds
which task so ``fedgl bench NAME`` imports only what it needs.
"""

from __future__ import annotations

from importlib import import_module

from ..errors import ConfigError
from .core import BenchTask, Variant, run_task

MODULES: dict[str, str] = {
    "foundation": "fedgl.bench.foundation",
    "glasu": "fedgl.bench.glasu",
    "nfedgnn": "fedgl.bench.nfedgnn",
    "swift": "fedgl.bench.swift",
    "fedaas": "fedgl.bench.fedaas",
    "fedaas-table1": "fedgl.bench.fedaas_table1",
    "privacy": "fedgl.bench.privacy",
    "defaults": "fedgl.bench.defaults",
}


def all_tasks() -> dict[str, BenchTask]:
    tasks: dict[str, BenchTask] = {}
    for module in dict.fromkeys(MODULES.values()):
        tasks.update(import_module(module).TASKS)
    return tasks


def get_task(name: str) -> BenchTask:
    tasks = all_tasks()
    if name not in tasks:
        raise ConfigError(f"unknown bench task {name!r}; allowed: {', '.join(sorted(tasks))}")
    return tasks[name]


__all__ = ["BenchTask", "Variant", "all_tasks", "get_task", "run_task"]
