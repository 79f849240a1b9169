"""The threat model of docs/privacy.md, cell by cell, for the observers the server's own tests leave out:
another client (what a party receives about the others' data) and an outsider (who reads every payload
that crosses between parties, as the ledger counts it, without any key or the config). Each test
attacks a claim of the table and fails when the protection it names is switched off."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from fedgl.comm.ledger import SERVER
from fedgl.config import build_config
from fedgl.privacy import bonawitz
from fedgl.privacy.attacks import FixedPointCheck, least_squares_rows, recovered_rows
from fedgl.protocols.horizontal.client import CrossClient
from fedgl.protocols.horizontal.routing import OWN
from fedgl.runner import Run
from support.configs import TINY, fedaas, merge, tiny
from support.masks import top_bits
from support.wire import flat, messages, tap
from support.noise import gaussian_noise

SECURE = {"privacy": {"secure_aggregation": True}}
FEDAVG = tiny("fedavg", protocol={"client_fraction": 1.0}, train={"rounds": 2})


def dp(noise_multiplier: float, max_norm: float) -> dict:
    pytest.importorskip("dp_accounting")
    return {"privacy": {"dp": {"noise_multiplier": noise_multiplier, "max_norm": max_norm}}}


def glasu(clients: int, **extra) -> dict:
    """GLASU with every client holding labels, two aggregation levels and one mini-batch a round."""
    return merge(merge(TINY, {"partition": {"num_clients": clients}, "train": {"rounds": 1},
                              "protocol": {"name": "glasu", "K": 2, "batches": 1, "S": 8}}), extra)


SIGMA, BOUND = 1e3, 1e-4  # noise of std SIGMA x BOUND dwarfs every clipped value (norm at most BOUND)


def observed(cfg: dict, folder, rounds: int | None = None):
    """Run ``cfg`` whole (``rounds`` None, scoring included) or its first ``rounds`` rounds only, with
    an outsider on the wire."""
    job = Run(build_config(cfg), folder)
    wire = tap(job)
    if rounds is None:
        job.result = job.execute(progress=False)
    else:
        job.protocol.start()
        for r in range(1, rounds + 1):
            job.transport.set_round(r)
            job.protocol.train_round(r)
    return job, wire


def twin_noise(cfg: dict, folder, read, rounds: int | None = 1) -> torch.Tensor:
    """``read(wire)`` of a DP run of ``cfg`` less the same of a twin run with negligible noise (the same
    training draws and clipping): the noise the DP run added to what ``read`` takes off the wire."""
    noisy, quiet = (read(observed(merge(cfg, dp(s, BOUND)), folder / name, rounds)[1]).double()
                    for name, s in (("noisy", SIGMA), ("quiet", 1e-9)))
    return noisy - quiet


# ---- another client: FedAvg --------------------------------------------------------------------------
def weighted_average(uploads) -> torch.Tensor:
    weights = torch.tensor([float(m.values[("num_train",)]) for m in uploads], dtype=torch.float64)
    return sum(w * flat(m, "state") for w, m in zip(weights, uploads)) / weights.sum()





def test_a_fedavg_client_receives_the_weighted_average_and_no_other_clients_update(tmp_path):
    """Plain: client0 receives only ``train`` calls, whose model is the training-node weighted average
    of the last round's uploads, none of them alone. Secure aggregation: the same average, and nothing
    else it receives is large enough to hold another client's (masked) update."""
    _, plain = observed(FEDAVG, tmp_path / "plain")
    uploads = [m for m in messages(plain, method="train") if m.sender != SERVER and m.round == 1]
    average = weighted_average(uploads)
    assert {m.method for m in messages(plain, receiver="client0", scoring=True)} == {"train"}
    given = [flat(m, "state") for m in messages(plain, receiver="client0")]
    assert len(given) == 2 and torch.allclose(given[1], average, atol=1e-6)
    assert all(float((given[1] - flat(m, "state")).abs().max()) > 1e-3 for m in uploads)

    _, secure = observed(merge(FEDAVG, SECURE), tmp_path / "secure", rounds=2)
    received = messages(secure, receiver="client0")
    models = [flat(m, "state") for m in received if m.method == "train"]
    assert len(models) == 2 and torch.allclose(models[1], average, atol=1e-5)
    rest = [t.numel() for m in received if m.method != "train" for t in m.tensors.values()]
    assert rest and max(rest) < average.numel() // 4  # keys, sealed shares, lists of ids


