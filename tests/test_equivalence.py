"""One run, four ways, for every protocol with parties: on Ray it equals the in-process run; resumed
from a checkpoint it equals the uninterrupted run (the simulated clock included); deployed from
`fedgl partition`'s shard folder it equals the run that loads everything in one process; and run
again from the `config.yaml` its results folder holds, it is the same run. Each comparison is strict
(`support.runs.compare_runs`): every metric but wall time, the ledger and the summary, to the bit."""

from __future__ import annotations

import json

import pytest
import yaml

from fedgl.cli import main
from fedgl.config import build_config, load_config
from fedgl.deployment import MANIFEST
from fedgl.search import run
from support.configs import PROTOCOLS, VARIANTS, tiny
from support.runs import compare_runs, run_in_fresh_process, run_resumed

EVERY = [*PROTOCOLS, *VARIANTS]


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    """The in-process run of a protocol and its settings, run once per module."""
    runs = {}

    def get(name: str):
        if name not in runs:
            settings = tiny(name)
            runs[name] = run(build_config(settings), tmp_path_factory.mktemp(name)), settings
        return runs[name]

    return get


# Ray starts an instance and two actors per run (seconds each): with the slow tests, which CI runs too.
RAY_DEFAULT: tuple[str, ...] = ()


@pytest.mark.ray
@pytest.mark.parametrize("name", [n if n in RAY_DEFAULT else pytest.param(n, marks=pytest.mark.slow) for n in EVERY])
def test_ray_equals_local(name, tmp_path, ray_session):
    """The in-process reference runs in a process of its own: in this one, which holds a Ray driver
    through the session, one in-process run (fedgnn-pns) was seen to differ in CI (an open defect)."""
    settings = tiny(name)
    local = run_in_fresh_process(settings, tmp_path / "local")
    remote = run(build_config({**settings, "backend": {"name": "ray", "actors": 2}}), tmp_path / "ray")
    assert remote.summary["backend"] == "ray"
    compare_runs(local, remote, differ=("backend",))


@pytest.mark.parametrize("name", ["centralized", *EVERY])
def test_resumed_equals_uninterrupted(name, in_process, tmp_path):
    straight, settings = in_process(name)
    compare_runs(straight, run_resumed(settings, tmp_path, stop_after=1))


@pytest.mark.parametrize("name", EVERY)
def test_deployed_equals_in_process(name, in_process, tmp_path, monkeypatch):
    """`fedgl partition` of the run's config (one file per party, the server's state, the evaluator's
    ground truth, the manifest), then the run over the shard folder, whose driver never loads the
    dataset."""
    import fedgl.runner

    local, settings = in_process(name)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(settings))
    assert main(["partition", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "shards")]) == 0
    manifest = json.loads((tmp_path / "shards" / MANIFEST).read_text())
    parties = [p["name"] for p in manifest["parties"]]
    keys = ["roster.json", *parties] if "roster" in manifest else []  # secure aggregation: each key in its folder
    assert sorted(f.name for f in (tmp_path / "shards").iterdir()) == sorted(
        [MANIFEST, "server.pt", "evaluator.pt"] + [f"{n}.pt" for n in parties] + keys)
    monkeypatch.setattr(fedgl.runner, "load_data", lambda *a, **k: pytest.fail("the deployed driver loaded the data"))
    deployed = run(build_config({**settings, "backend": {"shards": str(tmp_path / "shards")}}), tmp_path / "run")
    compare_runs(local, deployed)


@pytest.mark.parametrize("name", ["centralized", *EVERY])
def test_the_results_folders_config_reruns_the_run(name, in_process, tmp_path):
    first, _ = in_process(name)
    compare_runs(first, run(load_config(first.out_dir / "config.yaml"), tmp_path))
