"""A learned fan-out per training step, for the reconstructed FedGraph baseline.

FedGraph (FedAAS paper's baseline [1]) samples "by automatically adjusting sampling policies based on
deep reinforcement learning"; each client "needs to train two DRL networks" and the reward "only
consists of learning speed and accuracy". fedaas.txt gives nothing more, so fedgl reconstructs it as a
one-step advantage actor-critic per client: before each step the actor picks the fan-out from a few
choices given (progress in the round, last batch loss, last batch accuracy, last fan-out); the reward
is the change in batch accuracy minus ``cost`` times the fan-out's share of the largest choice (the
step's compute grows with it; a count, not a clock, so runs stay deterministic). The networks stay
on the client: they are never sent nor averaged.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

HIDDEN = 16
LR = 0.01


class FanoutPolicy:
    def __init__(self, choices: list[int], cost: float, generator: torch.Generator):
        self.choices = torch.tensor(choices)
        self.cost = cost
        self.generator = generator
        self.actor = nn.Sequential(nn.Linear(4, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, len(choices)))
        self.critic = nn.Sequential(nn.Linear(4, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))
        self.optimizer = torch.optim.Adam([*self.actor.parameters(), *self.critic.parameters()], lr=LR)
        self.loss, self.accuracy, self.share = 0.0, 0.0, 1.0
        self.observed: Tensor | None = None
        self.action = 0

    def probabilities(self, observed: Tensor) -> Tensor:
        return torch.softmax(self.actor(observed), -1)

    def choose(self, progress: float) -> int:
        """Draw this step's fan-out."""
        self.observed = torch.tensor([progress, self.loss, self.accuracy, self.share])
        with torch.no_grad():
            probs = self.probabilities(self.observed)
        self.action = int(torch.multinomial(probs, 1, generator=self.generator))
        return int(self.choices[self.action])

    def learn(self, loss: float, accuracy: float) -> float:
        """One actor-critic update from the step just taken; returns its reward."""
        share = float(self.choices[self.action]) / float(self.choices.max())
        reward = (accuracy - self.accuracy) - self.cost * share
        advantage = reward - self.critic(self.observed).squeeze()
        log_prob = torch.log(self.probabilities(self.observed)[self.action])
        self.optimizer.zero_grad()
        (-log_prob * advantage.detach() + advantage.pow(2)).backward()
        self.optimizer.step()
        self.loss, self.accuracy, self.share = loss, accuracy, share
        return reward
