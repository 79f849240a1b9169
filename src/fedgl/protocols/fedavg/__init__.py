"""FedAvg over horizontal subgraphs, ignoring cross-client edges (the "local only" baseline).

Each round the server samples a fraction of the clients, sends them the global model, each trains
``local_epochs`` on its own subgraph (cross-client edges are invisible to it) and returns its model;
the server averages them weighted by training-node count: FedLocal-style local-only training (the
Swift paper's FedSage is ``swift`` with ``K: 0``, which keeps Swift's batches and gradient averaging).

Clients are parties of their own (``FedAvgClient``) or members of a ``FedAvgGroup``, a party that
trains several GCN/GraphSAGE clients as one batched computation (``group.py``) with the
same trajectories and the same model bytes: each member's model travels as its own row of a
``Rows("model")`` payload and the ledger attributes it to that member.

Privacy (``RunConfig.privacy``, ``fedgl.privacy``): with ``dp`` each client clips its update (its model
minus the global model it received) and adds Gaussian noise from its own stream (``PrivateRelease``)
before anything leaves it; the server charges every round a client takes part in to its
``DPAccountant``. With ``secure_aggregation`` (one party per client) a client keeps
``[w * model, w, w * loss]`` (w its training-node count) in fixed point and the server sums them with
``protocols/aggregation.py``'s ``secure_sum`` (Bonawitz et al., with the configured threshold), so it
learns the weighted sums of the clients that stay to the end of the round and nothing per client.
"""
