"""A party's checkpoint holds its data and its unreleased model: it is written owner-only, where the
party chooses, and a tampered one cannot weaken the party's noise."""

from __future__ import annotations

import stat

import pytest
import torch

from fedgl.comm.flower_party import NodeParty, private_folder
from fedgl.comm.flower_transport import checkpoint_name
from fedgl.comm.party_state import TAG, plain, restore
from fedgl.config import build_config
from fedgl.deployment import write_shards
from fedgl.errors import ConfigError
from fedgl.privacy.config import DPConfig
from fedgl.privacy.dp import PrivateRelease
from fedgl.runner import Run

DP = {"noise_multiplier": 4.0, "max_norm": 1.0}
BASE = {"dataset": {"name": "synthetic", "options": {"num_nodes": 150}}, "partition": {"num_clients": 3},
        "network": {"compute": "ignore"}, "train": {"rounds": 1}, "privacy": {"dp": DP}}


def _others_can_read(path) -> bool:
    return bool(path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO))


def test_party_checkpoints_and_shards_are_owner_only(tmp_path):
    """Another user of the machine reads neither a party's checkpoint nor its shard (its data)."""
    Run(build_config({**BASE, "checkpoint_every": 1}), tmp_path / "run").execute(progress=False)
    [parties] = (tmp_path / "run").glob("parties-*")
    files = list(parties.iterdir())
    assert files and not _others_can_read(parties)
    assert not any(_others_can_read(f) for f in files)
    write_shards(build_config(BASE), tmp_path / "shards")
    shards = [f for f in (tmp_path / "shards").glob("*.pt") if f.name != "evaluator.pt"]
    assert shards and not any(_others_can_read(f) for f in shards)


def test_a_tampered_checkpoint_cannot_lower_the_noise_or_make_it_replayable():
    """A checkpoint that brings a seeded generator or a noise multiplier of 0 changes neither the
    release's scale nor its OS-keyed stream."""
    release = PrivateRelease(DPConfig(**DP), seed=0)
    saved = plain(release)
    assert "noise_multiplier" not in saved["attrs"]  # configuration: taken from the run's config only
    known = torch.Generator().manual_seed(1234)
    saved["attrs"]["noise"]["attrs"]["generator"] = {TAG: "generator", "state": known.get_state()}
    restore(release, saved)
    drawn = release.noise.normal((64,))
    assert not torch.equal(drawn, torch.randn(64, generator=torch.Generator().manual_seed(1234)))
    saved["attrs"]["noise_multiplier"] = 0.0
    with pytest.raises(AttributeError):  # Party.load turns it into one line: the file does not fit
        restore(release, saved)
    assert release.noise_multiplier == DP["noise_multiplier"]
    zeros = torch.zeros(1000, 8)
    assert release.noised(zeros).std() > 0.5 * DP["noise_multiplier"]


@pytest.mark.parametrize("name", ["/etc/passwd", "../../elsewhere", f"{'0' * 16}/parties-1/../../x",
                                  f"{'0' * 16}/../parties-1", "parties-1", None])
def test_a_flower_node_refuses_a_checkpoint_the_server_names_by_path(tmp_path, name):
    """The server names a checkpoint; the node alone chooses where it is kept, inside its state folder."""
    node = NodeParty("client0", str(tmp_path / "shard.pt"), str(tmp_path / "state"), 1)
    with pytest.raises(ConfigError, match="refused checkpoint name"):
        node.control("load", {"checkpoint": name})


def test_a_flower_checkpoint_name_keys_the_run_folder_and_lands_in_the_state_folder(tmp_path):
    name = checkpoint_name(tmp_path / "results" / "run-a" / "parties-3")
    assert name != checkpoint_name(tmp_path / "results" / "run-b" / "parties-3")
    node = NodeParty("client0", str(tmp_path / "shard.pt"), str(tmp_path / "state"), 1)
    assert node.checkpoint(name).is_relative_to(tmp_path / "state")


def test_a_party_state_folder_is_made_owner_only(tmp_path):
    folder = tmp_path / "state"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    private_folder(folder)
    assert not _others_can_read(folder)


def test_shards_are_not_written_with_noise_anyone_can_replay(tmp_path):
    """Replayable noise is a test switch: parties deployed from shards draw noise no one can regenerate."""
    cfg = build_config({**BASE, "privacy": {"dp": {**DP, "replayable_noise": True}}})
    with pytest.raises(ConfigError, match="replayable_noise"):
        write_shards(cfg, tmp_path / "shards")
    assert not (tmp_path / "shards").exists()
