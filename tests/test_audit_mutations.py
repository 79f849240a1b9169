"""`fedgl audit` must fail a run whose protection is broken: each test breaks one protection in a tiny
recorded run (masks replaced by zeros, a participant list naming a client twice, labels sent as an
embedding, DP noise drawn from the config seed) and checks that the audit flags it, and that the same
run with the protection intact is not flagged, so removing the check from the audit fails the test.
FedAAS's masked model uploads are checked the same way."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
import torch.nn.functional as F

from fedgl.cli import main
from fedgl.comm import rpc
from fedgl.config import build_config
from fedgl.errors import RunFailed
from fedgl.privacy import bonawitz, secure_aggregation
from fedgl.privacy.bonawitz import SecAggClient
from fedgl.privacy.secure_aggregation import decode, pair_secret
from fedgl.protocols.fedavg.client import FedAvgClient
from fedgl.protocols.fedavg.server import FedAvg
from fedgl.runner import Run

FEATURES = 16
SYNTHETIC = {"name": "synthetic", "options": {"num_nodes": 400, "num_features": FEATURES, "avg_degree": 10}}


def config(protocol: dict, privacy: dict, rounds: int = 2, model: dict | None = None,
           partition: dict | None = None) -> dict:
    return {"dataset": SYNTHETIC,
            "model": {"name": "sage", "hidden": FEATURES, "layers": 2, "dropout": 0.5, **(model or {})},
            "partition": {"num_clients": 4, "method": "metis", **(partition or {})},
            "protocol": protocol, "train": {"rounds": rounds, "lr": 0.01}, "eval": {"every": rounds},
            "network": {"compute": "ignore"}, "privacy": {"record_messages": True, **privacy}}


def audit(cfg: dict, folder, capsys) -> tuple[int, dict]:
    """Run ``cfg`` into ``folder``, then ``fedgl audit --json``: its exit code and report."""
    Run(build_config(cfg), folder).execute(progress=False)
    capsys.readouterr()
    code = main(["audit", str(folder), "--json"])
    return code, json.loads(capsys.readouterr().out)


def flagged(report: dict) -> set[str]:
    return {f["attack"] for f in report["flagged"]}


# ---- (a) secure aggregation's masks replaced by zeros -------------------------------------------------
def zero_masks(monkeypatch) -> None:
    """Every mask stream (pairwise, self and one-way masks) replaced by zeros."""
    def zeros(secret: bytes, size: int, purpose: bytes, *label: int) -> torch.Tensor:
        return torch.zeros(size, dtype=torch.int64)

    for module in (secure_aggregation, bonawitz):
        monkeypatch.setattr(module, "stream", zeros)


SWIFT = config({"name": "swift", "I": 1, "K": 2, "fanouts": [3, 3]}, {"secure_aggregation": True}, rounds=4,
               model={"dropout": 0.0}, partition={"method": "random"})


def test_zero_masks_are_flagged_and_real_masks_are_not(tmp_path, capsys, monkeypatch):
    code, clean = audit(SWIFT, tmp_path / "masked", capsys)
    assert code == 0 and not clean["flagged"], clean["flagged"]
    assert clean["attacks"]["masking"]["attacked"] > 0 and clean["attacks"]["reconstruction"]["recovered"] == 0

    zero_masks(monkeypatch)
    code, broken = audit(SWIFT, tmp_path / "zeros", capsys)
    assert code == 1 and {"masking", "reconstruction"} <= flagged(broken)
    rec = broken["attacks"]["reconstruction"]
    assert rec["recovered"] > 0.5 * rec["attacked"]  # the decoded sums are the plain sums


# ---- (b) a participant list naming the same client twice ----------------------------------------------
FEDAVG_MASKED = config({"name": "fedavg", "group_size": 1}, {"secure_aggregation": True}, model={"name": "gcn"})


def with_itself(self, chosen: torch.Tensor, round_index: int) -> torch.Tensor:
    """A server's "secure sum" of one client with itself: the participant list names the sender twice,
    and the client's masked input is taken as the total (``FedAvg.secure_total``'s place)."""
    i = int(chosen[0])
    self.sums += 1

    def ask(method: str, **kwargs):
        return self.transport.call_many([self.clients[i]], method, label=self.sums, **kwargs)[0]

    ids = torch.tensor([i, i])
    keys = ask("secagg_advertise")
    ask("secagg_share", ids=ids, keys=torch.stack([keys, keys]), threshold=2)
    return decode(ask("secagg_input", senders=ids, sealed=torch.zeros(0, bonawitz.SEALED, dtype=torch.uint8)))


def test_a_client_masking_with_itself_only_is_flagged(tmp_path, capsys, monkeypatch):
    """Audit claim (docs/privacy.md, Audit, *Masking*): a fixed-point payload whose masks cancelled, as
    with a participant list naming the sender twice, reads as values and is flagged; the intact client
    refuses such a list in one line."""
    code, clean = audit(FEDAVG_MASKED, tmp_path / "masked", capsys)
    assert code == 0 and not clean["flagged"] and clean["attacks"]["masking"]["attacked"] > 0

    monkeypatch.setattr(FedAvg, "secure_total", with_itself)
    with pytest.raises(RunFailed, match="refuses a participant list that repeats client"):
        Run(build_config(FEDAVG_MASKED), tmp_path / "refused").execute(progress=False)

    drawn: list[torch.Tensor] = []

    def pairwise_by_entry(self, value, u2, raw):
        """The client with its checks gone, masking as before double masking: no self-mask, and for each
        entry of the list naming it, its pairwise mask with every other entry (+ towards a later entry,
        - towards an earlier one). With [i, i] its two masks with itself cancel."""
        s = self.session
        out = value.cpu().to(torch.int64).flatten().clone()
        for p, q in itertools.permutations(range(len(u2)), 2):
            if u2[p] == self.index:
                mask = bonawitz.pair_mask(pair_secret(s.c.shared(s.c_public[u2[q]])), out.numel(), s.label)
                drawn.append(mask)
                out += mask if p < q else -mask
        return out.view(value.shape)

    monkeypatch.setattr(bonawitz, "check_participants", lambda *args: None)
    monkeypatch.setattr(SecAggClient, "_masked_input", pairwise_by_entry)
    code, broken = audit(FEDAVG_MASKED, tmp_path / "twice", capsys)
    assert len(drawn) == 4 and all(bool((m != 0).any()) for m in drawn)  # real masks, +/- once per round
    masking = broken["attacks"]["masking"]
    assert code == 1 and flagged(broken) == {"masking"}
    assert masking["attacked"] == masking["recovered"] == 2  # that client's reply in both rounds


# ---- (c) labels sent under another kind ---------------------------------------------------------------
FEDAVG = config({"name": "fedavg", "group_size": 1}, {}, model={"name": "gcn"})


def test_labels_sent_as_an_embedding_are_flagged(tmp_path, capsys, monkeypatch):
    code, clean = audit(FEDAVG, tmp_path / "plain", capsys)
    assert code == 0 and not clean["flagged"]

    train = FedAvgClient.train

    @rpc(state="model", returns={"state": "model", "num_train": "control", "loss": "control", "h": "embedding"})
    def train_and_leak(self, state, summands=0):
        y = self.trainer.y  # the client's labels, as one-hot rows of an "embedding"
        return train(self, state, summands) | {"h": F.one_hot(y, int(y.max()) + 1).float()}

    monkeypatch.setattr(FedAvgClient, "train", train_and_leak)
    code, broken = audit(FEDAVG, tmp_path / "leak", capsys)
    assert code == 1 and flagged(broken) == {"labels"}
    assert broken["attacks"]["labels"]["recovered"] > 0.5 * broken["attacks"]["labels"]["attacked"]


# ---- (d) DP noise drawn from the config seed ----------------------------------------------------------
@pytest.mark.parametrize("stream", ["os", "seed"])
def test_noise_replayed_from_the_config_seed_is_flagged(tmp_path, capsys, stream):
    """``replayable_noise`` draws the noise from the config seed, as fedgl's DP did before its noise came
    from the operating system: the audit must flag it."""
    dp = {"noise_multiplier": 1.0, "max_norm": 1.0, "replayable_noise": stream == "seed"}
    code, report = audit(config({"name": "nfedgnn", "lam": 1.0}, {"dp": dp}, model={"name": "gcn"}), tmp_path, capsys)
    replay = report["attacks"]["noise_replay"]
    assert replay["attacked"] >= 2  # the users' latents of both rounds
    if stream == "os":
        assert code == 0 and not report["flagged"] and replay["recovered"] == 0
    else:
        assert code == 1 and flagged(report) == {"noise_replay"} and replay["recovered"] == replay["attacked"]


# ---- FedAAS's masked model uploads ------------------------------------------------------------------
def test_fedaas_model_uploads_read_as_masked_and_zero_masks_as_values(tmp_path, capsys, monkeypatch):
    cfg = config({"name": "fedaas", "widths": [FEATURES, FEATURES], "fanouts": [4, 4], "batches": 4,
                  "interval_loss": "train"}, {"secure_aggregation": True})
    del cfg["model"]  # FedAAS builds its model from its protocol section
    code, clean = audit(cfg, tmp_path / "masked", capsys)
    masking = clean["attacks"]["masking"]
    assert code == 0 and masking["attacked"] > 0 and masking["recovered"] == 0

    zero_masks(monkeypatch)
    code, broken = audit(cfg, tmp_path / "zeros", capsys)
    assert code == 1 and broken["attacks"]["masking"]["recovered"] == masking["attacked"]
