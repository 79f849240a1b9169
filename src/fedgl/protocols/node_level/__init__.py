"""Node-level FL, one user per node: nFedGNN (the user population and its server) and its CNFGNN
baseline, built on nFedGNN's classes."""
