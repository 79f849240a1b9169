"""GLASU: vertical federated GNN training with lazy aggregation and stale updates.

Clients share the node set; client m holds only its feature block X_m, its own edges E_m and (by
default) the labels. Every GNN layer is a client sub-layer plus a parameter-free server aggregation
(mean or concatenation), performed only at K of the L layers (lazy aggregation). One GLASU round:
the server draws a mini-batch of S training nodes; clients sample their neighbourhoods level by level
while the server takes unions of the index sets at aggregation levels (Algorithm 2); one joint
inference sends H_m^+ up and the aggregate H down at each aggregation level (Algorithm 3); then every
client takes Q local steps that reuse the stored "all but m" representation H_{-m} in place of the
server (Algorithm 4). With one label holder, the holder's gradient with respect to H[L] is broadcast
through the server (Appendix B.2, Algorithms 5-7). The server holds no parameters.

``backward: exact`` replaces the local updates by split learning as in the paper's reference [9]: the
server back-propagates the loss through every aggregation it performed and sends each client the
gradient of its H_m^+, level by level down to the first aggregation, so every update is the exact
gradient of the joint model.

The paper's baselines are configurations of this class (see docs/glasu.md): centralized (one client,
all edges: a single party, so no message at all), standalone (K = 0: clients never communicate),
simulated centralized (every client keeps every edge, K = L, exact backward) and the special cases of
Section 3.5 (K = 1, K = L, ``graph: false``).

With ``privacy.secure_aggregation`` (mean aggregation, local backward) every mean aggregation is a
dropout-tolerant secure sum of the clients' fixed-point H_m^+ (``fedgl.protocols.aggregation``), so the
server learns only the mean it forwards; each sum's label is the server's count of aggregations, and a
client lost in a sum leaves the mean of those that stayed for the rest of the run. With ``privacy.dp`` each
node's row of every H_m^+ a client sends (training and joint inference) is clipped to ``max_norm`` and
noised before it leaves (before masking, ``PrivateRelease``), and the server charges every release of n
rows to every node (``DPAccountant``: the rows come from a locally trained model, docs/privacy.md).
"""
