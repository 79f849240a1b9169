"""Attacking a run's recorded messages (``privacy.record_messages``) as an honest-but-curious party.

The auditor re-reads the run's config and dataset (the ground truth no party holds) and measures,
for each attack, how many private rows it recovers from what crossed:

- ``raw_row_match``: a floating-point row of any message equal (``torch.allclose`` defaults) to a
  non-zero raw feature row of a party (a whole row, or a vertical client's feature block);
- ``reconstruction``: the server's least-squares solution for the rows inside the first-layer sums
  it routed (Swift-FedGNN family: it sent each owner the ids of every (target, owner) pair and
  received one sum per pair, so it knows each sum's members). A row counts as recovered when the
  estimate equals the true row, up to a positive scale (GCN owners scale rows by their degree
  factor before summing), within ``TOLERANCE`` of its largest entry;
- ``membership``: input-layer aggregates that hold a single raw row (count 1, or only one member
  whose feature support meets the sum's non-zeros: the others were dropped out), and FedAAS's
  per-pair partials covering one pick; hidden-layer sums of count 1 are reported beside them;
- ``labels``: messages of kind ``label`` and which nodes' labels reach a party not owning them.

The attacks' cores (``RowIndex.match``, ``least_squares_rows``, ``recovered_rows``,
``contributing_members``) work on plain tensors and are usable on their own; ``audit_command``
runs all four over a run folder and writes ``audit.json`` into it.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch
from torch import Tensor
from torch_geometric.data import Data

from ..comm.ledger import SERVER
from ..config import RunConfig, load_config
from ..errors import ConfigError
from .record import Message, message_files, read_messages

TOLERANCE = 1e-3  # reconstruction: max |estimate - c * truth| <= TOLERANCE * max |c * truth|
CHUNK = 4096  # candidate rows compared at once
REPORT = "audit.json"
# Protocols that send raw rows or labels by design, and why (named in the report when found).
BY_DESIGN = {"llcg": "by design: LLCG's server correction trains on the global graph (raw rows and the batch's "
                     "training labels go to the server)"}


@dataclass
class AttackResult:
    """What one attack recovered: ``recovered`` of ``attacked`` private rows (or aggregates, labels)."""

    attack: str
    attacked: int
    recovered: int
    notes: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def fraction(self) -> float | None:
        return self.recovered / self.attacked if self.attacked else None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"fraction": self.fraction}


# ---- (a) raw rows -------------------------------------------------------------------------------------
class RowIndex:
    """Raw rows prepared for ``match``: a candidate whose entry sum is farther from every row's sum
    than ``torch.isclose``'s tolerance allows cannot match and is skipped; for the others the
    nearest row in L2 is checked entry by entry."""

    def __init__(self, rows: Tensor):
        self.rows = rows.double()
        self.sums = self.rows.sum(1).sort().values
        self.slack = rows.size(1) * 1e-8 + 1e-5 * float(self.rows.abs().sum(1).max())  # isclose's atol, rtol
        self.norms = (self.rows * self.rows).sum(1)

    def match(self, candidates: Tensor) -> Tensor:
        """For each candidate row (dense ``[*, w]``), the index of a row it is allclose to, else -1."""
        out = torch.full((candidates.size(0),), -1, dtype=torch.long)
        c_sums = candidates.double().sum(1)
        near = torch.searchsorted(self.sums, c_sums + self.slack, right=True) > \
            torch.searchsorted(self.sums, c_sums - self.slack)
        which = near.nonzero().flatten()
        for start in range(0, which.numel(), CHUNK):
            idx = which[start:start + CHUNK]
            c = candidates[idx].double()
            nearest = (self.norms - 2 * c @ self.rows.T).argmin(1)
            out[idx] = torch.where(torch.isclose(c, self.rows[nearest]).all(1), nearest, -1)
        return out


def message_rows(t: Tensor, width: int) -> Tensor | None:
    """The non-zero rows of width ``width`` of a floating-point message tensor, or None."""
    if not t.is_floating_point() or t.dim() == 0 or t.size(-1) != width:
        return None
    rows = (t.to_dense() if t.layout != torch.strided else t).reshape(-1, width)
    return rows[(rows != 0).any(1)]


class RawRowMatch:
    """(a): every message row compared with the parties' non-zero raw rows, grouped by width."""

    def __init__(self, private: list[Tensor]):
        by_width: dict[int, list[Tensor]] = {}
        for rows in private:
            by_width.setdefault(rows.size(1), []).append(rows.float())
        rows = {w: torch.cat(parts) for w, parts in by_width.items()}
        self.index = {w: RowIndex(r) for w, r in rows.items()}
        self.nonzero = {w: (r != 0).any(1) for w, r in rows.items()}
        self.found = {w: torch.zeros(r.size(0), dtype=torch.bool) for w, r in rows.items()}
        self.hits: Counter[tuple[str, str, str]] = Counter()

    def add(self, msg: Message) -> None:
        for t in msg.tensors.values():
            for w, index in self.index.items():
                cand = message_rows(t, w)
                if cand is None or not cand.numel():
                    continue
                idx = index.match(cand)
                idx = idx[idx >= 0]
                idx = idx[self.nonzero[w][idx]]
                if idx.numel():
                    self.found[w][idx] = True
                    self.hits[(msg.sender, msg.receiver, msg.method)] += int(idx.numel())

    def result(self) -> AttackResult:
        attacked = sum(int(m.sum()) for m in self.nonzero.values())
        recovered = sum(int((f & self.nonzero[w]).sum()) for w, f in self.found.items())
        flows = [{"sender": s, "receiver": r, "method": m, "rows": n} for (s, r, m), n in sorted(self.hits.items())]
        relayed = sum(n for (s, _, _), n in self.hits.items() if s == SERVER)
        notes = ("no raw feature row in any message" if not flows else
                 "raw rows in " + ", ".join(f"{f['sender']}->{f['receiver']} {f['method']} ({f['rows']})"
                                            for f in flows) + (f"; {relayed} relayed by the server" if relayed else ""))
        return AttackResult("raw_row_match", attacked, recovered, notes, {"flows": flows})


