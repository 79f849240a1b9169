"""FedAvg's client parties: one client (``FedAvgClient``) or several trained as one batched
computation (``FedAvgGroup``), and what either sends after training (``private_reply``)."""

from __future__ import annotations

from typing import Any

import torch

from ...comm import Party, Rows, rpc
from ...config import ModelConfig, TrainConfig
from ...models import make_model
from ...privacy import PrivacyConfig
from ...privacy.dp import PrivateRelease, release_rows
from ...privacy.bonawitz import SecAggClient
from ...privacy.secure_aggregation import encode
from ..aggregation import SecureSumParty
from ..local_training import LocalTrainer
from .group import ClientGroupTrainer, flat_state, state_from_row


def private_reply(rows: torch.Tensor, start: torch.Tensor, num_train: torch.Tensor, loss: torch.Tensor,
                  privacy: PrivacyConfig, releases: list[PrivateRelease | None],
                  summands: int) -> dict[str, torch.Tensor]:
    """What k clients release after training from ``start`` to ``rows`` (``flat_state`` rows): with DP
    the noised, clipped updates applied to ``start``; with secure aggregation the fixed-point rows
    ``[w * model, w, w * loss]`` (w = training nodes) for a secure sum of ``summands`` clients."""
    if privacy.dp is not None:
        rows = start + release_rows(releases, rows - start)
    if not privacy.secure_aggregation:
        return {"state": rows, "num_train": num_train, "loss": loss}
    values = torch.cat([rows.double(), torch.ones_like(loss).unsqueeze(1), loss.unsqueeze(1)], 1)
    return {"encoded": encode(values, num_train, summands)}


class FedAvgClient(SecureSumParty, Party):
    def __init__(self, name: str, seed: int, shard: Any, model: ModelConfig, train: TrainConfig | None,
                 num_features: int, num_classes: int, local_epochs: int, batch_size: int | None,
                 index: int = 0, privacy: PrivacyConfig | None = None):
        super().__init__(name, seed)
        net = make_model(model, num_features, num_classes)
        self.trainer = LocalTrainer(net, model.name, shard.x, shard.edge_index, shard.y, shard.train_mask, train)
        self.num_train = int(shard.train_mask.sum())
        self.local_epochs = local_epochs
        self.batch_size = batch_size
        self.privacy = privacy or PrivacyConfig()
        self.secagg = SecAggClient.create(index) if self.privacy.secure_aggregation else None
        self.release = PrivateRelease(self.privacy.dp, seed) if self.privacy.dp is not None else None

    @rpc(state="model", summands="control", returns={"state": "model", "num_train": "control", "loss": "control"})
    def train(self, state: dict[str, torch.Tensor], summands: int = 0) -> dict[str, Any]:
        """Local training from ``state``; the model is returned, or under secure aggregation kept
        encoded for the secure sum of ``summands`` clients that follows."""
        self.trainer.set_state(state)
        loss = self.trainer.train_epochs(self.local_epochs, self.batch_size) if self.num_train else 0.0
        trained = self.trainer.get_state()
        if not self.privacy.requested():
            return {"state": trained, "num_train": self.num_train, "loss": loss}
        reply = private_reply(flat_state(trained).unsqueeze(0), flat_state(state).unsqueeze(0),
                              torch.tensor([self.num_train]), torch.tensor([loss], dtype=torch.float64),
                              self.privacy, [self.release], summands)
        if "encoded" in reply:
            self.secure_value = reply["encoded"][0]
            return {}
        return {"state": state_from_row(reply["state"][0], trained), "num_train": self.num_train, "loss": loss}


class FedAvgGroup(Party):
    """Several FedAvg clients in one party, trained as one batched computation.

    Each member is first built as the ``FedAvgClient`` it stands for (its own seed, model
    initialisation, prepared graph and the RNG state it would train with); the group then keeps
    only what ``ClientGroupTrainer`` needs. The rows of every ``Rows`` payload are the members listed
    in ``users`` (all members when None), in that order.
    """

    def __init__(self, name: str, seed: int, members: list[dict[str, Any]], train: TrainConfig, local_epochs: int,
                 privacy: PrivacyConfig | None = None):
        super().__init__(name, seed)
        # Members are built without optimisers of their own: the group's optimiser trains them.
        device = torch.get_default_device()  # the group's, while it is made
        clients = [FedAvgClient.create(device, **(kwargs | {"train": None})) for kwargs in members]
        # The random state each client party would carry into its first call, on the group's device.
        states = [c._rng_state if c._device_rng_state is None else c._device_rng_state for c in clients]
        self.trainer = ClientGroupTrainer([c.trainer for c in clients], states, train)
        self.num_train = torch.tensor([c.num_train for c in clients])
        self.local_epochs = local_epochs
        self.privacy = privacy or PrivacyConfig()
        self.releases = [c.release for c in clients]  # each member's own noise stream

    @rpc(state=Rows("model"), users="index",
         returns={"state": Rows("model"), "num_train": Rows("control"), "loss": Rows("control")})
    def train(self, state: torch.Tensor, users: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """``state`` holds one ``flat_state`` row per listed member (``users``; None = all)."""
        self.trainer.set_rows(state, users)
        num_train = self.num_train if users is None else self.num_train[users]
        members = torch.arange(self.num_train.numel()) if users is None else users
        loss = torch.zeros(members.numel(), dtype=torch.float64)  # 8 bytes each, as a client's float
        training = num_train > 0
        if bool(training.any()):
            loss[training] = self.trainer.train_epochs(self.local_epochs, members[training]).double()
        return private_reply(self.trainer.get_rows(users), state, num_train, loss, self.privacy,
                             [self.releases[m] for m in members.tolist()], 0)
