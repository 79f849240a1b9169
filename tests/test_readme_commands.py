"""Every command in README.md and docs/ runs as written (with a small round count).

Fenced ``bash`` blocks are read line by line: ``fedgl run`` commands run in a scratch folder with
the repository's examples and ``--set train.rounds=2`` appended (LLCG's ``local_steps`` if more: its
first server correction); a run over ``backend.shards`` first partitions into that folder with the
run's other settings; ``fedgl bench TASK`` must name a task; ``fedgl report`` and ``fedgl audit`` run
over folders a small run writes first, ``fedgl keys roster`` over keys ``fedgl keys new`` writes first. Set-up and long benchmark
commands (pip, pytest, python scripts) are checked elsewhere (CI runs them).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from fedgl.bench import all_tasks
from fedgl.cli import main

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"```bash\n(.*?)```", re.S)


def commands() -> list[tuple[str, str]]:
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in FENCE.findall(doc.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("  #")[0].split(" # ")[0].strip()
                if line.startswith("fedgl ") and line not in {c for _, c in found}:  # a repeat runs once
                    found.append((doc.name, line))
    return found


# Runs whose two rounds take many seconds go with the slow tests: FedAAS's 50 clients on CS,
# GLASU's 4-layer GCNII mini-batches, PubMed, starting Ray, importing the trackers.
SLOW = ("examples/fedaas-cs.yaml", "examples/glasu-cora.yaml", "pubmed", "ray", "logging=")


def slow(command: str) -> bool:
    return command.startswith("fedgl run ") and any(s in command for s in SLOW)


def test_the_docs_have_commands():
    assert len(commands()) >= 10


@pytest.mark.parametrize("doc, command", [
    pytest.param(d, c, id=f"{d}:{c[:60]}", marks=[pytest.mark.slow] if slow(c) else [])
    for d, c in commands()])
def test_command_runs_as_written(doc, command, data_root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    argv = shlex.split(command)[1:]
    if argv[0] == "bench":
        assert argv[1] in all_tasks(), f"{doc}: unknown bench task in {command!r}"
        return
    if argv[0] == "report":
        for folder in argv[1:]:
            if not folder.startswith("-") and folder.startswith("results/") and folder != "results/report":
                assert main(["run", "--dataset", "synthetic", "--set", "dataset.options.num_nodes=200",
                             "--rounds", "2", "--quiet", "--out", folder]) == 0
        assert main(argv) == 0, command
        return
    if argv[:2] == ["keys", "roster"]:  # over the public keys each organisation's `keys new` wrote
        for pub in argv[2:argv.index("--out")]:
            assert main(["keys", "new", "--out", str(Path(pub).parent)]) == 0
    if argv[0] == "audit":  # over a small run that recorded its messages
        assert main(["run", "--dataset", "synthetic", "--set", "dataset.options.num_nodes=200", "--rounds", "2",
                     "--set", "privacy.record_messages=true", "--quiet", "--out", argv[1]]) == 0
    shards = next((a.split("=", 1)[1] for a in argv if a.startswith("backend.shards=")), None)
    if argv[0] == "run" and shards is not None:  # the shard folder the doc's partition command writes
        sets = [a for i, a in enumerate(argv) if i and argv[i - 1] == "--set" and not a.startswith("backend.")]
        assert main(["partition", *[a for a in argv[1:] if not a.startswith("-") and a.endswith(".yaml")],
                     *[x for a in sets for x in ("--set", a)], "--out", shards]) == 0
    if argv[0] == "run":  # two rounds, or as many as LLCG needs to reach its first server correction
        steps = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("protocol.local_steps=")), 2)
        argv += ["--set", f"train.rounds={max(2, steps)}", "--quiet"]
        if "--out" not in argv:
            argv += ["--out", str(tmp_path / "out")]
        if "backend.name=ray" in command or "--backend" in argv and argv[argv.index("--backend") + 1] == "ray":
            pytest.importorskip("ray")
    assert main(argv) == 0, f"{doc}: {command}"
