"""The audit's attacks on recorded messages, as an honest-but-curious party would run them.

Each works on plain tensors and ``Message`` records, whatever kind a message is declared as:

- ``RawRowMatch``: a row of any message equal (``torch.allclose`` defaults) to a non-zero raw feature
  row of a party (a whole row, or a vertical client's feature block);
- ``reconstruction``: the server's least-squares solution for the rows inside the first-layer sums
  it routed (Swift-FedGNN family: it sent each owner the ids of every (target, owner) pair and
  received one sum per pair, so it knows each sum's members). A row counts as recovered when the
  estimate equals the true row, up to a positive scale (GCN owners scale rows by their degree
  factor before summing), within ``TOLERANCE`` of its largest entry;
- ``membership``: input-layer aggregates that hold a single raw row (count 1, or only one member
  whose feature support meets the sum's non-zeros: the others were dropped out), and FedAAS's
  per-pair partials covering one pick; hidden-layer sums of count 1 are reported beside them;
- ``FixedPointCheck``: int64 payloads a client sent in fixed point that read as values, i.e. whose
  secure-aggregation masks are missing.

Integer payloads are read both as they are and as fixed point (``readings``): an int64 tensor divided
by 2^FRACTION_BITS is what a missing mask leaves readable, so a masked sum never hides a leak from
the audit only because of its type.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..comm.ledger import SERVER
from .record import Message
from .secure_aggregation import FRACTION_BITS

TOLERANCE = 1e-3  # reconstruction: max |estimate - c * truth| <= TOLERANCE * max |c * truth|
CHUNK = 4096  # candidate rows compared at once
FIXED_POINT = float(2**FRACTION_BITS)
# An int64 payload reads as fixed point when some entry reaches 2^24 (node ids and counts stay below)
# and, unmasked, when every entry stays below 2^56 (values under 2^24): masked entries are uniform
# over the ring, so 8 of them all below 2^56 happen with probability 2^-56.
FIXED_POINT_LOW, FIXED_POINT_HIGH, FIXED_POINT_MIN = 2**24, 2**56, 8


def readings(t: Tensor) -> list[Tensor]:
    """What a tensor can be read as: floats as they are; integers and booleans as numbers and, int64,
    also as fixed point (divided by 2^FRACTION_BITS), the last reading being the likeliest value."""
    if t.is_floating_point() or t.is_complex():
        return [t] if t.is_floating_point() else []
    read = [(t.to_dense() if t.layout != torch.strided else t).double()]
    return read + [read[0] / FIXED_POINT] if t.dtype == torch.int64 else read


Flow = tuple[str, str, str]  # (sender, receiver, method)


def flow_list(counts: Counter[Flow], key: str) -> list[dict[str, Any]]:
    """The flows of ``counts`` as report entries, each with its count under ``key``."""
    return [{"sender": s, "receiver": r, "method": m, key: n} for (s, r, m), n in sorted(counts.items())]


def describe(flows: list[dict[str, Any]], key: str, unit: str = "") -> str:
    """``sender->receiver method (count)`` for every flow, for a report's notes."""
    return ", ".join(f"{f['sender']}->{f['receiver']} {f['method']} ({f[key]}{unit})" for f in flows)


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
    """The non-zero rows of width ``width`` of a message tensor read as numbers, or None."""
    if t.dim() == 0 or t.size(-1) != width:
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
        self.hits: Counter[Flow] = Counter()

    def add(self, msg: Message) -> None:
        wide = (t for t in msg.tensors.values() if t.dim() and t.size(-1) in self.index)  # read only these
        for t in (v for tensor in wide for v in readings(tensor)):
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
        flows = flow_list(self.hits, "rows")
        relayed = sum(n for (s, _, _), n in self.hits.items() if s == SERVER)
        notes = ("no raw feature row in any message" if not flows else
                 "raw rows in " + describe(flows, "rows") + (f"; {relayed} relayed by the server" if relayed else ""))
        return AttackResult("raw_row_match", attacked, recovered, notes, {"flows": flows})


# ---- the server's routed sums (Swift-FedGNN family) ---------------------------------------------------
@dataclass
class RoutedSums:
    """The sums the server routed: per sum sent (count > 0), its layer and row count; for the input
    layer, its members (``pick_sum`` -> ``pick_node``, global ids) and its value as the server read
    it (fixed-point integers decoded; NaN rows: no value sent)."""

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
            value = readings(value)[-1] if value is not None and not value.is_complex() else None
            if value is not None and value.dim() == 2 and value.size(0) in (k, cnt.numel()):
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


class FixedPointCheck:
    """Client payloads in fixed point (int64) that read as values: a masked one is uniform over the
    ring, so one whose every entry is small was sent without its masks (or with masks that cancelled,
    e.g. a participant list naming the sender twice)."""

    def __init__(self):
        self.seen = 0
        self.readable: Counter[Flow] = Counter()

    def add(self, msg: Message) -> None:
        if msg.sender == SERVER:
            return
        for t in msg.tensors.values():
            if t.dtype != torch.int64 or t.numel() < FIXED_POINT_MIN:
                continue
            largest = int((t.to_dense() if t.layout != torch.strided else t).abs().max())
            if largest >= FIXED_POINT_LOW:
                self.seen += 1
                if largest < FIXED_POINT_HIGH:
                    self.readable[(msg.sender, msg.receiver, msg.method)] += 1

    def result(self) -> AttackResult:
        flows = flow_list(self.readable, "payloads")
        notes = ("no fixed-point payload" if not self.seen else f"{self.seen} fixed-point payloads, " +
                 ("all masked" if not flows else "readable (masks missing) in " + describe(flows, "payloads")))
        return AttackResult("masking", self.seen, sum(self.readable.values()), notes, {"flows": flows})
