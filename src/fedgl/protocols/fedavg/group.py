"""Many horizontal clients trained as one batched computation.

A local step of a FedAvg client on a few hundred nodes costs far more in per-operation overhead
than in arithmetic, so ten clients cost ten times one client's overhead. ``ClientGroupTrainer``
runs the full-batch steps of a whole group of GCN or GraphSAGE clients as a single computation
while every member keeps its own model, optimiser state and random stream:

* parameters are stacked along a leading member dimension; the clients' own optimiser update
  (``make_optimizer``'s fused Adam or SGD, applied by ``optim.adam_update``/``sgd_update``) runs on
  each member's rows as separate parameters, so every member has its own moments and step counts
  and members that do not step this round are untouched;
* node states are padded per member, ``[M, n_max, d]``, so hidden linear maps are one ``bmm``
  (``batched_linear``);
* sparse input features are one block-diagonal CSR matrix whose member ``m`` uses feature columns
  ``m * F .. (m + 1) * F``, so the first layer is one sparse product with the members' stacked
  ``[M * F, hidden]`` weights; propagation is one block-diagonal CSR operator built from the
  members' own normalised adjacencies (``prepare_graph``);
* the loss is the sum of the members' mean cross-entropies, so each member's gradient is its own;
* member ``m`` draws its dropout masks from its own generator, in the shapes and order its
  unbatched ``LocalTrainer`` draws them (input feature values, then each hidden layer).

Members thus follow the trajectories they would follow as separate parties, up to float rounding
(FedAvg on Cora: global parameters within 2e-7 of one party per client after three rounds). On the
wire a member's model is one row of the same bytes as its ``state_dict`` (``flat_state``; weights
in ``[in, out]`` layout).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ... import device as devices
from ...config import TrainConfig
from ...errors import ConfigError
from ...models.graph import SparseOperator, canonical_model_name
from ...optim import adam_update, sgd_update
from ..local_training import LocalTrainer

__all__ = ["GROUP_MODELS", "ClientGroupTrainer", "flat_state", "groupable", "state_from_row"]

# Backbones whose layers are linear maps followed by a fixed propagation operator: the batched form.
GROUP_MODELS = ("gcn", "sage")
# Widest layer output computed in the transposed layout (``batched_linear``).
NARROW_OUTPUT = 32


def groupable(model_name: str) -> bool:
    """Whether clients of this backbone can be trained as a batched group."""
    return canonical_model_name(model_name) in GROUP_MODELS


def flat_state(state: dict[str, Tensor]) -> Tensor:
    """A model state as one row: its tensors in key order, each 2-D weight transposed to the
    ``[in, out]`` layout the group trains with, so loading and returning rows are plain copies."""
    return torch.cat([(value.t() if value.dim() == 2 else value).reshape(-1) for value in state.values()])


def state_from_row(row: Tensor, like: dict[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of ``flat_state``: views of ``row`` with the names and shapes of ``like``."""
    out = {}
    for (key, value), part in zip(like.items(), row.split([value.numel() for value in like.values()])):
        out[key] = part.view(value.shape[::-1]).t() if value.dim() == 2 else part.view(value.shape)
    return out


@dataclass(frozen=True)
class _Param:
    """One stacked model tensor: its per-member ``shape`` as the layers use it (a weight as
    ``[in, out]``, so a layer is ``h @ W``) and where it sits in a ``flat_state`` row."""

    shape: tuple[int, ...]
    offset: int

    @property
    def size(self) -> int:
        return int(torch.Size(self.shape).numel())


@dataclass(eq=False)
class _Member:
    """What the group keeps of one client: its graph pieces, labels and random stream."""

    x: Tensor  # CSR or dense features, as ``as_model_input`` gave them to the unbatched client
    adjacency: Tensor  # CSR propagation operator from ``prepare_graph``
    train_idx: Tensor
    y: Tensor
    generator: torch.Generator

    @property
    def num_nodes(self) -> int:
        return self.x.size(0)


@dataclass(eq=False)
class _Batch:
    """The block structures of the members taking a step together (``ids``, in order)."""

    ids: list[int]
    index: Tensor | None  # member ids as a tensor; None when the batch is the whole group
    adjacency: SparseOperator
    features: SparseOperator | None  # block-diagonal CSR features (None: dense ``dense_x``)
    dense_x: Tensor | None
    draws: list[tuple[int, int, Tensor | None]]  # per member: value offset, count, dense positions
    rows: Tensor  # training rows in the padded ``[k * n_max]`` layout
    targets: Tensor
    weights: Tensor  # 1 / (member's training nodes), per training row
    row_member: Tensor  # batch position of each training row's member

    @property
    def k(self) -> int:
        return len(self.ids)


