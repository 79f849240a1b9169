"""The performance suite's harness: measures and their targets, the machine, the device a pass computes
on, timing (alternate calls for ratios), fedgl runs timed round by round, child processes, and the
results files (perf.json, perf.md)."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from fedgl import device as devices
from fedgl.tables import markdown_table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


# ---- where a pass computes ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Place:
    """The device of a pass (``--device``): every fedgl run's ``device`` and where the plain PyG
    references compute. Passed to whatever needs it, so nothing global changes with it."""

    name: str = "cpu"  # as a config names it: cpu, cuda, cuda:N
    device: torch.device = devices.CPU

    @classmethod
    def of(cls, name: str) -> Place:
        """``name`` on this machine, refused with one line where it cannot compute."""
        return cls(name, devices.resolve(name))

    @property
    def gpu(self) -> bool:
        return self.device.type == "cuda"

    def wait(self) -> None:
        """Return once the device has done its work (a GPU runs kernels asynchronously)."""
        if self.gpu:
            torch.cuda.synchronize(self.device)

    def finished(self, step: Callable[[], Any]) -> Callable[[], Any]:
        """``step`` with this device as torch's default, returning once the device has done its work
        (an unfinished step would be timed short)."""
        def run() -> Any:
            with devices.working_on(self.device):
                out = step()
            self.wait()
            return out
        return run

    def config(self, protocol: dict, dataset: str, model: dict, partition: dict | None = None,
               options: dict | None = None, **train: Any) -> dict:
        """A run's config computing here, without simulated compute time."""
        return {"dataset": {"name": dataset, **({"options": options} if options else {})},
                "partition": partition or {}, "model": model, "protocol": protocol,
                "train": {"rounds": 1000, "lr": 0.01, **train}, "network": {"compute": "ignore"},
                "device": self.name}


CPU = Place()


# ---- measures -------------------------------------------------------------------------------------------
@dataclass
class Measure:
    group: str
    name: str
    value: float | None
    unit: str
    target: str | None = None  # "<= 1.3", "< 4"; None: reported only
    note: str = ""

    @property
    def passed(self) -> bool | None:
        if self.target is None:
            return None
        if self.value is None:
            return False
        op, bound = self.target.split()
        return {"<=": self.value <= float(bound), "<": self.value < float(bound)}[op]

    def row(self) -> dict[str, Any]:
        return asdict(self) | {"pass": self.passed}


def failed(group: str, name: str, unit: str, target: str | None, err: BaseException) -> Measure:
    """A measure that could not be taken: no value, the error as its note (a target fails)."""
    return Measure(group, name, None, unit, target, f"not measured: {type(err).__name__}: {err}"[:300])


def machine(place: Place = CPU) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": cpu, "cores": os.cpu_count(),
            "kernels": torch.backends.cpu.get_cpu_capability(),  # the instruction set torch's CPU kernels use
            "load_average": [round(x, 2) for x in os.getloadavg()], "torch": torch.__version__,
            "python": platform.python_version(), "device": place.name,
            **({"gpu": torch.cuda.get_device_name(place.device)} if place.gpu else {})}


