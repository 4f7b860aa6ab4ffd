"""hpctrain: train PyTorch models on shared clusters, the same job everywhere."""

__version__ = "0.1.0"