class ClientGroupTrainer:
    """Full-batch local training of M GCN or GraphSAGE clients as one computation.

    Built from the members' own ``LocalTrainer`` (models initialised as separate clients would be,
    graphs prepared by ``prepare_graph``) and the torch RNG state each member would train with.
    """

    def __init__(self, trainers: Sequence[LocalTrainer], rng_states: Sequence[Tensor], train: TrainConfig):
        if not trainers or len(trainers) != len(rng_states):
            raise ValueError("a client group needs one RNG state per member trainer, and at least one member")
        models = [t.model for t in trainers]
        name = canonical_model_name(models[0].name)
        if name not in GROUP_MODELS or any(type(m) is not type(models[0]) for m in models):
            raise ConfigError(f"a client group trains {' or '.join(GROUP_MODELS)} backbones only, got {name}")
        self.kind = name
        self.num_layers = models[0].num_layers
        self.p = float(models[0].dropout)
        self.layout: dict[str, _Param] = {}
        offset = 0
        for key, value in trainers[0].get_state().items():
            self.layout[key] = _Param(tuple(value.shape[::-1]), offset)
            offset += value.numel()
        self.num_members = len(trainers)
        self.params = {key: torch.empty(self.num_members, p.size) for key, p in self.layout.items()}
        self.set_rows(torch.stack([flat_state(t.get_state()) for t in trainers]), None)
        self.optimizer = _MemberOptimizer(self.params, train)
        self.members = [
            _Member(t.x, t.graph.operator.matrix, t.train_idx, t.y, devices.generator().set_state(state.clone()))
            for t, state in zip(trainers, rng_states)
        ]
        self.n_max = max(m.num_nodes for m in self.members)
        self.num_features = self.members[0].x.size(1)
        self._batches: dict[tuple[int, ...] | None, _Batch] = {}

    # ---- states on the wire ---------------------------------------------------------------------
    @torch.no_grad()
    def set_rows(self, rows: Tensor, members: Tensor | None) -> None:
        """Load one ``flat_state`` row per member (``members`` ids, or all members if None)."""
        for key, p in self.layout.items():
            block = rows[:, p.offset : p.offset + p.size]
            if members is None:
                self.params[key].copy_(block)
            else:
                self.params[key].index_copy_(0, members, block)

    @torch.no_grad()
    def get_rows(self, members: Tensor | None) -> Tensor:
        """Each listed member's model as a ``flat_state`` row (``[k, P]``)."""
        return torch.cat([p if members is None else p.index_select(0, members) for p in self.params.values()], 1)

    # ---- training -------------------------------------------------------------------------------
    def train_epochs(self, epochs: int, members: Tensor | None) -> Tensor:
        """``epochs`` full-batch steps of the listed members (sorted ids, each with training nodes;
        None = every member); returns each member's mean step loss, in the order given."""
        if members is not None and members.numel() == self.num_members:
            members = None
        batch = self._batch(members)
        return torch.stack([self._step(batch) for _ in range(epochs)]).mean(0)

    def _step(self, batch: _Batch) -> Tensor:
        leaves = {
            key: (param if batch.index is None else param.index_select(0, batch.index)).detach().requires_grad_()
            for key, param in self.params.items()
        }
        logits = self._forward(batch, leaves)
        losses = F.cross_entropy(logits.index_select(0, batch.rows), batch.targets, reduction="none") * batch.weights
        grads = torch.autograd.grad(losses.sum(), list(leaves.values()))
        self.optimizer.step(self.params, dict(zip(leaves, grads)), batch.ids)
        return losses.detach().new_zeros(batch.k).index_add_(0, batch.row_member, losses.detach())

    def _forward(self, batch: _Batch, leaves: dict[str, Tensor]) -> Tensor:
        """Logits ``[k * n_max, classes]``, layer by layer as ``Backbone.forward`` (dropout before
        every layer, ReLU after every layer but the last)."""
        k, n = batch.k, self.n_max
        h: Tensor | SparseOperator
        if batch.features is not None:
            h = self._drop_features(batch, batch.features)
        else:
            h = self._dropout(batch, batch.dense_x)
        for index in range(self.num_layers):
            if index > 0:
                h = self._dropout(batch, h)
            out = self._layer(index, h, batch, leaves, k, n)
            h = out if index == self.num_layers - 1 else F.relu(out)
        return h.reshape(k * n, -1)

    def _layer(self, index: int, h: Tensor | SparseOperator, batch: _Batch, leaves: dict[str, Tensor],
               k: int, n: int) -> Tensor:
        def linear(key: str) -> Tensor:
            weight = leaves[key].view(k, *self.layout[key].shape)
            if isinstance(h, SparseOperator):
                return (h @ weight.reshape(-1, weight.size(-1))).view(k, n, -1)
            return batched_linear(h, weight)

        def propagate(hw: Tensor) -> Tensor:
            return (batch.adjacency @ hw.reshape(k * n, -1)).view(k, n, -1)

        prefix = f"layers.{index}."
        if self.kind == "gcn":
            return propagate(linear(prefix + "lin.weight")) + leaves[prefix + "bias"].unsqueeze(1)
        neighbours = propagate(linear(prefix + "lin_l.weight")) + leaves[prefix + "lin_l.bias"].unsqueeze(1)
        return neighbours + linear(prefix + "lin_r.weight")

    def _dropout(self, batch: _Batch, h: Tensor) -> Tensor:
        """``models.graph.dropout`` per member on padded rows, from each member's generator."""
        if self.p == 0.0:
            return h
        mask = torch.zeros_like(h)
        for position, member in enumerate(batch.ids):
            m = self.members[member]
            if m.num_nodes:
                torch.rand(m.num_nodes, h.size(-1), generator=m.generator, out=mask[position, : m.num_nodes])
        return h * mask.ge_(self.p).mul_(1.0 / (1.0 - self.p))

    def _drop_features(self, batch: _Batch, operator: SparseOperator) -> SparseOperator:
        """``feature_dropout`` per member on the block-diagonal features: a sparse member draws one
        number per stored value, a dense member one per entry (only its non-zeros matter)."""
        if self.p == 0.0:
            return operator
        matrix = operator.matrix
        mask = torch.empty_like(matrix.values())
        for member, (start, count, positions) in zip(batch.ids, batch.draws):
            m = self.members[member]
            if positions is None:
                torch.rand(count, generator=m.generator, out=mask[start : start + count])
            else:
                mask[start : start + count] = torch.rand(m.x.numel(), generator=m.generator)[positions]
        values = matrix.values() * mask.ge_(self.p).mul_(1.0 / (1.0 - self.p))
        dropped = torch.sparse_csr_tensor(matrix.crow_indices(), matrix.col_indices(), values, matrix.shape,
                                          check_invariants=False)
        return SparseOperator(dropped, operator.plan)

    # ---- block structures -----------------------------------------------------------------------
    def _batch(self, members: Tensor | None) -> _Batch:
        """Block structures for the listed members, cached for the whole group and the latest subset."""
        key = None if members is None else tuple(members.tolist())
        batch = self._batches.get(key)
        if batch is None:
            if key is not None:
                self._batches = {k: b for k, b in self._batches.items() if k is None}
            batch = self._batches[key] = self._build(members)
        return batch

    def _build(self, index: Tensor | None) -> _Batch:
        ids = list(range(self.num_members)) if index is None else index.tolist()
        chosen = [self.members[i] for i in ids]
        n, f = self.n_max, self.num_features
        adjacency = SparseOperator(_block_diagonal([m.adjacency for m in chosen], n, n))
        adjacency.transposed()
        features, dense_x, draws = None, None, []
        if all(m.x.layout == torch.strided for m in chosen):
            dense_x = torch.zeros(len(chosen), n, f)
            for position, m in enumerate(chosen):
                dense_x[position, : m.num_nodes] = m.x
        else:
            blocks, start = [], 0
            for m in chosen:
                sparse = m.x.layout != torch.strided
                block = m.x if sparse else m.x.to_sparse_csr()
                positions = None if sparse else _flat_positions(block)
                draws.append((start, block.values().numel(), positions))
                start += block.values().numel()
                blocks.append(block)
            features = SparseOperator(_block_diagonal(blocks, n, f))
        offsets = [position * n for position in range(len(chosen))]
        rows = torch.cat([m.train_idx + o for m, o in zip(chosen, offsets)])
        counts = torch.tensor([m.train_idx.numel() for m in chosen])
        if bool((counts == 0).any()):
            raise ValueError("every member of a training batch needs training nodes")
        return _Batch(
            ids=ids,
            index=index,
            adjacency=adjacency,
            features=features,
            dense_x=dense_x,
            draws=draws,
            rows=rows,
            targets=torch.cat([m.y[m.train_idx] for m in chosen]),
            weights=torch.repeat_interleave(1.0 / counts.to(torch.get_default_dtype()), counts),
            row_member=torch.repeat_interleave(torch.arange(len(chosen)), counts),
        )


