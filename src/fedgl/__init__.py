"""fedgl: federated graph learning with isolated parties and measured communication."""

__version__ = "0.1.0"
