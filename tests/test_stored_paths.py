"""Files written before classes moved still load: a shard folder and checkpointed runs written by the
code before ``protocols/`` became one folder per protocol family (tests/fixtures/pre-reshape) store the
old class paths; the moved code runs and resumes them to exactly the rounds they ran then."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fedgl.comm.party_state import own_class
from fedgl.comm.stored_paths import MOVED
from fedgl.config import load_config
from fedgl.results import read_jsonl
from fedgl.search import run

FIXTURES = Path(__file__).parent / "fixtures" / "pre-reshape"
RESUMED = ["swift", "fedaas", "fedavg", "glasu", "nfedgnn"]


def same_as_before(protocol: str, out: Path) -> None:
    """Metrics (all but wall time) and ledger rows equal the run the old code made."""
    expected = FIXTURES / f"{protocol}-expected"
    rows = [[{k: v for k, v in row.items() if k != "wall_time_s"} for row in read_jsonl(folder / "metrics.jsonl")]
            for folder in (expected, out)]
    assert rows[0] == rows[1]
    assert (out / "ledger.jsonl").read_text() == (expected / "ledger.jsonl").read_text()


def test_a_shard_folder_written_before_the_move_runs_as_it_did(tmp_path):
    shards = tmp_path / "shards"
    shutil.copytree(FIXTURES / "swift-shards", shards)
    assert "fedgl.protocols.cross_client:CrossClient" in (shards / "manifest.json").read_text()
    cfg = load_config(FIXTURES / "swift.yaml", [f"backend.shards={shards}"])
    run(cfg, tmp_path / "deployed")
    same_as_before("swift", tmp_path / "deployed")


@pytest.mark.parametrize("protocol", RESUMED)
def test_a_checkpoint_written_before_the_move_resumes_as_it_did(protocol, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(FIXTURES / f"{protocol}-run", out)
    run(load_config(FIXTURES / f"{protocol}.yaml"), out, resume=True)
    same_as_before(protocol, out)


def test_every_moved_path_names_a_class_that_lives_there():
    for old, new in MOVED.items():
        cls = own_class(old)
        assert f"{cls.__module__}:{cls.__qualname__}" == new


def test_a_key_added_since_hashes_as_before_at_the_value_older_runs_behaved_as():
    """A DP config written before ``replayable_noise`` existed (its noise came from the seed) keeps its
    hash when it says so; today's default (private noise) is a different computation and hashes apart."""
    from fedgl.config import build_config
    from fedgl.config.identity import ADDED_KEYS, config_hash, flat_config
    import hashlib
    import json

    data = {"dataset": {"name": "synthetic"}, "protocol": {"name": "fedavg"},
            "privacy": {"dp": {"noise_multiplier": 1.0, "max_norm": 1.0, "replayable_noise": True}}}
    cfg = build_config(data)
    older = {k: v for k, v in flat_config(cfg).items() if k not in ADDED_KEYS}
    from fedgl.config.identity import resumable_change
    older = {k: v for k, v in older.items() if not resumable_change(k)}
    assert config_hash(cfg) == hashlib.sha256(json.dumps(older, sort_keys=True).encode()).hexdigest()[:16]
    data["privacy"]["dp"]["replayable_noise"] = False
    assert config_hash(build_config(data)) != config_hash(cfg)
