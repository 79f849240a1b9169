"""GLASU's secure mean on the dropout-tolerant secure sum (``protocols/aggregation.py``): the same
training as the plain mean, the ledger's bytes as counted in docs/privacy.md, clients lost in a sum,
the threshold, labels across a resume, and what the server holds of one client's H_m^+."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from fedgl.comm import Transport, rpc
from fedgl.config import build_config
from fedgl.errors import ConfigError, PartyFailure, RunFailed
from fedgl.privacy import DPConfig, bonawitz, shamir
from fedgl.protocols.glasu.client import GlasuClient
from fedgl.runner import Run
from support.configs import TINY, merge
from support.masks import top_bits
from support.stored import files_holding
from support.secure_sum import one_line

SECURE = {"secure_aggregation": True}  # 4 clients: threshold 3
N, HIDDEN, BATCHES, LEVELS = 4, 16, 4, 2
KEYS = ("train_loss", "val_accuracy", "val_loss", "test_accuracy", "test_loss")


def glasu(privacy: dict | None = None, rounds: int = 2, batches: int = BATCHES, **extra) -> dict:
    return merge(merge(TINY, {"partition": {"num_clients": N}, "model": {"hidden": HIDDEN}, "train": {"rounds": rounds},
                              "protocol": {"name": "glasu", "K": LEVELS, "batches": batches, "S": 8},
                              "privacy": privacy or {}}), extra)


def execute(cfg: dict, folder, absent: dict[int, set[str]] | None = None) -> Run:
    """Run ``cfg``; ``absent``: the clients whose upload to aggregation number k never arrives."""
    job = Run(build_config(cfg), folder)
    if absent is not None:
        job.protocol.absent = lambda k, step: absent.get(k, set()) if step == "input" else set()
    job.result = job.execute(progress=False)
    return job


def same_metrics(a: Run, b: Run) -> None:
    assert len(a.result.metrics) == len(b.result.metrics)
    for x, y in zip(a.result.metrics, b.result.metrics):
        for key in KEYS:
            assert y[key] == pytest.approx(x[key], abs=1e-5), (key, x["round"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("glasu")
    return {"plain": execute(glasu(), folder / "plain"), "secure": execute(glasu(SECURE), folder / "secure")}


def round_bytes(job: Run, r: int, method: str | None = None, direction: str | None = None) -> int:
    """Training bytes of round ``r`` (evaluation apart), of one method and direction if given."""
    return sum(row["bytes"] for row in job.transport.ledger.rows() if row["round"] == r and row["kind"] != "eval"
               and method in (None, row["method"]) and direction in (None, row["direction"]))


# ---- the same training --------------------------------------------------------------------------------
def test_secure_glasu_ends_where_plain_glasu_ends(runs):
    plain, secure = runs["plain"], runs["secure"]
    same_metrics(plain, secure)
    rows = secure.transport.ledger.rows()
    assert not [r for r in rows if r["round"] == 0]  # identities pinned as the clients are made: no table relayed
    assert round_bytes(secure, 1, "forward", "up") == 0  # no representation leaves a client but masked
    assert secure.protocol.sums == 2 * (BATCHES + 1) * LEVELS  # a sum per level, mini-batch and inference


def test_the_ledger_counts_what_docs_privacy_states(runs):
    """Per training round: the secure sums move n (8 D + 618 n - 80) bytes for a mean of D values
    (the FedAvg count), and the upward H_m^+ (n 4 D in the clear) no longer travels in ``forward``."""
    plain, secure = runs["plain"], runs["secure"]
    sums = BATCHES * LEVELS
    for r in (1, 2):
        values = HIDDEN * secure.result.metrics[r - 1]["embedding_rows"]  # D summed over the round's means
        assert values == HIDDEN * plain.result.metrics[r - 1]["embedding_rows"]
        secagg = sum(round_bytes(secure, r, m) for m in {row["method"] for row in secure.transport.ledger.rows()}
                     if m.startswith("secagg_"))
        assert secagg == N * (8 * values + (618 * N - 80) * sums)
        assert round_bytes(secure, r) - round_bytes(plain, r) == N * (4 * values + (618 * N - 80) * sums)
    example = (secure.result.metrics[0]["embedding_rows"], round_bytes(plain, 1), round_bytes(secure, 1))
    assert example == (253, 141_856, 283_168)  # the example in docs/privacy.md


def test_settings_secure_aggregation_cannot_protect_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="aggregation mean and backward local"):
        Run(build_config(glasu(SECURE, protocol={"aggregation": "concat"})), tmp_path / "concat")
    with pytest.raises(ConfigError, match="glasu: privacy.secure_aggregation needs at least 3 clients"):
        Run(build_config(glasu(SECURE, partition={"num_clients": 2})), tmp_path / "two")
    with pytest.raises(ConfigError, match="threshold 2 for 4 clients"):
        Run(build_config(glasu({"secure_aggregation": {"threshold": 2}})), tmp_path / "half")


def test_a_client_made_as_before_privacy_reached_glasu_clients_is_refused(tmp_path, monkeypatch):
    """An older shard kept the privacy switches in the client's options: made from it, a client would
    silently drop DP, so it is refused in one line."""
    made: list[dict] = []
    spawn = Transport.spawn
    monkeypatch.setattr(Transport, "spawn", lambda self, cls, configs: made.extend(configs) or spawn(self, cls, configs))
    Run(build_config(glasu(rounds=1)), tmp_path / "run")
    old = {key: value for key, value in made[0].items() if key != "privacy"}
    GlasuClient(**old)  # a plain client's shard still loads
    old["opts"] = {**old["opts"], "dp": DPConfig(noise_multiplier=1.0, max_norm=1.0)}
    with pytest.raises(ConfigError) as err:
        GlasuClient(**old)
    assert "client0: its shard holds privacy settings" in one_line(err) and "partition again" in one_line(err)


# ---- clients lost in a sum ----------------------------------------------------------------------------
def fails_in(monkeypatch, client: int, at: int) -> None:
    """Client ``client``'s party dies while it sends its masked input to secure sum ``at``."""
    send = GlasuClient.secagg_input

    @rpc(label="control", senders="control", sealed="control", returns="embedding")
    def dying(self, label: int, senders, sealed):
        if (self.index, label) == (client, at):
            raise PartyFailure([self.name])
        return send(self, label, senders, sealed)

    monkeypatch.setattr(GlasuClient, "secagg_input", dying)