# ---- timing ---------------------------------------------------------------------------------------------
def paired_seconds(first: Callable[[], Any], second: Callable[[], Any], calls: int) -> tuple[float, float]:
    """Median seconds per call of two steps timed alternately (after one warm-up call each), so that a
    shared machine's slow spells fall on both sides of their ratio."""
    first()
    second()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(calls):
        for step, out in zip((first, second), times):
            start = time.perf_counter()
            step()
            out.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def seconds_per_call(step: Callable[[], Any], calls: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    return (time.perf_counter() - start) / calls


class FedglRun:
    """A configured run whose rounds are timed one by one (no evaluation, no results folder), on the
    device its config names."""

    def __init__(self, cfg: dict, data=None):
        from fedgl.config import build_config
        from fedgl.runner import Run

        self.tmp = tempfile.mkdtemp(prefix="fedgl-perf-")
        self.job = Run(build_config(cfg), self.tmp, data=data)
        self.place = Place(self.job.cfg.device, devices.resolve(self.job.cfg.device))
        self.round = 0

    @property
    def protocol(self):
        return self.job.protocol

    def step(self) -> None:
        self.round += 1
        self.job.transport.set_round(self.round)
        self.job.protocol.train_round(self.round)
        self.place.wait()

    def close(self) -> None:
        self.job.transport.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def round_timer(group: str, out: list[Measure], rounds: int) -> Callable[..., None]:
    """``per_round(name, cfg, target, note, data=None)``: seconds per round of a run (after one warm-up
    round), appended to ``out``."""
    def per_round(name: str, cfg: dict, target: str | None, note: str, data=None) -> None:
        try:
            run = FedglRun(cfg, data)
            try:
                value = seconds_per_call(run.step, rounds)
            finally:
                run.close()
        except Exception as err:
            out.append(failed(group, name, "s", target, err))
            return
        out.append(Measure(group, name, value, "s", target, note))
    return per_round


def load(name: str, **options: Any):
    from fedgl.data import load_dataset

    split = "full" if name == "pubmed" else "default"
    return load_dataset(name, split=split, **options)


# ---- processes and memory -------------------------------------------------------------------------------
def timed_process(argv: list[str], env: dict | None = None) -> tuple[float, float, str]:
    """Wall seconds and peak resident MiB of one child process (its own rusage, via wait4)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"{' '.join(argv[:4])} exited {proc.returncode}: {output.strip()[-300:]}")
    return wall, usage.ru_maxrss / 1024, output


def fedgl_command() -> list[str]:
    return [sys.executable, "-m", "fedgl.cli"]


def import_seconds(module: str) -> tuple[float, set[str]]:
    """``python -X importtime -c "import MODULE"``: the module's cumulative import time and every
    module the import loaded."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True,
                          text=True, check=True)
    loaded, total = set(), 0.0
    for line in proc.stderr.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)", line)
        if match:
            loaded.add(match.group(3))
            if match.group(3) == module and not match.group(2):
                total = int(match.group(1)) / 1e6
    return total, loaded


def peak_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def gpu_peak(place: Place, group: str, name: str) -> list[Measure]:
    """The process's peak GPU memory so far, as a measure (none on the CPU)."""
    if not place.gpu:
        return []
    return [Measure(group, name, torch.cuda.max_memory_allocated(place.device) / 2**20, "MiB", None,
                    "torch.cuda.max_memory_allocated")]


# ---- results files --------------------------------------------------------------------------------------
def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"


def verdict(row: dict) -> str:
    return {True: "pass", False: "FAIL", None: ""}[row["pass"]]


def markdown(result: dict) -> str:
    m = result["machine"]
    ran = f"groups {', '.join(result['groups_run'])}" if result.get("groups_run") else "every group"
    kernels = f", {m['kernels']} kernels" if m.get("kernels") else ""
    gpu = f" and {m['device']} ({m['gpu']})" if m.get("gpu") else ""
    intro = (f"Last run {m['date']} ({ran}) on {m['cpu']} ({m['cores']} cores{kernels}, load average "
             f"{m['load_average'][0]} at start){gpu}, torch {m['torch']}, "
             f"{'quick' if result['quick'] else 'full'} pass. "
             "The measured column is when the row's group ran, the load column the 1-minute load average then (the "
             "machine is shared).")
    rows = [[row["group"], row["name"], fmt(row["value"]), row["unit"], row["target"] or "", verdict(row),
             row.get("measured", ""), row.get("load_average", ""), row["note"].replace("|", "/")]
            for row in result["measures"]]
    header = ["group", "measure", "value", "unit", "target", "pass", "measured", "load", "notes"]
    return "\n".join([intro, "", *markdown_table(header, rows)]) + "\n"


def stem(device: str) -> str:
    """The results' file name: ``perf`` for the CPU pass the README includes, ``perf-cuda`` for a GPU's."""
    return "perf" if device == "cpu" else "perf-cuda"


def write(result: dict, out_dir: Path = RESULTS) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    name = stem(result["machine"].get("device", "cpu"))
    json_path, md_path = out_dir / f"{name}.json", out_dir / f"{name}.md"
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    md_path.write_text(markdown(result))
    return json_path, md_path
