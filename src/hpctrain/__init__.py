"""hpctrain: train PyTorch models on shared clusters, the same job everywhere."""

import logging

__version__ = "0.1.0"

# What hpctrain says goes through logging (hpctrain.channel); a library user sees it only if they configure logging.
logging.getLogger("hpctrain").addHandler(logging.NullHandler())
