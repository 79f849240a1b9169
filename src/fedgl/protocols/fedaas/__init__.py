"""FedAAS (fedaas.txt, Algorithm 1): FedAvg with attention-guided cross-client neighbour sampling and
adaptive embedding synchronisation, plus its baselines as presets of the same code.

Each round the server sends θ_t to m clients; each takes ``local_epochs × batches`` Adam steps from a
fresh optimiser on mini-batches of its training nodes, then the server averages the models
(weighted by training nodes). Steps run in lock-step across clients. At a *sync* step (step j with
j mod τ = 0) a client samples its batch's neighbourhood with probabilities from Eq. 9-10 (scores
from its current embeddings for its own nodes, from stored keys for remote ones), the owners of the
remote picks return one projected partial per (target, owner) pair (Eq. 11, projected by the owner's
own current model), the server merges the pairs per target, and the client stores the result in its
history. At other steps no message crosses: the client reuses the stored remote partials
(``between_sync: history``, §4.1) or uses none (``drop``, the authors' code). Layer 1 is always
local, so raw features never leave their owner. The server moves τ between τ_min and τ_0 from a
loss (§5.3: the paper's ceil rule or the code's monotone rule).

A sync step is three phases (L = 2): ``request`` (picks and one query scalar per target, kinds
``index``/``embedding``), ``serve`` (the owners' partials and one key scalar per pick), ``finish``
(the merged partials to the trainer, which completes its step). Remote partials are constants in
the trainer's backward pass (ARCHITECTURE.md, "Gradients through remote embeddings are stopped").
The GraphFed and FedGraph reconstructions are presets whose own pieces live in ``similarity.py`` and
``fanout_policy.py``.

Optional rules: ``phi`` (the paper's ratio rule in place of fan-outs; the server, the one party that
knows every node's owner, draws each owner's share of a target's remote candidates), ``tau0: grid``
(τ_0 from one trial round per candidate on restored copies of every party and the server) and, with
``privacy.secure_aggregation``, uploads summed by ``protocols/aggregation.py``'s ``secure_sum``, of
which the server decodes only the sum (encoded by FedAvg's ``private_reply``). With ``privacy.dp`` a
client's upload is its update clipped and noised (FedAvg's ``private_reply`` again), every row an
owner puts into a pair partial and every key and query crossing at a sync is clipped and noised
(``FedAASClient.private_partials``, from its ``PrivateRelease``), and the server charges the uploads
and every partial, key and query to the nodes of the client that computed it (``DPAccountant``;
docs/privacy.md, FedAAS).
"""
