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
    """A checkpoint that brings a seeded generator, a noise multiplier of 0 or DP settings of its own
    changes neither the release's scale nor its OS-keyed stream."""
    release = PrivateRelease(DPConfig(**DP), seed=0)
    saved = plain(release)
    assert "noise_multiplier" not in saved["attrs"] and "dp" not in saved["attrs"]  # the run's config applies
    known = torch.Generator().manual_seed(1234)
    saved["attrs"]["noise"]["attrs"]["generator"] = {TAG: "generator", "state": known.get_state()}
    saved["attrs"]["noise_multiplier"] = 0.0  # as a file from before it was derived from the config held it
    saved["attrs"]["dp"] = plain(DPConfig(noise_multiplier=1e-9, max_norm=1.0), configs=True)
    restore(release, saved)
    drawn = release.noise.normal((64,))
    assert not torch.equal(drawn, torch.randn(64, generator=torch.Generator().manual_seed(1234)))
    assert (release.noise_multiplier, release.max_norm) == (DP["noise_multiplier"], DP["max_norm"])
    assert release.noised(torch.zeros(1000, 8)).std() > 0.5 * DP["noise_multiplier"]


@pytest.mark.parametrize("name", ["/etc/passwd", "../../elsewhere", f"{'0' * 16}/parties-1/../../x",
                                  f"{'0' * 16}/../parties-1", "parties-1", None])
def test_a_flower_node_refuses_a_checkpoint_the_server_names_by_path(tmp_path, name):
    """The server names a checkpoint; the node alone chooses where it is kept, inside its state folder."""
    node = NodeParty("client0", str(tmp_path / "shard.pt"), str(tmp_path / "state"), 1)
    node.state.parent.mkdir(parents=True)
    node.state.write_bytes(b"the party's state")
    for action in ("save", "load"):
        with pytest.raises(ConfigError, match="refused checkpoint name"):
            node.control(action, {"checkpoint": name})
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["client0.pt"]  # nothing written


def test_a_flower_node_keeps_every_checkpoint_the_server_may_still_need(tmp_path):
    """A save prunes only what is older than the newest earlier checkpoint: a resumed run's rounds (another
    ``checkpoint_every``) or those an earlier run left in the same folder stay, and so does the last one
    the server may have committed."""
    node = NodeParty("client0", str(tmp_path / "shard.pt"), str(tmp_path / "state"), 1)
    node.state.parent.mkdir(parents=True)
    node.state.write_bytes(b"the party's state")
    run = "0123456789abcdef"
    for number in (10, 20, 13, 5):
        node.control("save", {"checkpoint": f"{run}/parties-{number}"})
    kept = sorted(int(f.name.removeprefix("parties-")) for f in (tmp_path / "state" / "checkpoints" / run).iterdir())
    assert kept == [5, 10, 13, 20]
    node.control("save", {"checkpoint": f"{run}/parties-30"})
    kept = sorted(int(f.name.removeprefix("parties-")) for f in (tmp_path / "state" / "checkpoints" / run).iterdir())
    assert kept == [20, 30]


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
