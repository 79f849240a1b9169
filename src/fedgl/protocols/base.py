"""What every protocol is: server-side code that drives rounds through the transport.

A protocol partitions the dataset into private shards, spawns the client parties with them, and
from then on touches clients only through ``self.transport``. It never keeps the global dataset:
scoring is done by the ``Evaluator``, a harness outside every party that holds the ground truth.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar

import torch
from torch_geometric.data import Data

from .. import device as devices
from ..comm import Transport
from ..config import RunConfig
from ..evaluation import Evaluator
from ..options import Settings


class ProtocolOptions(Settings):
    """Settings of one protocol; subclasses add fields. Unknown keys are errors."""

    name: str


class Protocol:
    name: ClassVar[str]
    scenario: ClassVar[str]  # central | horizontal | vertical | node-level
    Options: ClassVar[type[ProtocolOptions]] = ProtocolOptions
    can_skip_parties: ClassVar[bool] = False  # whether training can go on without a lost client
    on_device: ClassVar[tuple[str, ...]] = ()  # server attributes its compute on ``device`` reads

    @classmethod
    def paper_training(cls, model: str, optimizer: str) -> dict[str, Any]:
        """``train`` settings of the protocol's paper that differ from the shared defaults, for backbone
        ``model`` and ``optimizer``; a config that leaves them unset gets these (``RunConfig``)."""
        return {}

    @classmethod
    def paper_sections(cls, options: ProtocolOptions) -> dict[str, dict[str, Any]]:
        """``model`` and ``partition`` settings the protocol needs at its defaults, by section, for a config
        that leaves them unset (``RunConfig``): only where the shared default would be refused or would not
        learn (nFedGNN's per-label form: a wider latent)."""
        return {}

    @classmethod
    def search_space(cls, options: ProtocolOptions) -> dict[str, tuple[Any, ...]]:
        """Config keys the run chooses on validation, with their candidates, one whole run each
        (``fedgl.search``); empty: one run."""
        return {}

    def __init__(self, cfg: RunConfig, transport: Transport):
        self.cfg = cfg
        self.opts: Any = cfg.options()
        self.transport = transport
        self.generator = torch.Generator().manual_seed(cfg.seed)  # the server's own randomness

    @cached_property
    def device(self) -> torch.device:
        """Where the server's own heavy compute runs (``cfg.device``), for protocols whose server trains a
        model; routing and averaging stay on the CPU. Resolved on first use, so a driver whose server
        does not train needs no GPU (``fedgl partition`` sets up on the CPU whatever the config says)."""
        return devices.resolve(self.cfg.device)

    def place(self) -> None:
        """Move the ``on_device`` attributes to the device, once set up (or, deployed, loaded)."""
        for key in self.on_device:
            setattr(self, key, devices.move(getattr(self, key), self.device))

    def build(self, num_features: int, num_classes: int) -> None:
        """Make the server's own modules and optimisers from public facts about the data. ``setup``
        calls it first; a deployed server (``backend.shards``) calls it instead, then loads its state."""

    def setup(self, data: Data) -> None:
        """Partition ``data`` and hand each party its shard; keep only what the server may know."""
        raise NotImplementedError

    def start(self) -> None:
        """Talk to the parties once before the first round (e.g. agree keys); runs after ``setup``
        or, deployed, once every party has loaded its own shard."""

    def train_round(self, round_index: int) -> dict[str, float]:
        """One communication round; returns at least ``train_loss``."""
        raise NotImplementedError

    def predict(self, evaluator: Evaluator) -> torch.Tensor:
        """Logits for every node of the graph, for scoring (runs inside ``transport.evaluation()``)."""
        raise NotImplementedError

    def drop_parties(self, names: list[str]) -> None:
        """Continue without the lost parties ``names`` (``backend.on_client_failure: skip``)."""
        raise NotImplementedError

    def summary(self) -> dict[str, Any]:
        """Protocol-specific fields for ``summary.json`` (e.g. bytes of one message family), read from
        the ledger and the server's own state after the last round."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Server-side state for checkpoints (client state is saved by the transport): tensors and plain
        data only, as checkpoints are read with ``torch.load(weights_only=True)``."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
