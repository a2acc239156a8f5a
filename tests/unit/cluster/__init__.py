"""Unit tests of cluster integrations and multi-node coordination (launcher.cluster)."""
