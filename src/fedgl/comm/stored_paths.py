"""Where classes that checkpoints and shard folders name by an older ``module:qualname`` live now.

Files hold their parties' and objects' classes as strings (``party_state``, a shard folder's
manifest), so a class that moves keeps an entry here: files written before the move still load.
Only paths some fedgl version has written belong here.
"""

from __future__ import annotations

MOVED = {
    # protocols/ as one folder per protocol family
    "fedgl.protocols.cross_client:CrossClient": "fedgl.protocols.horizontal.client:CrossClient",
    "fedgl.protocols.cross_client:Plan": "fedgl.protocols.horizontal.plan:OwnerPlan",
    "fedgl.protocols.llcg:LLCGClient": "fedgl.protocols.horizontal.llcg:LLCGClient",
    "fedgl.protocols.routing:Router": "fedgl.protocols.horizontal.routing:Router",
    "fedgl.protocols.fedaas:FedAASClient": "fedgl.protocols.fedaas.client:FedAASClient",
    "fedgl.protocols.fanout_policy:FanoutPolicy": "fedgl.protocols.fedaas.fanout_policy:FanoutPolicy",
    "fedgl.protocols.similarity:SimilarityAverager": "fedgl.protocols.fedaas.similarity:SimilarityAverager",
    "fedgl.protocols.fedavg:FedAvgClient": "fedgl.protocols.fedavg.client:FedAvgClient",
    "fedgl.protocols.fedavg:FedAvgGroup": "fedgl.protocols.fedavg.client:FedAvgGroup",
    **{f"fedgl.protocols.fedavg_group:{name}": f"fedgl.protocols.fedavg.group:{name}"
       for name in ("ClientGroupTrainer", "_Batch", "_Member", "_MemberOptimizer", "_Param")},
    "fedgl.protocols.glasu:GlasuClient": "fedgl.protocols.glasu.client:GlasuClient",
    "fedgl.protocols.nfedgnn:UserPopulation": "fedgl.protocols.node_level.nfedgnn:UserPopulation",
    "fedgl.protocols.cnfgnn:ModelSharingUsers": "fedgl.protocols.node_level.cnfgnn:ModelSharingUsers",
    # split_vertical's Rows, Block and Plan, named apart from comm.rpc.Rows, sampling.Block and OwnerPlan
    "fedgl.models.split_vertical:Rows": "fedgl.models.split_vertical:FeatureRows",
    "fedgl.models.split_vertical:Block": "fedgl.models.split_vertical:SublayerGraph",
    "fedgl.models.split_vertical:Plan": "fedgl.models.split_vertical:BatchPlan",
}


def current_path(path: str) -> str:
    """The path a stored class path names today."""
    return MOVED.get(path, path)