class _MemberOptimizer:
    """The clients' optimiser applied to each member's rows of the stacked tensors as separate
    parameters (``optim.adam_update``/``sgd_update``: the update ``make_optimizer``'s optimiser makes),
    so a member's update is the one its unbatched optimiser would make. Each (tensor, member) has its
    own moments and step count; rows of members not stepping are not touched."""

    def __init__(self, params: dict[str, Tensor], train: TrainConfig):
        self.kind, self.lr, self.weight_decay = train.optimizer, train.lr, train.weight_decay
        self.num_members = next(iter(params.values())).size(0)
        if self.kind == "adam":
            self.exp_avg = {key: torch.zeros_like(p) for key, p in params.items()}
            self.exp_avg_sq = {key: torch.zeros_like(p) for key, p in params.items()}
            # torch.optim.Adam keeps a float32 step tensor per parameter (fused kernel).
            self.steps = {key: torch.zeros(p.size(0)) for key, p in params.items()}

    @torch.no_grad()
    def step(self, params: dict[str, Tensor], grads: dict[str, Tensor], members: list[int]) -> None:
        """Update ``params[key][m]`` for each listed member ``m`` with ``grads[key][position of m]``."""
        adam_steps = self.kind == "adam"
        whole = len(members) == self.num_members and (
            not adam_steps or all(bool((t == t[0]).all()) for t in self.steps.values()))
        if whole:  # every member at the same step: one update of the stacked tensors, same arithmetic
            def tensors(stacked: dict[str, Tensor]) -> list[Tensor]:
                return list(stacked.values())

            grad_list = tensors(grads)
            steps = [t[0].clone() for t in self.steps.values()] if adam_steps else []
        else:
            def tensors(stacked: dict[str, Tensor]) -> list[Tensor]:
                return [stacked[key][m] for key in params for m in members]

            grad_list = [grads[key][j] for key in params for j in range(len(members))]
            steps = tensors(self.steps) if adam_steps else []
        if not adam_steps:
            sgd_update(tensors(params), grad_list, lr=self.lr, weight_decay=self.weight_decay)
            return
        adam_update(tensors(params), grad_list, tensors(self.exp_avg), tensors(self.exp_avg_sq), steps, lr=self.lr,
                    weight_decay=self.weight_decay)
        if whole:
            for t in self.steps.values():
                t += 1