def test_a_client_lost_in_a_sum_leaves_the_mean_of_the_others(runs, tmp_path, monkeypatch):
    """Client 3's party fails in the third secure sum (round 1, second mini-batch, first level): the
    run goes on over the three others, as the plain run whose server gets no upload from client 3
    there; both means are divided by the three that remain."""
    plain = execute(glasu(), tmp_path / "plain", absent={3: {"client3"}})
    fails_in(monkeypatch, 3, 3)
    secure = execute(glasu(SECURE), tmp_path / "secure")
    assert plain.protocol.lost == secure.protocol.lost == ("client3",)
    same_metrics(plain, secure)
    # the comparison can tell: without the loss round 1 ends elsewhere
    assert runs["plain"].result.metrics[0]["train_loss"] != pytest.approx(plain.result.metrics[0]["train_loss"],
                                                                          abs=1e-5)
    later = [row for row in secure.transport.ledger.rows() if row["round"] == 2]
    assert later and "client3" not in {row["src"] for row in later} | {row["dst"] for row in later}


def test_fewer_clients_than_the_threshold_or_than_three_stop_the_run_in_one_line(tmp_path):
    with pytest.raises(RunFailed) as err:
        execute(glasu(SECURE, rounds=1), tmp_path / "two", absent={3: {"client1", "client3"}})
    assert "2 of 4 clients left at the input step, fewer than the threshold 3" in one_line(err)
    # three clients, threshold 2: the sum that loses one completes, but no later sum could run
    with pytest.raises(RunFailed) as err:
        execute(glasu(SECURE, rounds=1, partition={"num_clients": 3}), tmp_path / "three", absent={3: {"client2"}})
    assert "glasu lost client2: 2 clients remain, a secure sum needs 3" in one_line(err)


