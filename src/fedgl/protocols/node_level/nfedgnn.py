"""nFedGNN: node-level federated learning with one user per node (Algorithm 1 of the nFedGNN paper).

Every node is a user whose only data is its own feature vector. The first GNN layer is split
(encoding-then-message-passing): user i computes ``x_i W_i`` with its own weight and uploads the
latent vector; the server, which holds the topology and the training labels, aggregates the
latents, runs the remaining layers, updates its model and sends each user the gradient of its
latent vector, with which the user updates ``W_i``. A graph Laplacian penalty on the latents
(Eq. 6-7, weight ``lam``) pulls neighbours' latents together; by default (``regulariser: per_label``)
its weight is per labelled user, as the cross-entropy's, so that one ``lam`` suits every graph, the
users start from one shared weight and step at ``user_lr`` (a user's latent moves along the server's
gradient whatever its features, so its features count only through its start), and the server's lr
falls on a cosine over the run (docs/nfedgnn.md). ``regulariser: raw`` is the paper's method.

All users form one party, a vectorised ``UserPopulation``: per-user weights and optimiser state
are batched tensors, user i's computation touches only its own entries, and per-user messages
are declared with ``Rows`` so the ledger attributes every byte to its user.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor
from torch.nn import functional as F
from torch_geometric.data import Data

from ... import device as devices
from ...comm import Party, Rows, rpc
from ...config import TrainConfig
from ...errors import ConfigError
from ...evaluation import Evaluator
from ...models.split_node import (
    BatchedOptimizer,
    OffsetWeights,
    ServerGraph,
    SplitShape,
    UserFeatures,
    build_server_model,
    init_support_weights,
    laplacian_penalty,
    prepare_server_graph,
    project,
    scratch,
    split_shape,
    support_gradient,
)
from ...partition import partition_node_level
from ...privacy.config import DPConfig
from ...privacy.dp import USER_ROWS, DPAccountant, PrivateRelease
from ...optim import make_optimizer
from ..base import Protocol, ProtocolOptions


class SplitOptions(ProtocolOptions):
    """Settings shared by the split node-level protocols."""

    normalize_features: bool = Field(
        True, description="each user divides its feature vector by its sum (the preprocessing of the GCN paper)")
    user_dropout: float = Field(
        0.0, ge=0, lt=1, description="dropout each user applies to its own features (model.dropout acts on the server)")
    user_weight_decay: Literal["decoupled", "coupled"] = Field(
        "decoupled", description="how each user applies train.weight_decay: decoupled (AdamW: shrink by lr x decay "
                                 "per step, whatever the gradient's scale) or coupled (L2 added to the user's gradient "
                                 "before Adam's normalisation, as torch.optim.Adam does)")


LAM = 1.0  # per_label's unit: the penalty weighs on a user of mean degree as one label's cross-entropy does
LAM_GRID = (0.3, LAM, 3.0)  # lam: auto's candidates, half a decade either side of the unit
USER_LR = 0.001  # per_label's users: a hundredth of the server's 0.1, so their shared start is not stepped over
LATENT = 256  # per_label's model.hidden: a wide projection of the features, which a user's start is (docs/nfedgnn.md)
# per_label's settings where the config leaves them unset; raw keeps the paper's (docs/nfedgnn.md, "Sparse labels")
FORM_DEFAULTS = {
    "per_label": {"user_init": "shared", "normalize_features": False, "user_lr": USER_LR, "lr_schedule": "cosine"},
    "raw": {"user_init": "independent", "normalize_features": True, "user_lr": None, "lr_schedule": "constant",
            "lam": LAM}}


class NFedGNNOptions(SplitOptions):
    lam: float | Literal["auto"] = Field(
        "auto", json_schema_extra={"earlier": LAM},
        description="weight of the graph Laplacian regulariser on the latents (Eq. 7), or auto: one whole run per "
                    "value of lam_grid, the one of best validation accuracy kept, as the paper tunes lam per "
                    "dataset (every run's bytes are counted); unset: auto with per_label, 1 with raw")
    lam_grid: tuple[float, ...] = Field(
        LAM_GRID, min_length=1, description="the values lam: auto tries, in order (ties go to the first)")
    regulariser: Literal["per_label", "raw"] = Field(
        "per_label", description="per_label: Eq. 6's penalty times users / training labels, so that it weighs on each "
                                 "user as the cross-entropy (a mean over the labels) does and one lam suits every "
                                 "graph, with the library's user side; raw: the paper's method, Eq. 6 as written, "
                                 "whose lam the paper tunes per dataset (Cora: 300)")
    reg_heads: Literal["per_head", "mean"] = Field(
        "per_head", description="GAT: regularise every head's latent, or the latent averaged over heads")
    user_fraction: float = Field(1.0, gt=0, le=1, description="share of users taking part in each round")
    user_init: Literal["independent", "shared"] = Field(
        "shared", description="each user draws its own first-layer weight, or all start from one; unset: shared with "
                              "per_label, independent with raw (the paper's)")
    normalize_features: bool = Field(
        False, description="each user divides its feature vector by its sum (the GCN paper's preprocessing); unset: "
                           "false with per_label, true with raw (the paper's)")
    user_lr: float | None = Field(
        USER_LR, gt=0, json_schema_extra={"earlier": None},
        description="the users' learning rate (None: train.lr, as the paper); unset: 0.001 with per_label, None with raw")
    lr_schedule: Literal["constant", "cosine"] = Field(
        "cosine", json_schema_extra={"earlier": "constant"},
        description="the server's lr over the run: constant (the paper's) or cosine, from train.lr at round 1 down "
                    "towards 0 at train.rounds, so the accuracy settles instead of swinging at lr 0.1; unset: cosine "
                    "with per_label, constant with raw")
    user_state: Literal["rows", "offset"] = Field(
        "offset", json_schema_extra={"earlier": "rows"},
        description="how the users hold their weights: rows (each user's rows for its non-zero features, nnz x D "
                    "floats with Adam's moments) or offset (the shared start plus one D-vector a user, which is how "
                    "those rows move with a shared start, Adam, decoupled decay and no user dropout: exact for "
                    "binary features, up to Adam's eps otherwise; N x D floats); unset: offset where it holds, "
                    "with per_label, else rows")

    @model_validator(mode="before")
    @classmethod
    def _form_defaults(cls, data: Any) -> Any:
        """Fill the settings the config leaves out from the regulariser's form."""
        if not isinstance(data, dict):
            return data
        form = data.get("regulariser", "per_label")
        data = {**FORM_DEFAULTS.get(form, {}), **data}
        fits = (data.get("user_init") == "shared" and not data.get("user_dropout")
                and data.get("user_weight_decay", "decoupled") == "decoupled")
        return {"user_state": "offset" if form == "per_label" and fits else "rows", **data}

    def unread(self) -> dict[str, str]:
        """Options this configuration never reads, each with why (``fedgl.session.unread_settings``)."""
        return {"lam_grid": f"only lam: auto reads it, not lam {self.lam}"} if self.lam != "auto" else {}

    @model_validator(mode="after")
    def _lam_values(self) -> "NFedGNNOptions":
        bad = [v for v in ((self.lam,) if self.lam != "auto" else ()) + self.lam_grid if not v >= 0]
        if bad:
            raise ValueError(f"lam and lam_grid take weights of 0 or more (got {bad[0]})")
        return self

    @model_validator(mode="after")
    def _offset_fits(self) -> "NFedGNNOptions":
        if self.user_state == "offset":
            unfit = [f"{key} {value}" for key, value, fit in (
                ("user_init", self.user_init, "shared"), ("user_dropout", self.user_dropout, 0.0),
                ("user_weight_decay", self.user_weight_decay, "decoupled")) if value != fit]
            if unfit:
                raise ValueError(f"user_state offset needs one shared start, no user dropout and decoupled decay "
                                 f"(got {', '.join(unfit)}); set user_state: rows")
        return self


