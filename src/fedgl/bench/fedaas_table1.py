"""FedAAS bench tasks (fedaas.txt)."""

from __future__ import annotations

from .core import BenchTask

TASKS: dict[str, BenchTask] = {}