# ---- labels across a resume ---------------------------------------------------------------------------
def test_a_resumed_run_goes_on_with_new_labels_writes_no_key_and_ends_where_the_whole_run_ends(runs, tmp_path):
    cut = glasu(SECURE, checkpoint_every=1)
    first = execute(merge(cut, {"train": {"rounds": 1}}), tmp_path / "cut")
    job = Run(build_config(cut), tmp_path / "cut")
    assert job.resume() and job.protocol.sums == (BATCHES + 1) * LEVELS
    labels: list[int] = []
    job.transport.observers.append(lambda r, src, dst, method, payload, evaluating: labels.append(payload["label"])
                                   if method == "secagg_advertise" and src == "server" else None)
    job.result = job.execute(progress=False)
    assert min(labels) == (BATCHES + 1) * LEVELS + 1 and max(labels) == job.protocol.sums
    assert [r["train_loss"] for r in job.result.metrics] == [r["train_loss"] for r in runs["secure"].result.metrics]
    keys = [party.secagg.identity.private for j in (first, job) for party in j.transport._parties.values()]
    assert len(set(keys)) == 2 * N and files_holding(tmp_path / "cut", keys) == []  # no identity key written


def test_a_retry_from_the_checkpoint_never_asks_for_a_label_again(tmp_path):
    """``on_client_failure: retry`` reloads the checkpoint into the live server and parties, whose
    secure-sum labels since then stay used: the next sums take new labels, and the round trains."""
    job = execute(glasu(SECURE, rounds=1, batches=1, checkpoint_every=1), tmp_path / "run")
    job.protocol.train_round(2)  # the round the failure interrupts: its labels are used
    used = job.protocol.sums
    assert job.resume() and job.protocol.sums == used
    job.protocol.train_round(2)
    assert job.protocol.sums == used + LEVELS


# ---- what the server holds of one client's H_m^+ --------------------------------------------------------
def first_sum(folder, monkeypatch) -> tuple[dict, torch.Tensor]:
    """Every message of the run's first secure sum, by (sender, receiver, method), as the server
    handles them, and client 0's input to it (its encoded H_m^+)."""
    inputs = []
    send = GlasuClient._send

    def kept(self, h):
        out = send(self, h)
        if self.index == 0:
            inputs.append(self.secure_value.clone())
        return out

    monkeypatch.setattr(GlasuClient, "_send", kept)
    job = Run(build_config(glasu(SECURE, rounds=1, batches=1)), folder)
    seen: dict = {}
    job.transport.observers.append(lambda r, src, dst, method, payload, evaluating:
                                   seen.setdefault((src, dst, method), payload))
    job.protocol.train_round(1)
    return seen, inputs[0]


def server_attack(seen: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Client 0's masked input, and that input less the self-mask the server rebuilds from the
    shares revealed to it: all that stands between it and H_0^+ are the pairwise masks."""
    survived = seen[("server", "client0", "secagg_reveal")]["survived"].tolist()
    revealers = [name for (src, dst, method) in seen if method == "secagg_reveal" and dst == "server"
                 for name in [src]][:3]
    ids = [int(name.removeprefix("client")) + 1 for name in revealers]
    rows = [[shamir.from_bytes(bonawitz.as_bytes(seen[(name, "server", "secagg_reveal")][survived.index(0)]))]
            for name in revealers]
    seed = shamir.reconstruct(ids, rows)[0]
    masked = seen[("client0", "server", "secagg_input")]
    return masked, masked - bonawitz.self_mask(seed, masked.numel(), 1).view(masked.shape)


def test_every_message_of_a_sum_leaves_one_clients_representation_hidden(tmp_path, monkeypatch, repeatable_keys):
    """Keys and self-mask seeds from fixed sequences, so the statistical verdicts repeat."""
    draws = iter(range(1, 10**6))
    monkeypatch.setattr(bonawitz.secrets, "token_bytes", lambda n: next(draws).to_bytes(n, "big"))
    seen, encoded = first_sum(tmp_path / "masked", monkeypatch)
    masked, attempt = server_attack(seen)
    assert masked.shape == encoded.shape and masked.dtype == torch.int64
    for sent in (masked, attempt):  # uniform over the ring, unlike the encoded representation
        assert stats.chisquare(np.bincount(top_bits(sent), minlength=16)).pvalue > 1e-6
        assert bool((sent != encoded).float().mean() > 0.99)
    assert stats.chisquare(np.bincount(top_bits(encoded), minlength=16)).pvalue < 1e-12
    # the attack is sound: without the pairwise masks the same messages give H_0^+ exactly
    monkeypatch.setattr(bonawitz, "pair_mask", lambda secret, size, label: torch.zeros(size, dtype=torch.int64))
    seen, encoded = first_sum(tmp_path / "unmasked", monkeypatch)
    assert torch.equal(server_attack(seen)[1], encoded)