class UserPopulation(Party):
    """All users of the graph. Row i of every batched tensor is user i's private state."""

    def __init__(self, name: str, seed: int, user_x: Tensor, latent_dim: int, dropout: float, train: TrainConfig,
                 decoupled_decay: bool, shared_init: bool, normalize_features: bool, dp: DPConfig | None = None,
                 lr: float | None = None, offset: bool = False):
        super().__init__(name, seed)
        self.dp = dp  # with DP every latent is clipped and noised before it leaves its user (``release``)
        self.private = PrivateRelease(dp, seed) if dp is not None else None
        self.features = UserFeatures.from_dense(user_x, normalize_features)
        lr = train.lr if lr is None else lr
        # user_state offset: the shared start plus one vector per user (``OffsetWeights``); rows: every support row
        self.offset = OffsetWeights(self.features, latent_dim, train.optimizer, lr, train.weight_decay) \
            if offset else None
        if self.offset is None:
            self.weight, self.initial = init_support_weights(self.features, latent_dim, shared_init)
            self.optimizer = BatchedOptimizer(self.weight, self.features.row, self.features.num_users,
                                              train.optimizer, lr, train.weight_decay, decoupled_decay)
        self.dropout = dropout
        self.pending: tuple[Tensor | None, Tensor | None, Tensor | None] | None = None
        self.scratch = scratch()

    def _selection(self, users: Tensor | None) -> tuple[Tensor | None, Tensor, int]:
        idx = self.features.entries(users)
        rows = self.features.num_users if users is None else users.numel()
        return idx, self.features.positions(users, idx), rows

    @rpc(users="index", returns=Rows("embedding"))
    def embed(self, users: Tensor | None = None) -> Tensor:
        """Each listed user drops out its own features, projects them and keeps the mask for ``update``."""
        if self.offset is not None:  # no user dropout in this form (NFedGNNOptions), no support rows to pick
            self.pending = (users, None, None)
            return self.release(self.offset.latents(users))
        idx, pos, rows = self._selection(users)
        scale = None
        if self.dropout > 0:
            keep = torch.rand(pos.numel()) >= self.dropout
            scale = keep.float() / (1 - self.dropout)
        self.pending = (users, idx, scale)
        return self.release(project(self.features, self.weight, idx, pos, scale, rows))

    @rpc(grad=Rows("gradient"), users="index")
    def update(self, grad: Tensor, users: Tensor | None = None) -> None:
        """Back-propagate the server's gradient of each latent into that user's weight and step."""
        if self.pending is None or not _same_users(self.pending[0], users):
            raise RuntimeError("update must follow embed for the same users")
        _, idx, scale = self.pending
        self.pending = None
        if self.offset is not None:
            self.offset.step(grad.clone(), users)
            return
        pos = self.features.positions(users, idx)
        rows = self.scratch(pos.numel(), grad.size(1), grad.dtype)
        self.optimizer.step(self.weight, support_gradient(self.features, grad, idx, pos, scale, rows), idx, users)

    @rpc(returns=Rows("embedding"))
    def infer(self) -> Tensor:
        """Every user's latent without dropout, for scoring (noised too under DP: it reaches the server)."""
        if self.offset is not None:
            return self.release(self.offset.latents(None))
        return self.release(project(self.features, self.weight, None, self.features.row, None,
                                    self.features.num_users))

    def release(self, latents: Tensor) -> Tensor:
        """What leaves the users: with DP, each user's latent clipped to ``max_norm`` plus Gaussian
        noise (the server's gradient then flows back through the projection as if clipping and noise
        were the identity)."""
        if self.dp is None:
            return latents
        return self.private(latents.detach())

    def state_nbytes(self) -> int:
        """Memory held for the users' weights, optimiser state and features."""
        f = self.features
        held = [f.row, f.col, f.val]
        weights = self.offset.nbytes() if self.offset is not None else (
            self.weight.element_size() * self.weight.numel() + self.optimizer.nbytes())
        return sum(t.element_size() * t.numel() for t in held) + weights


