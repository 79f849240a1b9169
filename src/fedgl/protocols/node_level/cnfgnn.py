"""CNFGNN as adapted by the nFedGNN paper (Section 4.1): the split model of nFedGNN, plus model sharing.

Each round runs nFedGNN's exchange (latents up, their gradients down, a local step on every user,
no regulariser), then every user uploads its whole first-layer weight ``W_i`` (``F x D`` floats),
the server averages them and broadcasts the average, which every user adopts. The paper's
Table 1 counts these uploads: this is why CNFGNN costs three to four orders of magnitude more
than nFedGNN. Only full participation is defined (the paper's setting).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from ...comm import Rows, rpc
from ...comm.payload import outbox
from ...models.split_node import BatchedOptimizer, pick
from .nfedgnn import NFedGNN, SplitOptions, UserPopulation

MB = 2**20


class CNFGNNOptions(SplitOptions):
    lam: float = Field(0.0, ge=0, le=0, description="CNFGNN has no regulariser; accepted (as 0 only) so an nFedGNN "
                                                    "config runs as CNFGNN with protocol.lam=0")
    regulariser: Literal["per_label", "raw"] = Field("raw", description="accepted for the same reason; no effect")
    message_mb: float = Field(
        1024.0, gt=0, description="largest single message of per-user models, in MiB; the model upload and "
                                "broadcast of a large population are sent in several calls of at most this size")


class ModelSharingUsers(UserPopulation):
    """Users that also upload their whole weight and adopt the server's average.

    After a broadcast every user holds the same ``W``. The rows of ``W_i`` for features absent from
    ``x_i`` get no data gradient, only the weight decay, the same for every such user, so these rows
    and their optimiser state are identical across users and kept once (``common``); each user's own
    rows for its non-zero features live in the batched support tensor as in nFedGNN. (With decoupled
    decay the absent rows only shrink; with coupled decay Adam turns the decay into full steps.)
    """

    def __init__(self, name: str, seed: int, **kwargs: Any):
        super().__init__(name, seed, **kwargs)
        self.common = self.initial
        self.reference = self.initial.clone()  # the last weight every user adopted (DP: updates are from it)
        self.common_optimizer = BatchedOptimizer(
            self.common, torch.zeros(self.common.size(0), dtype=torch.long), 1, kwargs["train"].optimizer,
            kwargs["train"].lr, kwargs["train"].weight_decay, kwargs["decoupled_decay"])
        # Uploads are written into storage kept from message to message (1 GiB made afresh is faulted in
        # from the operating system every time: 1.35 s against 0.28 s per message on Coauthor CS) and
        # handed over, so the in-process transport does not copy them again.
        self.uploads = outbox()

    @rpc(grad=Rows("gradient"), users="index")
    def update(self, grad: Tensor, users: Tensor | None = None) -> None:
        super().update(grad, users)
        self.common_optimizer.step(self.common, torch.zeros_like(self.common), None, None)

    @rpc(users="index", returns=Rows("model"), handover=True)
    def upload(self, users: Tensor | None = None) -> Tensor:
        """Each listed user's full ``[F, D]`` weight; with DP, the last adopted weight plus the user's
        update from it, clipped to ``max_norm`` (L2 over the whole matrix) and noised. Every element is
        written here, and the storage is never read again (``outbox``)."""
        idx, pos, rows = self._selection(users)
        out = self.uploads(rows * self.common.numel(), self.common.dtype).view(rows, *self.common.shape)
        out.copy_(self.common.expand(rows, *self.common.shape))
        out[pos, pick(self.features.col, idx)] = pick(self.weight, idx)
        if self.dp is None:
            return out
        update = (out - self.reference).flatten(1)
        return self.reference + self.private(update).view_as(out)

    @rpc(model=Rows("model"), users="index")
    def receive(self, model: Tensor, users: Tensor | None = None) -> None:
        """Each listed user replaces its weight by its row of the broadcast (all rows are the average)."""
        idx, pos, _ = self._selection(users)
        rows = model[pos, pick(self.features.col, idx)]
        if idx is None:
            self.weight.copy_(rows)
        else:
            self.weight.index_copy_(0, idx, rows)
        self.common.copy_(model[0])
        self.reference = model[0].clone()

    def state_nbytes(self) -> int:
        return (super().state_nbytes() + self.common.element_size() * self.common.numel()
                + self.common_optimizer.nbytes())


class CNFGNN(NFedGNN):
    name = "cnfgnn"
    Options = CNFGNNOptions
    Users = ModelSharingUsers
    reg_per_head = True  # the penalty is reported (train_reg), never weighted

    def user_options(self) -> dict[str, Any]:
        return {"shared_init": True}

    def sample_users(self) -> Tensor | None:
        return None

    def model_chunks(self) -> list[Tensor | None]:
        """User ids per model message, so no single message exceeds ``message_mb``."""
        per_user = 4 * self.shape.latent_dim * self.num_features
        size = max(1, int(self.opts.message_mb * MB // per_user))
        if size >= self.num_users:
            return [None]
        return list(torch.arange(self.num_users).split(size))

    def train_round(self, round_index: int) -> dict[str, float]:
        if self.accountant is not None:  # every user releases a noised latent and a noised weight update
            self.accountant.charge(nodes=torch.arange(self.num_users).repeat(2))
        latents = self.transport.call(self.users, "embed")
        stats, grad = self.server_step(latents, None)
        self.transport.call(self.users, "update", grad=grad)
        chunks = self.model_chunks()
        with self.transport.parallel():
            total = sum(self.transport.call(self.users, "upload", users=c).sum(0) for c in chunks)
        average = total / self.num_users
        with self.transport.parallel():
            for c in chunks:
                rows = self.num_users if c is None else c.numel()
                self.transport.call(self.users, "receive", model=average.expand(rows, *average.shape), users=c)
        return stats | ({"epsilon": self.accountant.epsilon()} if self.accountant is not None else {})