# ---- the server's routed sums (Swift-FedGNN family) ---------------------------------------------------
@dataclass
class RoutedSums:
    """The sums the server routed: per sum sent (count > 0), its layer and row count; for the input
    layer, its members (``pick_sum`` -> ``pick_node``, global ids) and its value as the server read
    it (NaN rows: not readable, e.g. masked integers)."""

    layer: list[Tensor] = field(default_factory=list)
    count: list[Tensor] = field(default_factory=list)
    pick_sum: list[Tensor] = field(default_factory=list)
    pick_node: list[Tensor] = field(default_factory=list)
    values: list[Tensor] = field(default_factory=list)
    first: int = 0  # input-layer sums so far
    picks: dict[str, dict] = field(default_factory=dict)  # owner -> the input-layer picks routed to it

    def request(self, down: Message) -> None:
        """Keep the input-layer picks routed to an owner: the ``incoming`` of ``propagate`` at layer 1,
        or of the key request before it when the sums are masked (``request_keys``; ``propagate`` then
        carries none)."""
        incoming = down.under("incoming")
        first = down.method == "request_keys" or (down.method == "propagate" and down.values.get(("layer",)) == 1)
        if incoming and first:
            self.picks[down.receiver] = incoming

    def add(self, down: Message, up: Message, nodes: dict[str, Tensor]) -> None:
        """One owner's ``propagate`` call: the request and the reply (per request key, ``counts``
        per pair and ``sums`` of the pairs sent); at layer 1 the members of each pair are the picks
        ``u`` routed to the owner with their ``pair``."""
        layer = down.values.get(("layer",))
        counts, sums = up.under("counts"), up.under("sums")
        incoming = self.picks.get(up.sender, {}) if layer == 1 else {}
        for key, cnt in counts.items():
            sent = cnt > 0
            k = int(sent.sum())
            self.layer.append(torch.full((k,), int(layer or 0)))
            self.count.append(cnt[sent])
            if layer != 1:
                continue
            value = sums.get(key)
            readable = value is not None and value.is_floating_point() and value.dim() == 2
            if readable and value.size(0) in (k, cnt.numel()):
                value = value[sent] if value.size(0) != k else value
            else:
                value = None
            self.values.append(value.double() if value is not None else torch.full((k, 1), float("nan")))
            u, pair = incoming.get((*key, "u")), incoming.get((*key, "pair"))
            if u is not None and pair is not None and up.sender in nodes:
                keep = sent[pair]
                self.pick_sum.append(self.first + (torch.cumsum(sent, 0) - 1)[pair[keep]])
                self.pick_node.append(nodes[up.sender][u[keep]])
            self.first += k

    def first_layer(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """(pick_sum, pick_node, values) of the input-layer sums; values None when none is readable."""
        empty = torch.zeros(0, dtype=torch.long)
        if not self.values:
            return empty, empty, None
        width = max(v.size(1) for v in self.values)
        values = torch.cat([v if v.size(1) == width else v.expand(-1, width) for v in self.values])
        readable = ~values.isnan().any(1)
        picks = (torch.cat(self.pick_sum), torch.cat(self.pick_node)) if self.pick_sum else (empty, empty)
        return *picks, values if readable.any() else None


def least_squares_rows(pick_sum: Tensor, pick_node: Tensor, values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The minimum-norm least-squares solution X of A X = values, A[s, v] = 1 when node v is in sum s
    (rows of ``values`` holding NaN are left out). Returns (nodes, their estimated rows, whether each
    node's row is determined by the system, i.e. e_v lies in A's row space). Dense in the number n of
    rows inside the sums: an n x n eigendecomposition."""
    readable = ~values.isnan().any(1)
    keep = readable[pick_sum]
    sums = values[readable]
    row = (torch.cumsum(readable, 0) - 1)[pick_sum[keep]]
    nodes, col = torch.unique(pick_node[keep], return_inverse=True)
    a = torch.sparse_coo_tensor(torch.stack([row, col]), torch.ones(row.numel(), dtype=torch.float64),
                                (sums.size(0), nodes.numel()), check_invariants=False).coalesce()
    at = a.t().coalesce()
    gram = torch.sparse.mm(at, a).to_dense()
    rhs = torch.sparse.mm(at, sums)
    eigvals, eigvecs = torch.linalg.eigh(gram)
    kept = eigvals > eigvals.max().clamp_min(1.0) * 1e-10
    basis = eigvecs[:, kept]
    estimate = basis @ ((basis.T @ rhs) / eigvals[kept].unsqueeze(1))
    determined = (basis * basis).sum(1) > 1 - 1e-6
    return nodes, estimate, determined


def recovered_rows(estimate: Tensor, truth: Tensor, tol: float = TOLERANCE) -> Tensor:
    """Rows where ``estimate`` equals c * ``truth`` for some c > 0 within ``tol`` of the largest entry."""
    truth = truth.double()
    scale = (estimate * truth).sum(1) / (truth * truth).sum(1).clamp_min(1e-300)
    target = scale.unsqueeze(1) * truth
    error = (estimate - target).abs().amax(1)
    zero = ~(truth != 0).any(1)
    return torch.where(zero, estimate.abs().amax(1) <= tol, (scale > 0) & (error <= tol * target.abs().amax(1)))


def reconstruction(routed: RoutedSums, x: Tensor) -> AttackResult:
    """(b): solve the input-layer sums the server saw for the rows inside them."""
    pick_sum, pick_node, values = routed.first_layer()
    inside = int(torch.unique(pick_node).numel())
    if not inside:
        return AttackResult("reconstruction", 0, 0, "no input-layer sums with known members in the messages")
    if values is None:
        return AttackResult("reconstruction", inside, 0, f"{routed.first} sums routed, none readable by the server")
    nodes, estimate, determined = least_squares_rows(pick_sum, pick_node, values)
    ok = recovered_rows(estimate, x[nodes])
    readable = int((~values.isnan().any(1)).sum())
    return AttackResult("reconstruction", inside, int(ok.sum()),
                        f"least squares over {readable} readable sums of {routed.first}; recovered = within "
                        f"{TOLERANCE:g} of the true row (up to scale)",
                        {"sums": routed.first, "readable_sums": readable, "determined_rows": int(determined.sum()),
                         "tolerance": TOLERANCE})


# ---- (c) membership -----------------------------------------------------------------------------------
def contributing_members(pick_sum: Tensor, pick_node: Tensor, values: Tensor, x: Tensor) -> Tensor:
    """Per sum, the members whose non-zero features meet the sum's non-zeros (members dropped out
    entirely contribute nothing); an upper bound on the rows the sum really holds."""
    hits = torch.zeros(pick_sum.numel(), dtype=torch.bool)
    for start in range(0, pick_sum.numel(), CHUNK):
        s, v = pick_sum[start:start + CHUNK], pick_node[start:start + CHUNK]
        hits[start:start + CHUNK] = ((values[s] != 0) & (x[v] != 0)).any(1)
    return torch.bincount(pick_sum, weights=hits.double(), minlength=values.size(0))


def membership(routed: RoutedSums, served: list[Tensor], x: Tensor) -> AttackResult:
    """(c): input-layer aggregates sent that hold one raw row: counted (``count == 1``) or effectively
    (one contributing member, the others dropped out); FedAAS's per-pair partials covering one pick
    (``served``, True = one pick) and hidden-layer sums of count 1 are reported beside them."""
    layers = torch.cat(routed.layer) if routed.layer else torch.zeros(0, dtype=torch.long)
    counts = torch.cat(routed.count) if routed.count else torch.zeros(0, dtype=torch.long)
    first = counts[layers == 1]
    single = first == 1
    pick_sum, pick_node, values = routed.first_layer()
    if values is not None:
        members = contributing_members(pick_sum, pick_node, torch.nan_to_num(values, nan=0.0), x.double())
        known = torch.bincount(pick_sum, minlength=values.size(0)) > 0
        single |= known & (members <= 1) & ~values.isnan().any(1) & (values.abs().sum(1) > 0)
    pairs = torch.cat(served) if served else torch.zeros(0, dtype=torch.bool)
    details = {"input_sums": int(first.numel()), "input_count_one": int((first == 1).sum()),
               "input_effective_single": int(single.sum() - (first == 1).sum()),
               "hidden_sums": int((layers > 1).sum()), "hidden_count_one": int((counts[layers > 1] == 1).sum()),
               "partials": int(pairs.numel()), "partials_single": int(pairs.sum())}
    notes = (f"input layer: {details['input_count_one']} of {details['input_sums']} sums have count 1, "
             f"{details['input_effective_single']} more one contributing row; hidden layers: "
             f"{details['hidden_count_one']} of {details['hidden_sums']} count 1")
    if pairs.numel():
        notes += f"; attention partials: {details['partials_single']} of {details['partials']} cover one pick"
    return AttackResult("membership", int(first.numel() + pairs.numel()), int(single.sum() + pairs.sum()),
                        notes, details)


def single_partials(down: Message, up: Message) -> list[Tensor]:
    """FedAAS ``serve``: per key, the pairs answered (non-zero partial) that cover one pick."""
    out = []
    nums = up.under("num")
    for path, pair in down.under("incoming").items():
        if len(path) != 2 or path[1] != "pair" or path[:1] not in nums:
            continue
        num = nums[path[:1]]
        answered = (num.reshape(num.size(0), -1) != 0).any(1)
        out.append((torch.bincount(pair, minlength=num.size(0)) == 1) & answered)
    return out


# ---- (d) labels ---------------------------------------------------------------------------------------
def label_fields() -> dict[str, tuple[set[str], set[str] | None]]:
    """method -> (arguments, result keys) declared of kind ``label`` by any party class (None: the
    whole result is a label)."""
    from ..comm.party import Party
    from ..comm.rpc import Rows

    def kind(k: Any) -> str:
        return k.kind if isinstance(k, Rows) else k

    out: dict[str, tuple[set[str], set[str] | None]] = {}
    classes, stack = set(), [Party]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in classes:
                classes.add(sub)
                stack.append(sub)
    for cls in classes:
        for name in dir(cls):
            spec = getattr(getattr(cls, name, None), "rpc_spec", None)
            if spec is None:
                continue
            args = {a for a, k in spec.args.items() if kind(k) == "label"}
            ret = ({r for r, k in spec.returns.items() if kind(k) == "label"} if isinstance(spec.returns, dict)
                   else (None if kind(spec.returns) == "label" else set()))
            if args or ret is None or ret:
                old_args, old_ret = out.get(name, (set(), set()))
                out[name] = (old_args | args, None if ret is None or old_ret is None else old_ret | ret)
    return out


class LabelLeak:
    """(d): label values in messages, by flow; node ids are resolved where the call names them (the
    reply's ``train`` positions into the request's ``labels`` local ids, LLCG's ``rows``)."""

    def __init__(self, nodes: dict[str, Tensor], num_nodes: int):
        self.fields = label_fields()
        self.nodes = nodes
        self.flows: Counter[tuple[str, str, str]] = Counter()
        self.exposed = torch.zeros(num_nodes, dtype=torch.bool)

    def add(self, down: Message, up: Message) -> None:
        for msg, names in ((down, 0), (up, 1)):
            declared = self.fields.get(msg.method)
            if declared is None:
                continue
            keys = declared[names]
            count = sum(int(t.numel()) for p, t in msg.tensors.items() if keys is None or (p and p[0] in keys))
            if count:
                self.flows[(msg.sender, msg.receiver, msg.method)] += count
        asked, train = down.tensors.get(("labels",)), up.tensors.get(("train",))
        if asked is not None and train is not None and up.sender in self.nodes and ("y",) in up.tensors:
            self.exposed[self.nodes[up.sender][asked[train]]] = True

    def result(self, y: Tensor, masks: dict[str, Tensor]) -> AttackResult:
        flows = [{"sender": s, "receiver": r, "method": m, "labels": n} for (s, r, m), n in sorted(self.flows.items())]
        splits = {name: int((self.exposed & mask).sum()) for name, mask in masks.items()}
        if not flows:
            return AttackResult("labels", int(y.numel()), 0, "no message of kind label")
        resolved = int(self.exposed.sum())
        notes = ", ".join(f"{f['sender']}->{f['receiver']} {f['method']} ({f['labels']} values)" for f in flows)
        notes += "; nodes named: " + (", ".join(f"{k} {v}" for k, v in splits.items()) if resolved else "not resolved")
        return AttackResult("labels", int(y.numel()), resolved, notes, {"flows": flows, "splits": splits})


# ---- the ground truth and the whole audit ------------------------------------------------------------
@dataclass
class GroundTruth:
    """What the auditor knows and no party does: every raw row, label and split, and which global
    nodes each horizontal client holds (``nodes``: party name -> global ids, in local order)."""

    x: Tensor
    y: Tensor
    masks: dict[str, Tensor]
    private: list[Tensor]
    nodes: dict[str, Tensor]


def ground_truth(cfg: RunConfig, data: Data) -> GroundTruth:
    """Re-build the run's partition from its config (partitions are deterministic in the seed)."""
    from ..protocols import protocol_class

    x = data.x.to_dense().float() if data.x.layout != torch.strided else data.x.float()
    masks = {name: getattr(data, f"{name}_mask") for name in ("train", "val", "test")}
    scenario = protocol_class(cfg.protocol_name).scenario
    nodes: dict[str, Tensor] = {}
    private = [x]
    if scenario == "horizontal":
        from ..partition import horizontal_from_config

        part = horizontal_from_config(data, cfg.partition, cfg.seed)
        nodes = {f"client{m}": shard.nodes for m, shard in enumerate(part.shards)}
    elif scenario == "vertical":
        from ..partition import partition_vertical
        from ..protocols.glasu.options import vertical_blocks

        p = cfg.partition
        part = partition_vertical(data, p.num_clients, blocks=vertical_blocks(p), edge_keep=p.edge_keep,
                                  seed=cfg.seed, label_holder=p.label_holder)
        private = [shard.x.to_dense().float() if shard.x.layout != torch.strided else shard.x.float()
                   for shard in part.shards]
    return GroundTruth(x, data.y, masks, private, nodes)


def calls(messages: Iterable[Message]) -> Iterable[tuple[Message | None, Message]]:
    """Every message with, for a reply, the request of the same call (None for a request)."""
    pending: dict[str, Message] = {}
    for msg in messages:
        if msg.sender == SERVER:
            pending[msg.receiver] = msg
            yield None, msg
        else:
            down = pending.pop(msg.sender, None)
            yield (down if down is not None and down.method == msg.method else None), msg


def audit_messages(folder: Path, truth: GroundTruth) -> list[AttackResult]:
    """Run the four attacks over the messages recorded in ``folder`` (one pass, chunk by chunk)."""
    raw = RawRowMatch(truth.private)
    routed = RoutedSums()
    served: list[Tensor] = []
    labels = LabelLeak(truth.nodes, truth.x.size(0))
    for down, msg in calls(read_messages(folder)):
        raw.add(msg)
        if down is None:
            routed.request(msg)
            continue
        if msg.method == "propagate":
            routed.add(down, msg, truth.nodes)
        elif msg.method == "serve":
            served += single_partials(down, msg)
        labels.add(down, msg)
    return [raw.result(), reconstruction(routed, truth.x), membership(routed, served, truth.x),
            labels.result(truth.y, truth.masks)]


def audit_run(run_dir: Path, data_root: str | None = None) -> dict[str, Any]:
    """Audit the run in ``run_dir``; returns the report written to ``audit.json``."""
    from ..runner import load_data

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir} is not a run folder")
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir} holds no config.yaml; not a fedgl run folder")
    folder = run_dir / "messages"
    if not message_files(folder):
        raise ConfigError(f"{run_dir} holds no recorded messages; run it with privacy.record_messages: true")
    cfg = load_config(run_dir / "config.yaml")
    if data_root is not None:
        cfg.dataset = cfg.dataset.model_copy(update={"data_root": data_root})
    truth = ground_truth(cfg, load_data(cfg))
    results = audit_messages(folder, truth)
    for r in results:
        if r.attack in ("raw_row_match", "labels") and r.recovered and cfg.protocol_name in BY_DESIGN:
            r.notes += f"; {BY_DESIGN[cfg.protocol_name]}"
    report = {"run": str(run_dir), "protocol": cfg.protocol_name, "dataset": cfg.dataset.name,
              "privacy": cfg.privacy.model_dump(mode="json"),
              "attacks": {r.attack: r.as_dict() for r in results}}
    (run_dir / REPORT).write_text(json.dumps(report, indent=1) + "\n")
    return report


def audit_command(run_dir: Path, console, *, as_json: bool, data_root: str | None) -> int:
    """``fedgl audit RUN_DIR``: the report as a table (or one JSON line); exit code 0."""
    report = audit_run(run_dir, data_root)
    if as_json:
        console.print_json(json.dumps(report), indent=None)
        return 0
    from rich.table import Table

    table = Table(title=f"audit of {report['protocol']} on {report['dataset']} ({run_dir})")
    for column in ("attack", "attacked", "recovered", "fraction", "notes"):
        table.add_column(column, justify="right" if column in ("attacked", "recovered", "fraction") else "left")
    for name, r in report["attacks"].items():
        fraction = "-" if r["fraction"] is None else f"{r['fraction']:.4f}"
        table.add_row(name, str(r["attacked"]), str(r["recovered"]), fraction, r["notes"])
    console.print(table)
    console.print(f"written {Path(run_dir) / REPORT}")
    return 0