def batched_linear(h: Tensor, weight: Tensor) -> Tensor:
    """``h @ weight`` per member (``[k, n, in] @ [k, in, out]``). For a narrow output (a classifier's
    few classes) torch's ``bmm`` is slow in this layout, and so is its weight gradient; ``_NarrowLinear``
    computes the same sums transposed (measured on ten 278-node members, 64 -> 7: 150 against 400 us
    forward and backward). From about 40 columns on the plain product is as fast."""
    if weight.size(-1) <= NARROW_OUTPUT:
        return _NarrowLinear.apply(h, weight)
    return torch.bmm(h, weight)


class _NarrowLinear(torch.autograd.Function):
    """``bmm(h, weight)`` as ``(weight^T @ h^T)^T``, with the weight gradient ``(g^T @ h)^T`` and the
    input gradient ``g @ weight^T`` in the layout that keeps it contiguous for the layers below."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(h, weight)
        return torch.bmm(weight.transpose(1, 2), h.transpose(1, 2)).transpose(1, 2)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:  # type: ignore[override]
        h, weight = ctx.saved_tensors
        grad_h = torch.bmm(grad, weight.transpose(1, 2)) if ctx.needs_input_grad[0] else None
        grad_w = torch.bmm(grad.transpose(1, 2), h).transpose(1, 2) if ctx.needs_input_grad[1] else None
        return grad_h, grad_w


def _block_diagonal(blocks: Sequence[Tensor], rows: int, cols: int) -> Tensor:
    """CSR matrix with ``blocks[j]`` (CSR, at most ``rows x cols``) at block position ``(j, j)``;
    rows beyond a block's own are empty (padding)."""
    crows, columns, values, nnz = [], [], [], 0
    for j, block in enumerate(blocks):
        crow = block.crow_indices()
        padding = crow[-1:].expand(rows - block.size(0))
        crows.append(torch.cat([crow[:-1], padding]) + nnz)
        columns.append(block.col_indices() + j * cols)
        values.append(block.values())
        nnz += block.values().numel()
    crow = torch.cat([*crows, torch.tensor([nnz], dtype=crows[0].dtype)])
    shape = (len(blocks) * rows, len(blocks) * cols)
    return torch.sparse_csr_tensor(crow, torch.cat(columns), torch.cat(values), shape, check_invariants=False)


def _flat_positions(matrix: Tensor) -> Tensor:
    """Row-major position ``row * num_cols + col`` of every stored value of a CSR matrix."""
    crow = matrix.crow_indices()
    row = torch.repeat_interleave(torch.arange(matrix.size(0)), crow.diff())
    return row * matrix.size(1) + matrix.col_indices()