def test_under_dp_the_average_a_fedavg_client_receives_is_of_noised_updates(tmp_path):
    """Round 2's model is the weighted average of round 1's noised uploads: against a twin run with
    negligible noise (the same training draws), it differs by the averaged noise, of std
    sigma C sqrt(sum w^2) / sum w per coordinate."""
    weights = []

    def given(wire) -> torch.Tensor:
        uploads = [m for m in messages(wire, method="train") if m.sender != SERVER and m.round == 1]
        weights.append(torch.tensor([float(m.values[("num_train",)]) for m in uploads], dtype=torch.float64))
        model = flat(messages(wire, receiver="client0", method="train")[1], "state")
        assert torch.allclose(model, weighted_average(uploads), atol=1e-6)
        return model

    noise = twin_noise(FEDAVG, tmp_path, given, rounds=2)
    w = weights[0]
    assert noise.numel() > 1000
    gaussian_noise(noise, SIGMA * BOUND * float(w.norm() / w.sum()))


# ---- another client: GLASU ---------------------------------------------------------------------------
def glasu_views(wire, client: str) -> list[tuple[torch.Tensor | None, torch.Tensor]]:
    """(what ``client`` sent, None under secure aggregation; the aggregate it got back) per aggregation
    level, training only."""
    sent = [flat(m) if m.tensors else None for m in messages(wire, sender=client, method="forward")]
    back = [flat(m, "h") for m in messages(wire, receiver=client) if m.method in ("forward", "local_update")
            and m.under("h")]
    return list(zip(sent, back))


def test_a_glasu_client_subtracts_its_share_and_holds_the_others_representations(tmp_path):
    """n H - H_0^+ at each level: with two clients the other's H_1^+ exactly, with three the sum of
    the other two; under secure aggregation client0 gets the same aggregates (masks only hide the
    uploads from the server)."""
    _, two = observed(glasu(2), tmp_path / "two", rounds=1)
    other = [flat(m) for m in messages(two, sender="client1", method="forward")]
    views = glasu_views(two, "client0")
    assert len(views) == 2
    for (own, h), theirs in zip(views, other):
        assert torch.allclose(2 * h - own, theirs, atol=1e-5)
    _, three = observed(glasu(3), tmp_path / "three", rounds=1)
    others = [flat(a) + flat(b) for a, b in zip(*(messages(three, sender=c, method="forward")
                                                  for c in ("client1", "client2")))]
    plain = glasu_views(three, "client0")
    for (own, h), theirs in zip(plain, others):
        assert torch.allclose(3 * h - own, theirs, atol=1e-5)
    _, secure = observed(merge(glasu(3), SECURE), tmp_path / "secure", rounds=1)
    received = glasu_views(secure, "client0")
    assert len(received) == 2
    for (_, h), (nothing, got) in zip(plain, received):
        assert nothing is None and torch.allclose(got, h, atol=1e-5)


def test_under_dp_what_a_glasu_client_extracts_is_the_others_rows_plus_noise(tmp_path):
    """Two clients: 2 H - H_0^+ is client1's released rows; against a twin run with negligible noise
    it differs at the first level by noise of std sigma C."""
    def extracted(wire) -> torch.Tensor:
        own, h = glasu_views(wire, "client0")[0]
        theirs = flat(messages(wire, sender="client1", method="forward")[0])
        assert torch.allclose(2 * h - own, theirs, atol=1e-5)
        return 2 * h - own

    noise = twin_noise(glasu(2), tmp_path, extracted)
    assert noise.numel() > 500
    gaussian_noise(noise, SIGMA * BOUND)


# ---- another client: the Swift family ----------------------------------------------------------------
SWIFT = tiny("fedgnn-g", protocol={"fanouts": [4, 4]}, train={"rounds": 1})


