"""FedAvg on Cora in OpenFGL and in fedgl, side by side: whole-process wall times and their ratio.

    FEDGL_DATA_ROOT=/path/to/datasets python benchmarks/peers_openfgl.py [--openfgl PATH] [--repeats 3]

The setting is examples/fedavg-cora.yaml's: 10 METIS clients, 100 rounds of 3 local epochs, GCN 64 with
dropout 0.5, Adam at 0.01 with weight decay 5e-4, evaluation every round, one torch thread each
(fedgl's default), on the CPU. OpenFGL's source is found at ``--openfgl``, else ``$FEDGL_OPENFGL``, else
``../shared/peers/openfgl`` beside the repository; without it the harness says so in one line and stops.
OpenFGL reads Cora's raw Planetoid files from a temporary root in its own layout (copied from
``$FEDGL_DATA_ROOT/planetoid/Cora/raw``), and one untimed run of each side first writes what later runs
reuse (OpenFGL's client split files, fedgl's processed dataset). Then the two run one after another in
fresh processes, ``--repeats`` times, and the medians are compared. The performance suite's ``peers``
group (benchmarks/perf.py) runs the same comparison.

Two modules OpenFGL imports at load time for code this setting never runs are not installed here:
``sknetwork`` (its Louvain split) and ``munkres`` (its clustering accuracy). The OpenFGL process gets
placeholders for them that fail if called. Its client files are written by torch and read back with
torch's safe loader, allowing the PyG data classes they hold.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT.parent / "shared" / "peers" / "openfgl"
EXAMPLE = ROOT / "examples" / "fedavg-cora.yaml"
ROUNDS = 100
OPENFGL_ARGS = ["--dataset", "Cora", "--simulation_mode", "subgraph_fl_metis", "--num_clients", "10",
                "--fl_algorithm", "fedavg", "--model", "gcn", "--num_epochs", "3", "--hid_dim", "64",
                "--num_layers", "2", "--dropout", "0.5", "--lr", "0.01", "--weight_decay", "5e-4",
                "--metrics", "accuracy", "--use_cuda", ""]  # an empty string is False to its bool options
PLACEHOLDERS = {"sknetwork": [], "sknetwork.clustering": ["Louvain"], "munkres": ["Munkres"]}


def openfgl_path(option: str | None = None) -> Path | None:
    """OpenFGL's source folder (holding the ``openfgl`` package), or None when it is not there."""
    chosen = option or os.environ.get("FEDGL_OPENFGL")
    path = Path(chosen) if chosen else DEFAULT
    return path if (path / "openfgl" / "flcore" / "trainer.py").is_file() else None


def skip_line(option: str | None = None) -> str:
    where = option or os.environ.get("FEDGL_OPENFGL") or DEFAULT
    return f"skipped: no OpenFGL source at {where} (set FEDGL_OPENFGL or --openfgl to its folder)"


def openfgl_root(folder: Path) -> Path:
    """A data root in OpenFGL's layout holding Cora's raw Planetoid files."""
    source = Path(os.environ.get("FEDGL_DATA_ROOT", "")) / "planetoid" / "Cora" / "raw"
    if not source.is_dir():
        raise FileNotFoundError(f"Cora's raw files are not at {source} (set FEDGL_DATA_ROOT)")
    target = folder / "global" / "subgraph_fl" / "Cora" / "raw"
    if not target.is_dir():
        shutil.copytree(source, target)
    return folder


def openfgl_command(path: Path, root: Path, rounds: int = ROUNDS) -> list[str]:
    return [sys.executable, __file__, "--child", str(path), str(root), str(rounds)]


def fedgl_command(out: Path, rounds: int = ROUNDS, *extra: str) -> list[str]:
    return [sys.executable, "-m", "fedgl.cli", "run", str(EXAMPLE), "--quiet", "--overwrite", "--rounds", str(rounds),
            "--out", str(out), *extra]


def wall(argv: list[str]) -> float:
    """Wall seconds of one child process, which must succeed."""
    start = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode:
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise RuntimeError(f"{' '.join(argv[1:4])} failed: {tail[0][:300]}")
    return seconds


def compare(path: Path, folder: Path, repeats: int, rounds: int = ROUNDS) -> dict[str, float]:
    """Median wall seconds of OpenFGL's and fedgl's whole processes, run alternately after one untimed
    run of each (which writes what later runs reuse)."""
    openfgl, fedgl = openfgl_command(path, openfgl_root(folder / "openfgl"), rounds), fedgl_command(folder / "fedgl")
    wall(openfgl), wall(fedgl)
    times: dict[str, list[float]] = {"openfgl": [], "fedgl": []}
    for _ in range(repeats):
        times["openfgl"].append(wall(openfgl))
        times["fedgl"].append(wall(fedgl))
    medians = {side: statistics.median(values) for side, values in times.items()}
    return medians | {"ratio": medians["fedgl"] / medians["openfgl"]}


def run_openfgl(path: str, root: str, rounds: str) -> None:
    """In the child: OpenFGL's FedAvg trainer on the setting, as its README starts it."""
    import types

    import torch
    from torch_geometric.data.data import Data, DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import EdgeStorage, GlobalStorage, NodeStorage

    def unavailable(*args, **kwargs):
        raise RuntimeError("not installed here; this setting does not use it")

    for name, attributes in PLACEHOLDERS.items():
        module = sys.modules[name] = types.ModuleType(name)
        for attribute in attributes:
            setattr(module, attribute, unavailable)
    torch.serialization.add_safe_globals([Data, DataEdgeAttr, DataTensorAttr, GlobalStorage, NodeStorage, EdgeStorage])
    torch.set_num_threads(1)
    sys.path.insert(0, path)
    sys.argv = [sys.argv[0], "--root", root, "--num_rounds", rounds, *OPENFGL_ARGS]
    from openfgl import config
    from openfgl.flcore.trainer import FGLTrainer

    FGLTrainer(config.args).train()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--openfgl", help="OpenFGL's source folder (default: $FEDGL_OPENFGL, else "
                                          "../shared/peers/openfgl beside the repository)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each side (default 3)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run_openfgl(*args.child)
        return 0
    path = openfgl_path(args.openfgl)
    if path is None:
        print(skip_line(args.openfgl))
        return 0
    import tempfile

    with tempfile.TemporaryDirectory(prefix="fedgl-peers-") as tmp:
        result = compare(path, Path(tmp), args.repeats)
    print(f"OpenFGL {result['openfgl']:.2f} s, fedgl {result['fedgl']:.2f} s per whole run "
          f"(median of {args.repeats}): fedgl / OpenFGL = {result['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
