"""Resilient launcher for distributed training on Ascend clusters and local machines."""

__version__ = "0.1.0"