@pytest.fixture
def trainer_sums(monkeypatch) -> list[tuple[str, int, torch.Tensor, torch.Tensor]]:
    """(trainer, layer, sums, counts) of every cross-owner sum a trainer takes for its own batch,
    as it holds them (decoded, the masks removed, under secure aggregation)."""
    kept: list[tuple[str, int, torch.Tensor, torch.Tensor]] = []
    store = CrossClient._store

    def keep(self, layer, remote, counts, unmask=None):
        store(self, layer, remote, counts, unmask)
        if OWN in remote:
            plan = self.plans[OWN]
            kept.append((self.name, layer, plan.remote_sum[layer].detach().clone(), plan.remote_count[layer].clone()))

    monkeypatch.setattr(CrossClient, "_store", keep)
    return kept


def swift_sums(cfg: dict, folder, kept: list) -> tuple[list, list]:
    """The first round's wire and the trainers' sums (in the order they took them)."""
    kept.clear()
    _, wire = observed(cfg, folder, rounds=1)
    return wire, list(kept)


def first_layer_sums(kept: list) -> torch.Tensor:
    """The input-layer sums the trainers took so far (each DP twin run clears ``kept`` first)."""
    out = torch.cat([t for _, layer, t, _ in kept if layer == 1])
    kept.clear()
    return out


def test_a_swift_trainer_receives_per_target_sums_of_at_least_min_aggregate_rows(tmp_path, trainer_sums):
    """A trainer gets one sum per target over every owner's sampled rows, each input-layer sum of at
    least ``min_aggregate`` (2) rows; under secure aggregation the wire carries them masked (int64)
    and the trainer, removing the masks, holds the same sums."""
    wire, plain = swift_sums(SWIFT, tmp_path / "plain", trainer_sums)
    first = [(sums, counts) for _, layer, sums, counts in plain if layer == 1]
    assert first and all(sums.size(0) == counts.numel() and bool((counts >= 2).all()) for sums, counts in first)
    down = [m.under("remote", OWN)[()] for m in messages(wire, sender=SERVER) if m.method in ("propagate", "finish")
            and m.under("remote", OWN)]
    assert len(down) == len(plain) and all(torch.equal(d, s) for d, (_, _, s, _) in zip(down, plain))
    wire, secure = swift_sums(merge(SWIFT, SECURE), tmp_path / "secure", trainer_sums)
    assert [(n, layer) for n, layer, _, _ in secure] == [(n, layer) for n, layer, _, _ in plain]
    for (_, _, sums, counts), (_, _, got, got_counts) in zip(plain, secure):
        assert torch.equal(counts, got_counts) and torch.allclose(got, sums, atol=1e-5)
    masked = [t for m in messages(wire, sender=SERVER, method="propagate") for t in m.under("remote").values()]
    assert masked and all(t.dtype == torch.int64 for t in masked)


def test_under_dp_a_swift_trainer_receives_noised_sums(tmp_path, trainer_sums):
    """Against a twin run with negligible noise, a trainer's first input-layer sums differ by the
    noise of the one to two remote owners summed into each target: std between sigma C and
    sigma C sqrt(2)."""
    noise = twin_noise(SWIFT, tmp_path, lambda wire: first_layer_sums(trainer_sums))
    assert noise.numel() > 200 and 0.9 * SIGMA * BOUND < float(noise.std()) < 1.1 * 2**0.5 * SIGMA * BOUND