def label_reach(graph: ServerGraph, train_idx: Tensor, hops: int) -> float:
    """Share of users whose latent the cross-entropy reaches: those within ``hops`` aggregations of a
    training label. The others learn from the penalty alone (docs/nfedgnn.md, "Sparse labels")."""
    reach = torch.zeros(graph.num_nodes, dtype=torch.bool)
    reach[train_idx] = True
    for _ in range(hops):  # out[dst] sums h[src]: a labelled dst sends gradient back to its sources
        reach = reach.index_fill(0, graph.src[reach[graph.dst]], True)
    return reach.float().mean().item()


def cosine_lr(base: float, round_index: int, rounds: int) -> float:
    """``base`` at round 1, half of it midway, near 0 at the last round: late rounds refine instead of swinging."""
    return base * 0.5 * (1 + math.cos(math.pi * (round_index - 1) / rounds))


def _same_users(a: Tensor | None, b: Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool((a == b).all())


class NFedGNN(Protocol):
    name = "nfedgnn"
    scenario = "node-level"
    Options = NFedGNNOptions
    Users: type[UserPopulation] = UserPopulation
    on_device = ("train_idx", "y_train", "graph", "latents")

    @classmethod
    def paper_training(cls, model: str, optimizer: str) -> dict[str, Any]:
        # §5: Adam, GCN at 0.1; GAT at 0.01, the shared default
        return {"lr": 0.1} if str(model).lower() == "gcn" and optimizer == "adam" else {}

    @classmethod
    def search_space(cls, options: NFedGNNOptions) -> dict[str, tuple[Any, ...]]:
        """lam: auto is a choice on validation among whole runs (fedgl.search), one per lam_grid value."""
        return {"protocol.lam": options.lam_grid} if options.lam == "auto" else {}

    @classmethod
    def paper_sections(cls, options: NFedGNNOptions) -> dict[str, dict[str, Any]]:
        """per_label's users send a ``LATENT``-value latent unless ``model.hidden`` is set: their start ``x_i W0`` is
        all the server learns of a user no label reaches, and 64 values of it carry too little (CiteSeer)."""
        return {"model": {"hidden": LATENT}} if options.regulariser == "per_label" else {}

    # ---- setup --------------------------------------------------------------------------------------
    def build(self, num_features: int, num_classes: int) -> None:
        m = self.cfg.model
        self.shape: SplitShape = split_shape(m.name, m.hidden, num_classes, m.layers, m.dropout, m.options)
        self.server = build_server_model(self.shape).to(self.device)  # the layers over the whole graph
        self.server_optimizer = make_optimizer(self.server.parameters(), self.cfg.train)

    def setup(self, data: Data) -> None:
        part = partition_node_level(data)
        self.partition_stats = part.stats
        self.build(int(part.user_x.shape[1]), part.num_classes)
        self.num_users, self.num_features = part.user_x.shape
        self.train_idx = part.train_mask.nonzero().squeeze(1)
        self.y_train = part.y_train[self.train_idx]
        self.graph = prepare_server_graph(part.edge_index, part.num_nodes)
        self.latents = torch.zeros(part.num_nodes, self.shape.latent_dim)  # the latest latent of each user
        self.label_reach = label_reach(self.graph, self.train_idx, self.shape.num_layers)
        self.last_stats: dict[str, float] = {}
        self.users = self.transport.spawn(self.Users, [dict(
            name="users", seed=self.cfg.seed * 100_003 + 1, user_x=part.user_x, latent_dim=self.shape.latent_dim,
            dropout=self.opts.user_dropout, train=self.cfg.train, normalize_features=self.opts.normalize_features,
            decoupled_decay=self.opts.user_weight_decay == "decoupled", dp=self.cfg.privacy.dp,
            **self.user_options())])[0]
        dp = self.cfg.privacy.dp  # one release per user and round it takes part in, and per scoring
        self.accountant = DPAccountant(dp, torch.arange(self.num_users), USER_ROWS) if dp is not None else None
        self.place()

    def user_options(self) -> dict[str, Any]:
        return {"shared_init": self.opts.user_init == "shared", "lr": self.opts.user_lr,
                "offset": self.opts.user_state == "offset"}

    @property
    def lam(self) -> float:
        """The weight on Eq. 6's penalty. per_label multiplies ``lam`` by users / labels: the cross-entropy
        reaches a labelled user's latent with weight 1 / labels, the penalty reaches user i with weight
        degree_i / edges; with the factor their ratio is degree_i / mean degree on every graph, whatever its
        size, mean degree and share of labelled users."""
        if self.opts.lam == "auto":
            raise ConfigError("protocol.lam: auto is chosen by the run's search (fedgl.search); one run needs a number")
        if self.opts.regulariser == "raw":
            return self.opts.lam
        return self.opts.lam * self.num_users / self.train_idx.numel()

    @property
    def reg_per_head(self) -> bool:
        return self.opts.reg_heads == "per_head"

    def sample_users(self) -> Tensor | None:
        """The round's participants (None: everyone, and no index list is sent)."""
        k = max(1, round(self.opts.user_fraction * self.num_users))
        if k == self.num_users:
            return None
        return torch.randperm(self.num_users, generator=self.generator)[:k].sort().values

    # ---- one round ----------------------------------------------------------------------------------
    def train_round(self, round_index: int) -> dict[str, float]:
        users = self.sample_users()
        if self.opts.lr_schedule == "cosine":
            for group in self.server_optimizer.param_groups:
                group["lr"] = cosine_lr(self.cfg.train.lr, round_index, self.cfg.train.rounds)
        if self.accountant is not None:  # each participant releases one noised latent
            self.accountant.charge(nodes=torch.arange(self.num_users) if users is None else users)
        latents = self.transport.call(self.users, "embed", users=users)
        stats, grad = self.server_step(latents, users)
        self.transport.call(self.users, "update", grad=grad, users=users)
        return stats | ({"epsilon": self.accountant.epsilon()} if self.accountant is not None else {})

    def server_step(self, latents: Tensor, users: Tensor | None) -> tuple[dict[str, float], Tensor]:
        """Store the received latents, take one optimiser step on the server model (on its device) and
        return the gradient of the loss with respect to each participant's latent."""
        with devices.working_on(self.device):
            return self._server_step(latents.to(self.device), users)

    def _server_step(self, latents: Tensor, users: Tensor | None) -> tuple[dict[str, float], Tensor]:
        if users is None:
            self.latents = latents
        else:
            self.latents[users] = latents
        z = self.latents.clone().requires_grad_()
        self.server.train()
        logits = self.server(z, self.graph)
        ce = F.cross_entropy(logits[self.train_idx], self.y_train)
        reg = laplacian_penalty(z, self.graph, self.shape.heads, self.reg_per_head)
        loss = ce + self.lam * reg if self.lam else ce
        self.server_optimizer.zero_grad()
        loss.backward()
        self.server_optimizer.step()
        grad = z.grad if users is None else z.grad[users]
        self.last_stats = {"train_loss": loss.item(), "train_ce": ce.item(), "train_reg": reg.item()}
        return dict(self.last_stats), grad

    def summary(self) -> dict[str, Any]:
        """The last round's training loss, so bench tables can show whether a protocol fits its labels;
        with DP, epsilon at delta over every release (training and scoring)."""
        dp = self.accountant.summary() if self.accountant else {}
        return {f"final_{key}": value for key, value in self.last_stats.items()} | dp | {
            "label_reach": self.label_reach}

    @torch.no_grad()
    def predict(self, evaluator: Evaluator) -> Tensor:
        if self.accountant is not None:  # scoring needs every user's latent: one more release each
            self.accountant.charge(nodes=torch.arange(self.num_users))
        latents = self.transport.call(self.users, "infer").to(self.device)
        self.server.eval()
        with devices.working_on(self.device):
            return self.server(latents, self.graph).cpu()

    # ---- checkpoints --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return super().state_dict() | {
            "server": self.server.state_dict(),
            "optimizer": self.server_optimizer.state_dict(),
            "latents": self.latents,
            "last_stats": self.last_stats,
        } | ({"dp": self.accountant.state()} if self.accountant is not None else {})

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.server.load_state_dict(state["server"])
        self.server_optimizer.load_state_dict(state["optimizer"])
        self.latents = state["latents"].to(self.device)  # checkpoints are read onto the CPU
        self.last_stats = state["last_stats"]
        if self.accountant is not None:
            self.accountant.load_state(state["dp"])
