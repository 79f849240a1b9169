"""FedAAS's model: one-head attention (or mean) layers whose aggregation splits across neighbour owners.

A layer's output for a target ``v`` is its own projection plus a softmax-weighted sum over its sampled
neighbours (the paper's "GraphSAGE model" with "graph attention layers"; Eq. 9-11, spec decision A5)::

    z_u = W h_u,   e_vu = LeakyReLU(a_dst·z_v + a_src·z_u),
    out_v = W_r h_v + Σ_u exp(e_vu) z_u / Σ_u exp(e_vu) + b

With ``root=False`` the target instead enters its own softmax as a self loop (GAT v1: no ``W_r``).
The sums split exactly by owner: each owner returns, per (target, owner) pair, a *partial*
``(num, den, shift)`` = (Σ exp(e - shift) z, Σ exp(e - shift), max e) over the neighbours it holds,
computed with its own ``W`` (Eq. 11's θ_q h_w). Partials merge by log-sum-exp (``merge_into``), so
the server adds pairs up per target and the target's owner adds its local terms, and the result
equals PyG's ``GATConv(heads=1)`` on the same edges (plus ``W_r h_v``). ``aggregate="mean"`` is Eq. 11
read literally as a GraphSAGE mean: ``out_v = W_r h_v + Σ_u W h_u / |S(v)| + b``; its partials have
``shift = 0``, so the same merge adds them.

A net computes every layer for all of a party's own nodes at once over a given edge set (the sampled
edges of a step, or all local edges), plus remote partials for some rows: the training step, the
owners' served embeddings and the evaluation on the whole graph are one function.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

NEGATIVE_SLOPE = 0.2  # GAT's LeakyReLU slope


@dataclass
class Partial:
    """Per-row pieces of a split softmax (or of a mean: ``shift`` all 0, ``den`` = counts)."""

    num: Tensor  # [T, d]
    den: Tensor  # [T]
    shift: Tensor  # [T]; -inf for a row with no terms
    # With an exact query gradient: the same sums with each term weighted by its logit's slope in
    # the target's query (d num / d query and d den / d query, at the same shift).
    dnum: Tensor | None = None
    dden: Tensor | None = None


def merge_into(num: Tensor, den: Tensor, shift: Tensor, index: Tensor, size: int) -> Partial:
    """Add terms ``(num, den, shift)`` into ``size`` rows by ``index`` (log-sum-exp, exact).

    A single edge term is ``(z_u, 1, e_vu)``; a partial from elsewhere is a term like any other."""
    top = torch.full((size,), float("-inf"), dtype=num.dtype).scatter_reduce(
        0, index, shift, "amax", include_self=True)
    base = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    scale = torch.exp(shift - base[index])  # exp(-inf) = 0: an empty term adds nothing
    out_num = torch.zeros(size, num.size(1), dtype=num.dtype).index_add(0, index, num * scale.unsqueeze(1))
    out_den = torch.zeros(size, dtype=num.dtype).index_add(0, index, den * scale)
    return Partial(out_num, out_den, top)


class SplitAttentionNet(nn.Module):
    """``len(widths)`` attention (or mean) layers with ReLU, then a linear classifier.

    Layer weights are stored as ``[d_in, d_out]`` so a sparse feature row set projects as one
    weighted sum-bag of weight rows, without transposing the (large) first-layer weight."""

    def __init__(self, in_dim: int, widths: list[int], num_classes: int, aggregate: str = "attention",
                 root: bool = False):
        super().__init__()
        self.aggregate = aggregate
        # GAT puts the target in its own softmax (a self loop, projected with W); GraphSAGE gives it a
        # weight of its own outside the aggregation. A mean layer always has one.
        self.self_loops = aggregate == "attention" and not root
        dims = [in_dim, *widths]
        self.weights = nn.ParameterList(nn.Parameter(_glorot(a, b)) for a, b in zip(dims, dims[1:]))
        self.att_src = nn.ParameterList(nn.Parameter(_glorot(1, b)[0]) for b in widths)
        self.att_dst = nn.ParameterList(nn.Parameter(_glorot(1, b)[0]) for b in widths)
        self.bias = nn.ParameterList(nn.Parameter(torch.zeros(b)) for b in widths)
        self.roots = nn.ParameterList(nn.Parameter(_glorot(a, b)) for a, b in zip(dims, dims[1:])) \
            if not self.self_loops else None
        self.head = nn.Linear(widths[-1], num_classes)
        if aggregate == "mean":  # no attention vector in mean mode: it would get no gradient
            for a in [*self.att_src, *self.att_dst]:
                a.requires_grad_(False).zero_()

    @property
    def num_layers(self) -> int:
        return len(self.weights)

    # ---- the pieces a party computes ----------------------------------------------------------
    def project(self, layer: int, h: Tensor, rows: Tensor | None = None, weight: Tensor | None = None) -> Tensor:
        """z = h W for ``rows`` of dense or sparse (CSR) h (all rows when None)."""
        weight = self.weights[layer] if weight is None else weight
        if h.layout == torch.strided:
            return (h if rows is None else h[rows]) @ weight
        crow, col, values = h.crow_indices(), h.col_indices(), h.values()
        if rows is None:
            return F.embedding_bag(col, weight, crow[:-1], mode="sum", per_sample_weights=values)
        start, counts = crow[rows], crow[rows + 1] - crow[rows]
        offsets = torch.cumsum(counts, 0) - counts
        pos = torch.arange(int(counts.sum())) + torch.repeat_interleave(start - offsets, counts)
        return F.embedding_bag(col[pos], weight, offsets, mode="sum", per_sample_weights=values[pos])

    def query_key(self, layer: int, h: Tensor) -> tuple[Tensor, Tensor]:
        """(a_dst·W h, a_src·W h) per row: Eq. 9's score splits into these two scalars."""
        vectors = self.weights[layer] @ torch.stack([self.att_dst[layer], self.att_src[layer]], 1)
        both = self.project(layer, h, weight=vectors)
        return both[:, 0], both[:, 1]

    def scores(self, layer: int, z: Tensor) -> tuple[Tensor, Tensor]:
        return z @ self.att_dst[layer], z @ self.att_src[layer]

    def edge_terms(self, key_src: Tensor, query_dst: Tensor) -> tuple[Tensor, Tensor]:
        """(den, shift) of single edges: (1, e_vu) for attention, (1, 0) for mean."""
        ones = torch.ones(key_src.numel())
        if self.aggregate == "mean":
            return ones, torch.zeros_like(ones)
        return ones, F.leaky_relu(query_dst + key_src, NEGATIVE_SLOPE)

    def layer(self, layer: int, h: Tensor, src: Tensor, dst: Tensor,
              remote: tuple[Tensor, Partial] | None = None, rows: Tensor | None = None) -> Tensor:
        """Layer ``layer`` over edges src -> dst (row ids of ``h``; attention adds self loops),
        merged with ``remote`` = (rows, partial) from other owners. Only ``rows`` (sorted ids; all
        when None) are computed; the output has every row of ``h``, zero outside ``rows``."""
        n = h.size(0)
        if rows is None:
            rows, used = torch.arange(n), None
        else:
            used = torch.unique(torch.cat([rows, src]))
        z = self.project(layer, h, used)
        at = (lambda ids: ids) if used is None else (lambda ids: torch.searchsorted(used, ids))
        out_at = (lambda ids: ids) if used is None else (lambda ids: torch.searchsorted(rows, ids))
        if self.self_loops:
            src, dst = torch.cat([src, rows]), torch.cat([dst, rows])
        s, r = self.scores(layer, z)
        spos, dpos = at(src), at(dst)
        den, shift = self.edge_terms(r[spos], s[dpos])
        num, index = z[spos], out_at(dst)
        if remote is not None:
            remote_rows, part = remote
            # (a mask over h's rows: isin sorts both sides at every step)
            keep = torch.zeros(n, dtype=torch.bool).index_fill_(0, rows, True)[remote_rows] if used is not None \
                else torch.ones_like(remote_rows, dtype=torch.bool)
            part_num, part_den = part.num[keep], part.den[keep]
            if part.dnum is not None:
                # Remote terms are constants, but their logits move with the target's query: a
                # first-order term with zero value carries exactly that derivative.
                moved = s[at(remote_rows[keep])]
                moved = moved - moved.detach()
                part_num = part_num + moved.unsqueeze(1) * part.dnum[keep]
                part_den = part_den + moved * part.dden[keep]
            num = torch.cat([num, part_num])
            den, shift = torch.cat([den, part_den]), torch.cat([shift, part.shift[keep]])
            index = torch.cat([index, out_at(remote_rows[keep])])
        total = merge_into(num, den, shift, index, rows.numel())
        out = total.num / total.den.clamp(min=1e-30 if self.aggregate == "attention" else 1).unsqueeze(1)
        if self.roots is not None:
            out = out + self.project(layer, h, rows, self.roots[layer])
        out = F.relu(out + self.bias[layer])
        if used is None:
            return out
        return torch.zeros(n, out.size(1)).index_copy(0, rows, out)

    def serve(self, layer: int, h: Tensor, query: Tensor, pair: Tensor, num_pairs: int,
              projected: bool = True, slopes: bool = False) -> tuple[Partial, Tensor]:
        """An owner's partials for ``num_pairs`` pairs from its rows ``h`` (layer ``layer``'s inputs of
        the picked nodes, pick i in pair ``pair[i]``) and the pairs' target queries; with the keys
        a_src·W h of the picks (the trainer's sampling scores of these remote neighbours). Unless
        ``projected``, the partial sums the rows h themselves (the receiver projects them: the
        weighted sum is linear, so projecting it equals summing projections)."""
        z = self.project(layer, h)
        s, r = self.scores(layer, z)
        den, shift = self.edge_terms(r, query[pair])
        rows = z if projected else h
        part = merge_into(rows, den, shift, pair, num_pairs)
        if slopes:  # each logit's derivative in the target's query: LeakyReLU's slope at it
            slope = torch.where(query[pair] + r > 0, 1.0, NEGATIVE_SLOPE)
            moved = merge_into(rows * slope.unsqueeze(1), slope, shift, pair, num_pairs)
            part.dnum, part.dden = moved.num, moved.den
        return part, r

    # ---- the whole graph ------------------------------------------------------------------------
    def embed(self, x: Tensor, edges: list[tuple[Tensor, Tensor]]) -> list[Tensor]:
        """Inputs of every layer and the last hidden output: [x, h1, ..., hL], with layer l's edges
        ``edges[l]``, every row, no remote partial."""
        hs = [x]
        for layer in range(self.num_layers):
            hs.append(self.layer(layer, hs[-1], *edges[layer]))
        return hs

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        """Logits on a whole graph (every edge, self loops excluded from ``edge_index``)."""
        keep = edge_index[0] != edge_index[1]
        edges = (edge_index[0, keep], edge_index[1, keep])
        return self.head(self.embed(x, [edges] * self.num_layers)[-1])


def _glorot(fan_in: int, fan_out: int) -> Tensor:
    bound = (6.0 / (fan_in + fan_out)) ** 0.5
    return torch.empty(fan_in, fan_out).uniform_(-bound, bound)
