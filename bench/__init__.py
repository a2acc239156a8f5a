"""Benchmarks of the launcher against torchrun and msrun: ``python -m bench`` (see README.md)."""