def trainer_equations(wire, kept: list, trainer: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What ``trainer`` can write down from its own messages: (sum of each pick, node of each pick, the
    sums), one sum per target whose every input-layer pick it sampled is inside (the count it received
    equals its picks there); other sums read NaN. The sums as the trainer holds them (``kept``)."""
    picks = messages(wire, sender=trainer, method="route")
    counts = [m.tensors[("counts", OWN)] for m in messages(wire, receiver=trainer, method="propagate")
              if m.values.get(("layer",)) == 2]
    held = [t for name, layer, t, _ in kept if (name, layer) == (trainer, 1)]
    pick_sum, pick_node, values, first = [], [], [], 0
    for pick, count, rows in zip(picks, counts, held, strict=True):
        targets, pos = torch.unique(pick.tensors[(OWN, "targets")], return_inverse=True)
        whole = (count > 0) & (count == torch.bincount(pos, minlength=targets.numel()))
        keep = whole[pos]
        pick_sum.append(first + (torch.cumsum(count > 0, 0) - 1)[pos[keep]])
        pick_node.append(pick.tensors[(OWN, "ids")][keep])
        values.append(torch.where(whole[count > 0].unsqueeze(1), rows.double(), float("nan")))
        first += rows.size(0)
    return torch.cat(pick_sum), torch.cat(pick_node), torch.cat(values)


@pytest.mark.parametrize("dropout, privacy", [(0.0, {}), (0.0, SECURE), (0.5, {})], ids=["plain", "secure", "dropout"])
def test_a_swift_trainer_solves_its_sums_for_remote_rows_unless_dropout_masks_them(tmp_path, trainer_sums, dropout,
                                                                                 privacy):
    """Each trainer solves the input-layer sums of its own targets over six rounds by least squares
    (the audit's attack): without dropout it recovers every remote raw row the system pins down, and
    secure aggregation, whose masks the trainer removes, changes nothing; dropout 0.5, fresh in every
    sum, leaves none."""
    cfg = merge(merge(SWIFT, privacy), {"model": {"dropout": dropout}})
    kept = trainer_sums
    job, wire = observed(cfg, tmp_path, rounds=6)
    x = job.evaluator.data.x
    determined = recovered = 0
    for trainer in job.protocol.clients:
        nodes, estimate, pinned = least_squares_rows(*trainer_equations(wire, kept, trainer))
        assert bool((job.protocol.router.owner[nodes] != job.protocol.clients.index(trainer)).all())
        determined += int(pinned.sum())
        recovered += int(recovered_rows(estimate, x[nodes]).sum())
    assert determined > 20
    assert recovered == (determined if dropout == 0 else 0)


# ---- another client: FedAAS ---------------------------------------------------------------------------
FEDAAS = fedaas({"interval": 1}, rounds=1)


def test_a_fedaas_trainer_receives_merged_partials_and_each_picks_key(tmp_path):
    """At a sync step a trainer gets one merged partial per target with remote picks (log-sum-exp
    over the owners) and, one per pick, the key scalar its owner served; under secure aggregation the
    partials and keys cross as they are (only model uploads are masked)."""
    job, wire = observed(FEDAAS, tmp_path / "plain", rounds=1)
    owner = job.protocol.router.owner
    asked = messages(wire, sender="client0", method="request")
    got = messages(wire, receiver="client0", method="finish")
    checked = 0
    for request, reply in zip(asked, got):
        if not request.tensors or not reply.under("remote"):
            continue
        ids, targets = request.tensors[("ids",)], request.tensors[("targets",)]
        assert reply.tensors[("remote", "num")].size(0) == torch.unique(targets).numel()
        keys = reply.tensors[("remote", "keys")]
        assert keys.numel() == ids.numel()
        checked += 1
    assert checked == len(got) > 0
    request, reply = asked[-1], got[-1]  # the last sync: its owners' replies lie between the two
    served = [m for m in messages(wire, method="serve") if m.sender != SERVER and request.seq < m.seq < reply.seq
              and ("keys", "client0") in m.tensors]
    assert served
    for m in served:
        mine = owner[request.tensors[("ids",)]] == job.protocol.clients.index(m.sender)
        assert torch.equal(reply.tensors[("remote", "keys")][mine], m.tensors[("keys", "client0")])
    _, secure = observed(merge(FEDAAS, SECURE), tmp_path / "secure", rounds=1)
    plain_partials = [m for m in messages(wire, method="serve") if m.sender != SERVER]
    secure_partials = [m for m in messages(secure, method="serve") if m.sender != SERVER]
    assert len(plain_partials) == len(secure_partials)
    for a, b in zip(plain_partials[:3], secure_partials[:3]):  # the first sync: both runs alike so far
        assert a.tensors.keys() == b.tensors.keys() and any(t.is_floating_point() for t in b.tensors.values())
        assert all(torch.equal(a.tensors[k], t) for k, t in b.tensors.items())


def test_a_fedaas_owner_learns_which_of_its_nodes_each_named_trainer_picked(tmp_path):
    """Unlike the Swift family's handles, FedAAS's requests reach an owner under the trainer's name,
    with the local index of every picked node and each target's query."""
    job, wire = observed(FEDAAS, tmp_path / "run", rounds=1)
    sizes = torch.bincount(job.protocol.router.owner, minlength=3)
    names = set(job.protocol.clients)
    calls = [m for m in messages(wire, sender=SERVER, method="serve")]
    assert calls
    for m in calls:
        trainers = {path[1] for path in m.tensors if path[0] == "incoming"}
        assert trainers and trainers <= names - {m.receiver}
        for trainer in trainers:
            u = m.tensors[("incoming", trainer, "u")]
            assert int(u.max()) < int(sizes[job.protocol.clients.index(m.receiver)])
            assert m.tensors[("query", trainer)].is_floating_point()


# ---- another client: nFedGNN -------------------------------------------------------------------------
def test_a_nfedgnn_users_gradient_carries_its_neighbours_latents(tmp_path):
    """The gradient a user receives is the cross-entropy's (a twin run with lam 0, the same latents)
    plus the regulariser's, (2 lam / E) x the sum over every edge at the user of z_i - z_j: a function
    of its neighbours' latents (E: the edge entries, self loops included)."""
    wires = {lam: observed(tiny("nfedgnn", protocol={"lam": lam}, train={"rounds": 1}), tmp_path / str(lam), 1)
             for lam in (15.0, 0.0)}
    job, wire = wires[15.0]
    z = messages(wire, sender="users", method="embed")[0].tensors[()]
    assert torch.equal(z, messages(wires[0.0][1], sender="users", method="embed")[0].tensors[()])
    term = [messages(w, receiver="users", method="update")[0].tensors[("grad",)] for _, w in wires.values()]
    graph = job.protocol.graph
    diff = z[graph.src] - z[graph.dst]
    expected = torch.zeros_like(z).index_add_(0, graph.src, diff).index_add_(0, graph.dst, -diff)
    assert torch.allclose(term[0] - term[1], expected * (2 * job.protocol.lam / graph.src.numel()), atol=1e-5)
    assert float((term[0] - term[1]).abs().max()) > 1e-2


# ---- another client: CNFGNN ---------------------------------------------------------------------------
CNFGNN = {"dataset": {"options": {"num_nodes": 200}}, "train": {"rounds": 1, "lr": 0.01},
          "network": {"compute": "ignore"}, "protocol": {"name": "cnfgnn"}}


def test_every_cnfgnn_user_receives_the_average_of_all_uploads(tmp_path):
    """The broadcast's rows are one weight, the mean of every user's upload; under DP the mean of the
    noised uploads, which differs from a twin run's with negligible noise by noise of std
    sigma C / sqrt(users)."""
    _, wire = observed(CNFGNN, tmp_path / "plain", rounds=1)
    upload = messages(wire, sender="users", method="upload")[0].tensors[()]
    broadcast = messages(wire, receiver="users", method="receive")[0].tensors[("model",)]
    assert broadcast.shape == upload.shape and bool((broadcast == broadcast[0]).all())
    assert torch.allclose(broadcast[0], upload.mean(0), atol=1e-6)
    def shared(wire) -> torch.Tensor:
        upload = messages(wire, sender="users", method="upload")[0].tensors[()]
        weight = messages(wire, receiver="users", method="receive")[0].tensors[("model",)][0]
        assert torch.allclose(weight, upload.mean(0), atol=1e-5)
        return weight

    noise = twin_noise(CNFGNN, tmp_path, shared)
    gaussian_noise(noise, SIGMA * BOUND / upload.size(0)**0.5)


# ---- the outsider -------------------------------------------------------------------------------------
WIRE = {"fedavg": FEDAVG, "glasu": glasu(3), "swift": SWIFT, "fedaas": FEDAAS,
        "nfedgnn": tiny("nfedgnn", protocol={"lam": 1.0}, train={"rounds": 1}), "cnfgnn": CNFGNN}


@pytest.mark.parametrize("name", list(WIRE))
def test_an_outsider_reads_every_payload_the_ledger_counts_and_the_servers_whole_view(tmp_path, name):
    """Every message, scoring included (GLASU, nFedGNN and CNFGNN score through their parties), has the
    server at one end, and the payloads an outsider reads add up to the ledger's bytes: without secure
    aggregation or DP it reads what the server reads."""
    job, wire = observed(merge(WIRE[name], {"train": {"rounds": 1}}), tmp_path)
    assert all(SERVER in (c.message.sender, c.message.receiver) for c in wire)
    assert any(c.evaluating for c in wire) == (name in ("glasu", "nfedgnn", "cnfgnn"))
    assert sum(c.bytes for c in wire) == job.transport.ledger.total(include_eval=True) > 0


# What crosses as floating point under secure aggregation: the uploads that may (GLASU's scoring
# clients' logits at each evaluation, left in the clear by secure aggregation and noised by DP:
# test_under_dp_an_outsider_reads_glasu_scores_plus_noise_of_the_configured_scale; FedAAS's queries,
# partials and keys) and what the server sends back.
CLEAR_UP = {"fedavg": set(), "glasu": {"infer"}, "swift": set(), "fedaas": {"request", "serve"}}
CLEAR_DOWN = {"fedavg": {"train"}, "glasu": {"forward", "local_update", "infer"}, "swift": {"begin"},
              "fedaas": {"start", "serve", "finish"}}


@pytest.mark.parametrize("name", list(CLEAR_UP))
def test_under_secure_aggregation_an_outsider_reads_masked_uploads_and_the_aggregates(tmp_path, name,
                                                                                      repeatable_keys, monkeypatch):
    """Keys and self-mask seeds from fixed sequences, so the verdict repeats. Every fixed-point payload
    a client sends is masked (the audit's check) and, taken together, uniform over the ring; the only
    client values in floating point are those named above."""
    draws = iter(range(1, 10**6))
    monkeypatch.setattr(bonawitz.secrets, "token_bytes", lambda n: next(draws).to_bytes(n, "big"))
    _, wire = observed(merge(WIRE[name], {**SECURE, "train": {"rounds": 1}}), tmp_path)
    up = [c.message for c in wire if c.message.sender != SERVER]
    floats = {m.method for m in up for t in m.tensors.values() if t.is_floating_point()}
    assert floats == CLEAR_UP[name]
    down = {c.message.method for c in wire if c.message.sender == SERVER
            and any(t.is_floating_point() for t in c.message.tensors.values())}
    assert down == CLEAR_DOWN[name]
    check = FixedPointCheck()
    for m in up:
        check.add(m)
    assert check.seen >= 3 and not check.readable
    masked = torch.cat([t.flatten() for m in up for t in m.tensors.values()
                        if t.dtype == torch.int64 and int(t.abs().max()) >= 2**24])
    assert masked.numel() > 1000 and stats.chisquare(np.bincount(top_bits(masked), minlength=16)).pvalue > 1e-6


# The first payload of each protocol a client's DP release shapes: (sender, method, path inside it).
RELEASED = {"fedavg": ("client0", "train", ("state",)), "glasu": ("client0", "forward", ()),
            "swift": ("client0", "propagate", ("sums",)), "fedaas": ("client0", "upload", ("state",)),
            "nfedgnn": ("users", "embed", ()), "cnfgnn": ("users", "upload", ())}


@pytest.mark.parametrize("name", list(RELEASED))
def test_under_dp_an_outsider_reads_each_release_plus_noise_of_the_configured_scale(tmp_path, name):
    """Against a twin run with negligible noise (the same training draws, the same clipping), the
    first release on the wire differs by noise of mean 0 and std sigma C per coordinate: an outsider
    reads only noised values."""
    sender, method, path = RELEASED[name]
    noise = twin_noise(WIRE[name], tmp_path, lambda wire: next(
        flat(m, *path) for m in messages(wire, sender=sender, method=method) if m.under(*path)))
    assert noise.numel() > 500
    gaussian_noise(noise, SIGMA * BOUND)


def test_under_dp_an_outsider_reads_glasu_scores_plus_noise_of_the_configured_scale(tmp_path):
    """Scoring included (the whole run): every logit row a GLASU client sends at evaluation differs
    from a twin run's with negligible noise by noise of std sigma C per coordinate, as its
    representations do (tests/test_glasu_eval_privacy.py attacks the scores as the server)."""
    def scores(wire) -> torch.Tensor:
        sent = [flat(m, "logits") for m in messages(wire, method="infer", scoring=True)
                if m.sender != SERVER and m.under("logits")]
        assert len(sent) == 3  # every client holds labels, so every client scores
        return torch.cat(sent)

    noise = twin_noise(WIRE["glasu"], tmp_path, scores, rounds=None)
    assert noise.numel() > 500
    gaussian_noise(noise, SIGMA * BOUND)
