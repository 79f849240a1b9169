"""Horizontal FL across clients' neighbours: the Swift-FedGNN family (the cross-client client and
server, Swift-FedGNN, FedGNN-PNS, LLCG) and the pieces FedAAS shares with it (``shared``, ``routing``)."""
